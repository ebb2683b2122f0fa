"""A step of the store's clock never shortens a grace that releases a key.

The defect these pin: on SQLite, a call turned `unknown` after its route's
timeout while the upstream was still applying it; the probe's "not applied"
was rightly kept as too soon (`not_applied_after = 5m`); then the host's
clock stepped ten minutes ahead, the next probe counted the grace as over,
released the key, the retry was sent, and the first send landed too: two
effects. The gateway now counts such a grace on its own monotonic clock as
well as the store's, so a forward step keeps the key `unknown` until the
grace really passed. The same holds for PostgreSQL's clock, which the test
steps by putting its own `clock_timestamp()` ahead of `pg_catalog`'s in the
gateway's `search_path`: the gateway's statements are the production ones.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import asyncpg
import pytest
from harness import GatewayProcess, SteppedClock, calibration_sample, post_keyed, spawn
from pg import PG_URL
from upstream import CountingUpstream, effects_probe

LATE_APPLYING_ROUTE = {"timeout": "2s", "probe": effects_probe(not_applied_after="5m")}
"""The route of the report: the gateway gives up after 2 s, probes wait five minutes."""
SETTINGS = {"route": LATE_APPLYING_ROUTE, "idempotency": {"lease": "6s", "sweep_interval": "1h"}}


async def lookup(session: aiohttp.ClientSession, gateway: GatewayProcess, key: str) -> Any:
    """The operation JSON of `key` (a lookup also probes an unknown key that is due)."""
    async with session.get(f"{gateway.url}/operations/{quote(key, safe='')}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


def probe_verdicts(operation: dict[str, Any]) -> list[str]:
    """The probes' words, once each (a repeated one is not evidence again)."""
    return [item["detail"] for item in operation["evidence"] if item["source"] == "probe"]


def probes_heard(operation: dict[str, Any]) -> int:
    """How many probe answers the history counts (the same verdict again is one event
    with a `count`)."""
    return sum(
        int(event.get("count", 1)) for event in operation["history"] if event["type"] == "probe"
    )


async def wait_for_probes(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, count: int
) -> dict[str, Any]:
    """Look `key` up until `count` probe answers are recorded or the key left `unknown`
    (a probe backs off between runs, 1 s doubling, so a lookup does not always probe)."""
    async with asyncio.timeout(120):
        while True:
            operation: dict[str, Any] = await lookup(session, gateway, key)
            if operation["state"] != "unknown" or probes_heard(operation) >= count:
                return operation
            await asyncio.sleep(0.1)


async def send_late_then_step(
    gateway: GatewayProcess, upstream: CountingUpstream, step: Callable[[], Awaitable[None]]
) -> None:
    """The report's sequence: a call the upstream holds past the route's timeout, a probe
    that finds nothing yet, a ten-minute step of the store's clock, another probe and a
    retry; then the upstream applies the first send."""
    key = "stepped-1"
    async with aiohttp.ClientSession() as session:
        status, _, body = await post_keyed(session, gateway, key, query="?hold=1")
        assert status == 504, body

        operation = await wait_for_probes(session, gateway, key, 1)
        assert operation["state"] == "unknown", operation
        assert "not_applied_after" in probe_verdicts(operation)[0]

        await step()
        operation = await wait_for_probes(session, gateway, key, 2)
        assert operation["state"] == "unknown", operation  # the step did not end the grace
        status, _, body = await post_keyed(session, gateway, key, query="?hold=1")
        assert status == 409, body
        assert json.loads(body)["type"].endswith("/outcome-unknown")

        upstream.release_held()
        await upstream.wait_for_count(1, seconds=30.0)
        settled = await wait_for_probes(session, gateway, key, 3)
        assert settled["state"] in ("completed", "unknown"), settled
    assert upstream.held == 1, "the retry was sent while the first send was still being applied"
    assert upstream.count == 1


