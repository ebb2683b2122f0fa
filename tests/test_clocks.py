"""One clock per record (issue: "never twice, proven", defect 4).

Every comparison of a record's times is made on the clock that wrote them:
the database's for PostgreSQL, the gateway host's for SQLite. These tests
give gateway processes a wall clock that disagrees with the store's
(libfaketime, black-box: the gateway cannot tell) and check that a replay, a
lookup and a probe decide exactly as a replica with a true clock would.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import GatewayProcess, post_keyed, skewed_clock, spawn
from upstream import CountingUpstream

Start = Callable[..., GatewayProcess]


@pytest.fixture
def start_replica(
    postgres_url: str, processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> Start:
    """Start a replica on the test's PostgreSQL schema, its wall clock `skew` seconds off."""

    def start(name: str, *, skew: float = 0.0, **options: Any) -> GatewayProcess:
        return spawn(
            processes,
            tmp_path,
            upstream.url,
            name=name,
            store_url=postgres_url,
            env=skewed_clock(skew) if skew else None,
            **options,
        )

    return start


async def lookup(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str
) -> dict[str, Any]:
    async with session.get(f"{gateway.url}/operations/{key}") as response:
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
        return document


SWEPT_RECEIPTS = 'idempotency_gateway_swept_total{kind="receipt_expired"}'
"""The metric a sweep pass counts the receipt bodies it dropped in (after the store's write)."""


async def swept_receipts(session: aiohttp.ClientSession, gateway: GatewayProcess) -> float:
    """How many receipt bodies this gateway's sweeper has dropped, by its /metrics."""
    async with session.get(f"{gateway.url}/metrics") as response:
        assert response.status == 200, await response.text()
        text = await response.text()
    lines = text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith(SWEPT_RECEIPTS))


async def wait_until_swept(
    session: aiohttp.ClientSession, gateway: GatewayProcess, *, seconds: float = 60.0
) -> None:
    """Wait until the gateway's sweeper has dropped a receipt body (the test's only one):
    the sweep itself is the event, not a margin past the retention. (The lookup's
    `body_retained` is not: it turns false when the retention ends, before any sweep.)"""
    async with asyncio.timeout(seconds):
        while True:
            if await swept_receipts(session, gateway) >= 1:
                return
            await asyncio.sleep(0.05)


def assert_receipt_expired(status: int, headers: dict[str, str], body: bytes) -> None:
    assert status == 409, (status, body)
    assert "Idempotent-Replayed" not in headers
    assert json.loads(body)["type"].endswith("/receipt-expired"), body


@pytest.mark.postgres
async def test_a_replica_behind_the_database_never_replays_a_swept_body(
    start_replica: Start, upstream: CountingUpstream
) -> None:
    """A replica 30 s behind the database clock answers receipt-expired once the body is
    swept, and its lookup shows no response and safe_to_retry false; never an empty 201."""
    fast = {"retention": "2s", "sweep_interval": "200ms"}
    a = start_replica("a", idempotency=fast)
    b = start_replica("b", skew=-30.0, idempotency=fast)
    async with aiohttp.ClientSession() as session:
        status, _, _ = await post_keyed(session, a, "receipt-1")
        assert status == 201
        await asyncio.sleep(3.0)  # past retention on the database clock; A's sweeper ran

        assert_receipt_expired(*await post_keyed(session, b, "receipt-1"))
        operation = await lookup(session, b, "receipt-1")
        assert operation["state"] == "completed"
        assert operation["response"] is None
        assert operation["safe_to_retry"] is False
    assert upstream.count == 1


async def test_a_host_clock_stepped_back_never_replays_a_swept_body(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """On SQLite, a gateway restarted with its clock stepped back 30 s after the sweep
    dropped a body answers receipt-expired, never an empty replay."""
    fast = {"retention": "2s", "sweep_interval": "200ms"}
    first = spawn(processes, tmp_path, upstream.url, idempotency=fast)
    async with aiohttp.ClientSession() as session:
        status, _, _ = await post_keyed(session, first, "receipt-2")
        assert status == 201
        await wait_until_swept(session, first)  # the sweeper dropped the body
        first.stop()

        stepped = spawn(
            processes, tmp_path, upstream.url, name="stepped", env=skewed_clock(-30.0),
            idempotency=fast,
        )  # fmt: skip
        assert_receipt_expired(*await post_keyed(session, stepped, "receipt-2"))
        operation = await lookup(session, stepped, "receipt-2")
        assert operation["response"] is None
        assert operation["body_retained"] is False
        assert operation["safe_to_retry"] is False
    assert upstream.count == 1


@pytest.mark.postgres
async def test_a_replica_ahead_of_the_database_does_not_release_by_probe_too_soon(
    start_replica: Start, upstream: CountingUpstream
) -> None:
    """A replica 20 s ahead probes an effect the upstream has not applied yet, one second
    after it was sent: "not applied" is too soon on the database clock, so the key stays
    unknown and the retry is not sent a second time."""
    route = {
        "timeout": "1s",
        "forward_key": "operation_id",
        "probe": {
            "method": "GET",
            "path": "/effects/{operation_id}",
            "applied_statuses": [200],
            "not_applied_statuses": [404],
            "not_applied_after": "10s",
            "applies_to": ["POST /v1/issues"],
            "sees_all_callers": True,
        },
    }
    settings = {"route": route, "idempotency": {"lease": "1s", "sweep_interval": "60s"}}
    a = start_replica("a", **settings)
    b = start_replica("b", skew=20.0, **settings)
    async with aiohttp.ClientSession() as session:
        # The upstream applies the request 3 s after receiving it; the gateway gives up at 1 s.
        status, _, body = await post_keyed(session, a, "late-1", query="?apply_after=3")
        assert status == 504, body

        operation = await lookup(session, b, "late-1")  # probes: 404, the effect is not there yet
        assert operation["state"] == "unknown", operation
        status, _, body = await post_keyed(session, b, "late-1", query="?apply_after=3")
        assert status == 409, body
        assert json.loads(body)["type"].endswith("/outcome-unknown")

        await upstream.wait_for_count(1, seconds=60)
        await asyncio.sleep(0.5)
    assert upstream.count == 1, [effect.number for effect in upstream.effects]
