"""Group commit keeps durability: kill -9 during a burst loses no acknowledged receipt
and leaves no forwarded request without its record."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import signal
from pathlib import Path

import aiohttp
import pytest
from harness import GatewayProcess, spawn
from upstream import CountingUpstream

pytestmark = pytest.mark.slow

BURST = 200


async def test_kill_9_during_a_burst_keeps_every_acknowledged_receipt(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Every 201 the burst got is a completed record after restart; every effect has a record."""
    gateway = spawn(processes, tmp_path, upstream.url)
    acknowledged: list[str] = []

    async def send(session: aiohttp.ClientSession, key: str) -> None:
        with contextlib.suppress(aiohttp.ClientError):
            response = await session.post(
                f"{gateway.url}/tickets/v1/issues?delay=0.05",
                data=json.dumps({"burst": key}).encode(),
                headers={"Idempotency-Key": key, "Content-Type": "application/json"},
            )
            await response.read()
            if response.status == 201:
                acknowledged.append(key)

    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as session:
        burst = asyncio.gather(*(send(session, f"burst-{n}") for n in range(BURST)))
        await upstream.wait_for_count(BURST // 3, seconds=60)
        gateway.kill(signal.SIGKILL)
        await burst
    assert 0 < len(acknowledged) < BURST, "the kill must land mid-burst"

    restarted = spawn(processes, tmp_path, upstream.url, name="gw2")
    recorded: dict[str, str] = {}  # operation id (what the upstream saw) -> caller's key
    async with aiohttp.ClientSession() as session:
        for n in range(BURST):
            key = f"burst-{n}"
            lookup = await session.get(f"{restarted.url}/operations/{key}")
            if key in acknowledged:
                assert lookup.status == 200, key
                assert (await lookup.json())["state"] == "completed", key
            if lookup.status == 200:
                operation = await lookup.json()
                assert operation["state"] in ("completed", "unknown"), operation
                recorded[operation["id"]] = key
    forwarded = collections.Counter(effect.key for effect in upstream.effects)
    unrecorded = set(forwarded) - set(recorded)
    assert not unrecorded, f"forwarded without a record: {sorted(unrecorded)[:5]}"
    assert max(forwarded.values()) == 1, forwarded.most_common(3)