async def test_a_forward_step_of_the_host_clock_does_not_release_a_late_effect(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """On SQLite, the host's clock stepping ten minutes ahead after a too-soon probe keeps
    the key unknown: the retry is refused and the late first send is the only effect."""
    clock = SteppedClock(tmp_path / "clock")
    gateway = spawn(processes, tmp_path, upstream.url, env=clock.env, **SETTINGS)

    async def step() -> None:
        clock.step(600.0)

    await send_late_then_step(gateway, upstream, step)


@pytest.mark.postgres
async def test_a_forward_step_of_the_database_clock_does_not_release_a_late_effect(
    postgres_url: str,
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
) -> None:
    """On PostgreSQL, the database's clock stepping ten minutes ahead after a too-soon
    probe keeps the key unknown: the retry is refused and the late first send is the only
    effect."""
    schema = postgres_url.rsplit("search_path=", 1)[1]
    connection = await asyncpg.connect(PG_URL)
    try:
        await connection.execute(
            f"CREATE TABLE {schema}.clock_offset (seconds float8 NOT NULL);"
            f"INSERT INTO {schema}.clock_offset VALUES (0);"
            f"CREATE FUNCTION {schema}.clock_timestamp() RETURNS timestamptz "
            "LANGUAGE sql VOLATILE AS 'SELECT pg_catalog.clock_timestamp() + "
            f"make_interval(secs => (SELECT seconds FROM {schema}.clock_offset))'"
        )
        # The schema's clock_timestamp() before pg_catalog's: the database's notion of now.
        stepped_url = f"{postgres_url},pg_catalog"
        gateway = spawn(processes, tmp_path, upstream.url, store_url=stepped_url, **SETTINGS)

        async def step() -> None:
            await connection.execute(f"UPDATE {schema}.clock_offset SET seconds = seconds + 600")

        await send_late_then_step(gateway, upstream, step)
    finally:
        await connection.close()


async def test_a_restart_does_not_start_the_grace_again(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A gateway restarted after a probe's grace passed releases the key at its first probe:
    it carries on from its predecessor's clock witnesses (same host, same boot) instead of
    waiting a whole grace of its own."""
    settings = {
        "route": {"timeout": "1s", "probe": effects_probe(not_applied_after="3s")},
        "idempotency": {"lease": "1s", "sweep_interval": "1h"},
    }
    first = spawn(processes, tmp_path, upstream.url, **settings)
    async with aiohttp.ClientSession() as session:
        await calibration_sample(session, first.url)
        status, _, body = await post_keyed(session, first, "restarted-1", query="?hold=1")
        assert status == 504, body
        # The window passes while the first gateway runs (never less): the lease the claim
        # granted (1 s), the whole call after it (timeout 1 s), the grace (3 s).
        await asyncio.sleep(5.5)
        first.stop()

        second = spawn(processes, tmp_path, upstream.url, name="second", **settings)
        operation = await lookup(session, second, "restarted-1")
        assert operation["state"] == "released", operation
    assert upstream.count == 1  # the calibration sample only


async def test_a_forward_step_does_not_end_the_similar_window_of_an_unknown_twin(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A twin made `unknown` a moment ago, then the host's clock ten minutes ahead: on the
    store's clock alone the twin is older than `similar_window`, but this process has not
    seen that time pass, so the same request under a new key is still refused."""
    clock = SteppedClock(tmp_path / "clock")
    window = 3.0
    route = {"timeout": "1s", "similar_window": f"{window:g}s"}
    gateway = spawn(processes, tmp_path, upstream.url, env=clock.env, route=route)
    # This process has watched the store's clock for longer than the window from here
    # on (time only adds to that): the window is judged on the store's clock, vouched.
    await asyncio.sleep(window + 0.5)
    body = json.dumps({"refund": 5}).encode()
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession() as session:

        async def post(key: str) -> tuple[int, Any]:
            async with session.post(
                f"{gateway.url}/tickets/v1/refunds?hold=1",
                data=body,
                headers={**headers, "Idempotency-Key": key},
            ) as response:
                return response.status, await response.read()

        status, answer = await post("twin")
        assert status == 504, answer
        clock.step(600.0)
        status, answer = await post("lost")
        assert status == 409, answer
        assert json.loads(answer)["type"].endswith("/similar-operation")
    assert upstream.held == 1
