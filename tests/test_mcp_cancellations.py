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
import random
from pathlib import Path
from typing import Any

import aiohttp
import pytest
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
