"""kill -9 of a gateway in the middle of an MCP tool call: the call is never run twice.

The gateway runs as `python -m gateway serve` with a test-only fault that
kills it (SIGKILL, no cleanup) at an exact point of a protected call; a new
gateway on the same database then answers the retry.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import pytest_asyncio
from harness import GatewayProcess, spawn
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client

pytestmark = pytest.mark.slow

PREFIX = "/tools"


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


@pytest.mark.parametrize("window", ["after_send", "after_response"])
async def test_a_gateway_killed_after_sending_a_call_leaves_it_unknown_never_resent(
    processes: list[GatewayProcess], tmp_path: Path, server: CountingMcpServer, window: str
) -> None:
    """Killed once the call went out (before or after the server's answer came back):
    after a restart the call is `unknown` (its lease ran out), the retry gets an isError
    result naming outcome-unknown, and the server ran the tool once."""
    route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
    options = {"route": route, "idempotency": {"lease": "1s"}}
    first = spawn(processes, tmp_path, server.url, fault=f"crash_{window}", **options)
    async with asyncio.timeout(300):  # two gateway starts on a loaded machine; bounds a hang
        with pytest.raises(BaseException):  # noqa: B017, PT011 (the gateway vanished mid-call)
            async with mcp_client(first.url + PREFIX) as client:
                await call_with_key(client, "create_ticket", {"title": "k9"}, "killed-1")
        first.kill()
        assert server.count == 1
        second = spawn(processes, tmp_path, server.url, name="gw2", **options)
        await asyncio.sleep(1.2)  # past the dead holder's lease
        async with mcp_client(second.url + PREFIX) as client:
            retry = await call_with_key(client, "create_ticket", {"title": "k9"}, "killed-1")
    assert retry.is_error is True
    assert (retry.meta or {})["idempotency"]["type"] == "outcome-unknown"
    assert server.count == 1
