"""The gateway as production runs it, killed with SIGKILL at the worst moments."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import aiohttp
import pytest
from harness import GatewayProcess, spawn
from upstream import CountingUpstream

pytestmark = pytest.mark.slow


async def post(url: str, key: str, body: object, query: str = "") -> aiohttp.ClientResponse:
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            f"{url}/tickets/v1/issues{query}",
            data=json.dumps(body).encode(),
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        )
        await response.read()
        return response


async def test_completed_receipt_survives_kill_9(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A receipt acknowledged before SIGKILL is replayed by the restarted gateway."""
    first_process = spawn(processes, tmp_path, upstream.url)
    first = await post(first_process.url, "crash-1", {"title": "a"})
    assert first.status == 201
    first_process.kill(signal.SIGKILL)

    second_process = spawn(processes, tmp_path, upstream.url)
    retry = await post(second_process.url, "crash-1", {"title": "a"})
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert await retry.read() == await first.read()
    assert upstream.count == 1


async def test_a_second_process_cannot_open_the_same_database(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """One SQLite file serves one gateway process; a second one refuses to start."""
    spawn(processes, tmp_path, upstream.url)
    with pytest.raises(RuntimeError, match="in use by another gateway process"):
        spawn(processes, tmp_path, upstream.url)
