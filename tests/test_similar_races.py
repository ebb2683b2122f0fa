"""Racing new keys for one request: the twin check and the claim are one step.

Gateways started as in production (subprocesses) on each way the store can be
shared: one process on SQLite, two worker processes on one SQLite file, two
replicas on one PostgreSQL schema. Twenty new keys for one body, sent at once
over fresh connections (so the kernel spreads them over the workers, and the
test over the replicas): while a twin is `unknown` none is sent; with no twin,
exactly one is sent and every other one is refused naming an operation.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import GatewayProcess, spawn
from upstream import CountingUpstream

RACERS = 20
BODY = json.dumps({"title": "one refund", "amount": 5}).encode()
HELD = "/tickets/v1/refunds?hold=1"


async def _post(
    session: aiohttp.ClientSession, url: str, key: str
) -> tuple[int, dict[str, Any] | None]:
    async with session.post(
        url + HELD,
        data=BODY,
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    ) as response:
        body = await response.read()
        if response.headers.get("Content-Type", "").startswith("application/problem+json"):
            return response.status, json.loads(body)
        return response.status, None


def _gateways(
    setup: str,
    postgres_url: str | None,
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
    *,
    timeout: str,
) -> list[GatewayProcess]:
    route = {"timeout": timeout}
    if setup == "sqlite":
        return [spawn(processes, tmp_path, upstream.url, route=route)]
    if setup == "sqlite-2-workers":
        return [spawn(processes, tmp_path, upstream.url, route=route, server={"workers": 2})]
    assert postgres_url is not None
    return [
        spawn(processes, tmp_path, upstream.url, name=name, route=route, store_url=postgres_url)
        for name in ("replica-a", "replica-b")
    ]


SETUPS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("sqlite-2-workers", id="sqlite-2-workers", marks=pytest.mark.slow),
    pytest.param("postgres-2-replicas", id="postgres-2-replicas", marks=pytest.mark.postgres),
]


@pytest.fixture(params=SETUPS)
def setup(request: pytest.FixtureRequest) -> tuple[str, str | None]:
    """The setup's name and, for the replicas, a fresh PostgreSQL schema (`postgres_url`,
    set up before `processes`, so the gateways stop before it is dropped)."""
    name: str = request.param
    if name.startswith("postgres"):
        url: str = request.getfixturevalue("postgres_url")
        return name, url
    return name, None


def _race(gateways: list[GatewayProcess], prefix: str) -> tuple[aiohttp.ClientSession, list[Any]]:
    """RACERS new keys for BODY at once, alternating between the gateways, one connection
    each: the session (close it) and the requests' tasks."""
    connector = aiohttp.TCPConnector(force_close=True, limit=0)
    session = aiohttp.ClientSession(connector=connector)
    tasks = [
        asyncio.ensure_future(_post(session, gateways[n % len(gateways)].url, f"{prefix}-{n}"))
        for n in range(RACERS)
    ]
    return session, tasks


async def test_no_new_key_is_sent_while_the_twin_is_unknown(
    setup: tuple[str, str | None],
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
) -> None:
    gateways = _gateways(*setup, processes, tmp_path, upstream, timeout="1s")
    async with aiohttp.ClientSession() as session:
        status, _ = await _post(session, gateways[0].url, "twin")
        assert status == 504  # sent, no answer in time: unknown
    await upstream.wait_for_held(1)

    session, tasks = _race(gateways, "lost")
    async with session:
        answers = await asyncio.gather(*tasks)
    assert [status for status, _ in answers] == [409] * RACERS
    for _, problem in answers:
        assert problem is not None
        assert problem["type"].endswith("/similar-operation")
        assert problem["similar_operation"]["key"] == "twin"
        assert problem["similar_operation"]["state"] == "unknown"
    assert upstream.held == 1  # only the twin ever reached the tool
    upstream.release_held()
    await upstream.wait_for_effects(1)
    assert upstream.count == 1


async def test_of_racing_new_keys_for_one_request_exactly_one_is_sent(
    setup: tuple[str, str | None],
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
) -> None:
    # The one sent waits for the test's release, which on a loaded machine came more than
    # 1 s later (it timed out, 504, naming no twin): its limit bounds a hang only.
    gateways = _gateways(*setup, processes, tmp_path, upstream, timeout="120s")
    session, tasks = _race(gateways, "racer")
    async with session:
        # The one that is sent is held by the tool; every other one is answered now. Were
        # two sent, the wait for RACERS - 1 answers would time out.
        pending: set[Any] = set(tasks)
        async with asyncio.timeout(120):
            while len(pending) > 1:
                _, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
        await upstream.wait_for_held(1)  # the one left may not have reached the tool yet
        assert upstream.held == 1
        upstream.release_held()
        answers = await asyncio.gather(*tasks)
    statuses = sorted(status for status, _ in answers)
    assert statuses == [201] + [409] * (RACERS - 1), statuses
    winners = {problem["similar_operation"]["key"] for _, problem in answers if problem}
    assert len(winners) == 1  # every refusal names the one that was sent
    await upstream.wait_for_effects(1)
    assert upstream.count == 1
