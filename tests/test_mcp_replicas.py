"""MCP routes on two gateway replicas sharing PostgreSQL: one effect for a storm of one call.

Real `python -m gateway serve` processes on one PostgreSQL schema, the
official MCP client on each side of the storm, one counting MCP server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from harness import GatewayProcess, spawn
from mcp_upstream import LEGACY, MODERN, CountingMcpServer, call_with_key, mcp_client

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PREFIX = "/tools"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


async def test_a_storm_of_one_call_across_two_replicas_makes_one_effect(
    postgres_url: str,
    processes: list[GatewayProcess],
    tmp_path: Path,
    server: CountingMcpServer,
) -> None:
    """16 clients (8 per replica, both protocol generations) send the same keyed call at
    once to a tool that takes 0.5 s: the server runs it once; every client gets its
    result (live, or replayed after waiting for the outcome)."""
    route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
    replicas = [
        spawn(processes, tmp_path, server.url, name=name, store_url=postgres_url, route=route)
        for name in ("a", "b")
    ]
    arguments = {"title": "storm", "seconds": 0.5}

    async def one(index: int) -> tuple[bool, object]:
        replica = replicas[index % 2]
        mode = MODERN if index % 4 < 2 else LEGACY
        async with mcp_client(replica.url + PREFIX, mode=mode) as client:
            result = await call_with_key(client, "slow_ticket", arguments, "storm-1")
            return result.is_error, result.structured_content

    async with asyncio.timeout(60):
        results = await asyncio.gather(*(one(index) for index in range(16)))
    assert server.count == 1
    assert [error for error, _ in results] == [False] * 16, results
    assert len({str(content) for _, content in results}) == 1
