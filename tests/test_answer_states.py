"""The state in every answer is the record's (issue: "never twice, proven", defect 5).

An answer's `Idempotency-Status` and its problem's `state` and `safe_to_retry`
describe the record as it stands after the gateway's write, not the state the
write meant to set: a write refused because the attempt was superseded must
not tell the agent "released, safe to retry" about a completed or unknown key.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import (
    RELEASE_SOON,
    GatewayProcess,
    post_keyed,
    resolve_when_allowed,
    spawn,
    wait_until_stopped,
)
from upstream import CountingUpstream


async def state_of(session: aiohttp.ClientSession, gateway: GatewayProcess, key: str) -> str:
    async with session.get(f"{gateway.url}/operations/{key}") as response:
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
        return str(document["state"])


async def resolve(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, outcome: str
) -> None:
    status, document = await resolve_when_allowed(
        session, f"{gateway.url}/operations/{key}/resolve", {"outcome": outcome, "note": "checked"}
    )
    assert status == 200, document


async def test_a_late_refusal_after_a_resolution_carries_the_records_state(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A 429 arriving after the lapsed attempt was resolved `applied` is passed on with
    `Idempotency-Status: completed` (the record), not `released` (what the refused
    release meant to write)."""
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        route={"timeout": "10m"},  # the 429 comes when the test releases it
        idempotency={"lease": "1s", "sweep_interval": "200ms"},
    )
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(
            post_keyed(session, gateway, "late-429", query="?status=429&hold_answer=1")
        )
        await upstream.wait_for_count(1, seconds=60)
        gateway.kill(signal.SIGSTOP)
        await asyncio.sleep(1.5)  # past the 1 s lease: the sweeper turns it unknown on resume
        gateway.kill(signal.SIGCONT)
        async with asyncio.timeout(60):
            while True:  # the sweeper turns the lapsed lease unknown
                if await state_of(session, gateway, "late-429") == "unknown":
                    break
                await asyncio.sleep(0.1)
        await resolve(session, gateway, "late-429", "applied")
        upstream.release_answers()  # the 429 arrives after the resolution, never before

        status, headers, _ = await first
        assert status == 429  # the upstream's refusal, passed on as it came
        assert headers["Idempotency-Status"] == "completed"
        assert await state_of(session, gateway, "late-429") == "completed"


@pytest.mark.postgres
async def test_lease_lost_reports_the_state_the_other_replica_left(
    postgres_url: str, processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A replica paused between claim and send wakes after another replica settled the key
    and sent attempt 2: it sends nothing and answers lease-lost with the record's state
    (`completed`), never `released`."""
    options: dict[str, Any] = {
        "store_url": postgres_url,
        "idempotency": {"lease": "1s", "sweep_interval": "60s"},
        "route": RELEASE_SOON,
    }
    a = spawn(processes, tmp_path, upstream.url, name="a", fault="pause_after_claim", **options)
    b = spawn(processes, tmp_path, upstream.url, name="b", **options)
    async with aiohttp.ClientSession() as session:
        paused = asyncio.create_task(post_keyed(session, a, "paused-2"))
        await wait_until_stopped(a)
        await asyncio.sleep(1.2)  # A's lease runs out while it is frozen

        status, _, body = await post_keyed(session, b, "paused-2")
        assert (status, json.loads(body)["state"]) == (409, "unknown"), body
        await resolve(session, b, "paused-2", "not_applied")
        status, _, _ = await post_keyed(session, b, "paused-2")
        assert status == 201  # attempt 2, sent by B
        a.kill(signal.SIGCONT)

        status, headers, body = await paused
        problem = json.loads(body)
        assert status == 503, body
        assert problem["type"].endswith("/lease-lost")
        assert (problem["state"], headers["Idempotency-Status"]) == ("completed", "completed")
        assert problem["safe_to_retry"] is True
    assert upstream.count == 1
