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
import logging
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import ADMIN_TOKEN
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


@pytest.mark.parametrize("mode", [MODERN, LEGACY])
async def test_a_protected_calls_cancellation_is_held_back_and_recorded(
    gateway_factory: GatewayFactory,
    server: CountingMcpServer,
    mode: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A keyed call the client cancels (2026-07-28: by closing its request, once the tool
    reported progress; 2025-11-25: the SDK's read timeout, then `notifications/cancelled`)
    is not cancelled at the server: it runs to its end and its answer is the receipt. Its
    history now says the client cancelled it and the gateway held that back, and the log
    line names the key and the operation."""
    route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
    gateway = await gateway_factory(server.url, route=route, admin={"token": ADMIN_TOKEN})
    key = f"held-{mode}"
    started = asyncio.Event()

    async def progress(done: float, total: float | None, message: str | None) -> None:
        started.set()

    caplog.set_level(logging.INFO, logger="gateway.lifecycle")
    arguments = {"title": key, "seconds": 2}
    async with asyncio.timeout(SECONDS):
        if mode == LEGACY:  # the SDK does not send notifications/cancelled: sent here
            await call_then_cancel(gateway.url + PREFIX, key, arguments, server)
        else:
            async with mcp_client(gateway.url + PREFIX, mode=mode) as client:
                call = asyncio.create_task(
                    call_with_key(client, "slow_ticket", arguments, key, progress=progress)
                )
                await started.wait()
                call.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await call
        # The history is written first, then the log line: wait for both.
        while True:
            lookup = await (await gateway.get(f"/operations/{key}")).json()
            kinds = [event["type"] for event in lookup["history"]]
            logged = [r for r in caplog.records if r.getMessage().startswith("cancellation of a")]
            if lookup["state"] == "completed" and "cancellation-held" in kinds and logged:
                break
            await asyncio.sleep(0.05)
    assert server.count_for(lookup["id"]) == 1, "the call ran on, once"
    (held,) = [event for event in lookup["history"] if event["type"] == "cancellation-held"]
    assert "held the cancellation back" in held["detail"]
    (line,) = logged
    assert (getattr(line, "key", None), getattr(line, "operation_id", None)) == (key, lookup["id"])


async def call_then_cancel(
    url: str, key: str, arguments: dict[str, object], server: CountingMcpServer
) -> None:
    """A 2025-11-25 session's keyed `slow_ticket` call, and once the server runs it, the
    client's `notifications/cancelled` for it, as raw HTTP."""
    async with aiohttp.ClientSession() as http:
        async with http.post(url, json=INITIALIZE, headers=ACCEPT_BOTH) as answer:
            session = {
                "Mcp-Session-Id": answer.headers["Mcp-Session-Id"],
                "MCP-Protocol-Version": "2025-11-25",
                **ACCEPT_BOTH,
            }
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await (await http.post(url, json=initialized, headers=session)).read()
        params = {"name": "slow_ticket", "arguments": arguments, "_meta": {"idempotencyKey": key}}
        message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": params}
        call = asyncio.create_task(http.post(url, json=message, headers=session))
        await server.wait_for_count(1, seconds=SECONDS)
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled",
                  "params": {"requestId": 7, "reason": "the user stopped it"}}  # fmt: skip
        async with http.post(url, json=cancel, headers=session) as answer:
            assert answer.status == 202
        async with await call as answer:
            await answer.read()  # the call's answer: it ran to its end
