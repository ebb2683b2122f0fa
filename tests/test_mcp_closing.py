"""A client cancels by closing its request (issue "MCP servers on stdio ... every
generation's cancellation").

In 2026-07-28 a client cancels a call by closing the request that carries it; a server
reached directly then cancels the tool. Through the gateway a call it only passes
through (no key) ran to the end: the gateway kept reading the server's answer for a
caller that had gone. Now a caller's closed request closes the gateway's request to the
server, and the server cancels, as going direct would. Through the official SDK, in
both generations, against the SDK's own server.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from conftest import GatewayFactory
from mcp_upstream import (
    ACCEPT_BOTH,
    INITIALIZE,
    LEGACY,
    MODERN,
    CountingMcpServer,
    call_with_key,
    mcp_client,
)

PREFIX = "/tools"
SECONDS = 30


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


async def call_then_close(url: str, mode: str, title: str) -> None:
    """Start an `until_cancelled` call without a key, and once the tool reported progress
    (it is running), cancel it the SDK's way: the call's task is cancelled."""
    started = asyncio.Event()

    async def progress(done: float, total: float | None, message: str | None) -> None:
        started.set()

    async with mcp_client(url, mode=mode) as client:
        call = asyncio.create_task(
            call_with_key(client, "until_cancelled", {"title": title}, None, progress=progress)
        )
        async with asyncio.timeout(SECONDS):
            await started.wait()
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call


@pytest.mark.parametrize("mode", [MODERN, LEGACY])
async def test_a_closed_request_cancels_a_passed_through_call_at_the_server(
    gateway_factory: GatewayFactory, server: CountingMcpServer, mode: str
) -> None:
    """Direct, the server cancels the tool when the client cancels; through the gateway
    the same happens to a key-less call, which the gateway only passes through."""
    await call_then_close(server.url, mode, f"direct-{mode}")
    await server.wait_for_cancelled(f"direct-{mode}", seconds=SECONDS)

    route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
    gateway = await gateway_factory(server.url, route=route)
    await call_then_close(gateway.url + PREFIX, mode, f"through-{mode}")
    await server.wait_for_cancelled(f"through-{mode}", seconds=SECONDS)
    assert server.count == 0


async def test_an_idle_server_stream_outlives_the_routes_timeout(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """`timeout` is the silence limit of calls: a client's GET stream, silent while the
    server has nothing to say, stays open well past it (the TypeScript clients logged an
    error at every cut); `max_stream` is what bounds it."""
    route = {
        "name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp",
        "timeout": "300ms",
    }  # fmt: skip
    gateway = await gateway_factory(server.url, route=route)
    url = gateway.url + PREFIX
    async with aiohttp.ClientSession() as http, asyncio.timeout(SECONDS):
        async with http.post(url, json=INITIALIZE, headers=ACCEPT_BOTH) as answer:
            assert answer.status == 200, await answer.text()
            session = {
                "Mcp-Session-Id": answer.headers["Mcp-Session-Id"],
                "MCP-Protocol-Version": "2025-11-25",
            }
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with http.post(url, json=initialized, headers={**ACCEPT_BOTH, **session}) as answer:
            assert answer.status == 202
        headers = {"Accept": "text/event-stream", **session}
        async with http.get(url, headers=headers) as stream:
            assert stream.status == 200
            with pytest.raises(TimeoutError):  # 2 s of silence, and no end of the stream
                await asyncio.wait_for(stream.content.read(1), 2.0)
