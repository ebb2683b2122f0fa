"""A client's `notifications/cancelled` never overtakes its call, with any number of workers.

Streamable HTTP sends a cancellation as a POST of its own, often on another
connection, so with `[server] workers` it may reach another worker than its
call, and before the call is known there. These tests run the gateway as
production does (a subprocess with a supervisor and workers), send calls and
their cancellations on fresh connections close together, and count what the
MCP server (tests/mcp_cancel_server.py) hears.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import GatewayProcess, spawn
from mcp_cancel_server import ACCEPT_JSON, CancelRecordingServer, cancellation, tool_call
from upstream import CountingUpstream

pytestmark = pytest.mark.slow

PREFIX = "/tools"
TRIALS = 500
PARALLEL = 32
"""Trials in flight at once: enough to load the workers and their supervisor's relay."""
MAX_GAP = 0.040


def mcp_route(server: CancelRecordingServer, **options: Any) -> dict[str, Any]:
    return {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp", **options}


def fresh_connections() -> aiohttp.ClientSession:
    """Every request on a new connection, so SO_REUSEPORT picks a worker for each."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))


async def post(session: aiohttp.ClientSession, url: str, message: dict[str, Any]) -> int:
    async with session.post(url, data=json.dumps(message), headers=ACCEPT_JSON) as answer:
        await answer.read()
        return answer.status


def cancellations_dropped(gateway: GatewayProcess) -> int:
    """How many cancellations of protected calls the gateway's log says it held back."""
    assert gateway.log_path is not None
    dropped = 0
    for line in gateway.log_path.read_text().splitlines():
        if line.startswith("{") and json.loads(line).get("event") == "mcp_cancel":
            dropped += 1
    return dropped


async def all_decided(server: CancelRecordingServer, gateway: GatewayProcess, count: int) -> None:
    """Wait until `count` cancellations are decided: heard by the server or logged as held
    back by the gateway, so that none is still on its way when the test counts them."""
    while True:
        if len(server.cancellations) + cancellations_dropped(gateway) >= count:
            return
        await asyncio.sleep(0.05)


async def trial(
    session: aiohttp.ClientSession, url: str, request_id: int, gap: float
) -> tuple[int, int]:
    """A protected call, then `gap` seconds later its cancellation, on two connections:
    (the call's HTTP status, the cancellation's)."""
    call = asyncio.create_task(
        post(session, url, tool_call(request_id, "create_ticket", key=f"trial-{request_id}"))
    )
    await asyncio.sleep(gap)
    cancelled = await post(session, url, cancellation(request_id))
    return await call, cancelled


@pytest.mark.parametrize("workers", [2, 3])
async def test_a_protected_call_never_receives_its_cancellation_whichever_worker_it_reaches(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream, workers: int
) -> None:
    """500 protected calls, each cancelled 0-40 ms after it is sent on a fresh connection:
    the server hears none of the cancellations."""
    async with CancelRecordingServer(tool_seconds=0.05) as server:
        gateway = spawn(
            processes,
            tmp_path,
            upstream.url,
            extra_routes=[mcp_route(server)],
            server={"workers": workers},
            logging={"level": "info", "format": "json"},
        )
        url = gateway.url + PREFIX
        gaps = random.Random(workers).choices(range(int(MAX_GAP * 1000) + 1), k=TRIALS)
        slots = asyncio.Semaphore(PARALLEL)

        async def bounded(request_id: int) -> tuple[int, int]:
            async with slots:
                return await trial(session, url, request_id, gaps[request_id] / 1000)

        async with asyncio.timeout(120), fresh_connections() as session:
            answers = await asyncio.gather(*(bounded(n) for n in range(TRIALS)))
            assert set(answers) == {(200, 202)}, answers
            await all_decided(server, gateway, TRIALS)
    leaked = sorted(server.cancellations, key=int)
    assert not leaked, (
        f"{len(leaked)} of {TRIALS} cancellations of protected calls reached the server "
        f"({len(server.overtaken())} before their call): {leaked}"
    )
    assert len(server.calls) == TRIALS


async def test_a_cancellation_of_an_unprotected_call_is_forwarded_at_once(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Calls without a key, each cancelled on a fresh connection (some on the other worker)
    while the server runs it: each cancellation reaches the server, which ends the call,
    long before the route's 60 s hold could have passed."""
    async with CancelRecordingServer() as server:
        gateway = spawn(
            processes,
            tmp_path,
            upstream.url,
            extra_routes=[mcp_route(server, cancel_hold="60s")],
            server={"workers": 2},
        )
        url = gateway.url + PREFIX
        async with asyncio.timeout(30), fresh_connections() as session:
            for request_id in range(8):
                call = asyncio.create_task(
                    post(session, url, tool_call(request_id, "until_cancelled"))
                )
                await server.call_of(request_id)
                assert await post(session, url, cancellation(request_id)) == 202
                await server.cancellation_of(request_id)
                assert await call == 200
    assert server.overtaken() == []


async def test_a_cancellation_of_a_request_never_seen_is_forwarded_after_the_hold(
    gateway_factory: GatewayFactory,
) -> None:
    """A cancellation naming no request the gateway has seen is answered 202 at once and
    reaches the server once the route's hold (300 ms) has passed, not before."""
    async with CancelRecordingServer() as server:
        gateway = await gateway_factory(server.url, route=mcp_route(server, cancel_hold="300ms"))
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(20), fresh_connections() as session:
            sent = loop.time()
            assert await post(session, gateway.url + PREFIX, cancellation(999)) == 202
            arrival = await server.cancellation_of(999)
    assert arrival.at - sent >= 0.3


async def test_a_late_cancellation_of_a_finished_protected_call_is_dropped(
    gateway_factory: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancellation that arrives after its protected call was answered is still matched
    (names are kept a while) and dropped at once, not held and forwarded; the held-back
    cancellation is written to the call's history, and logged with its key."""
    caplog.set_level(logging.INFO, logger="gateway")
    async with CancelRecordingServer(tool_seconds=0) as server:
        gateway = await gateway_factory(server.url, route=mcp_route(server))
        url = gateway.url + PREFIX
        async with asyncio.timeout(20), fresh_connections() as session:
            assert await post(session, url, tool_call(5, "create_ticket", key="late")) == 200
            assert await post(session, url, cancellation(5)) == 202
            # Written in the background: the history first, then the log line (a reader
            # that stopped at the history could look at the log before it was written).
            while True:
                lookup = await (await gateway.get("/operations/late")).json()
                written = "cancellation-held" in [event["type"] for event in lookup["history"]]
                if written and held_cancellations(caplog):
                    break
                await asyncio.sleep(0.05)
    held = held_cancellations(caplog)
    assert [getattr(record, "key", None) for record in held] == ["late"]
    assert server.cancellations == {}


def held_cancellations(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    """The gateway's log records about cancellations (`mcp_cancel...` events)."""
    return [r for r in caplog.records if str(getattr(r, "event", "")).startswith("mcp_cancel")]
