"""An MCP-shaped server that records every `notifications/cancelled` it receives.

The cancellation tests need to know, for each request id, whether the server
heard of its cancellation at all and whether that cancellation arrived before
the call itself (a cancellation that overtook its call). The official SDK
server (tests/mcp_upstream.py) hides both, and is too heavy for hundreds of
trials, so this is a small aiohttp server on 127.0.0.1, stateless, answering
JSON: a `tools/call` is answered after `tool_seconds` (or, for the tool
`until_cancelled`, once its cancellation arrives), a notification with 202.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from dataclasses import dataclass, field
from typing import Any, Self

from aiohttp import web

ACCEPT_JSON = {
    "Accept": "application/json, text/event-stream",
    "Content-Type": "application/json",
    "MCP-Protocol-Version": "2025-11-25",
}
"""What a Streamable HTTP client sends with every POST (no session: the server is stateless)."""


def tool_call(request_id: int, tool: str, *, key: str | None = None) -> dict[str, Any]:
    """A `tools/call` of `tool` with JSON-RPC id `request_id` (protected when `key` is set)."""
    params: dict[str, Any] = {"name": tool, "arguments": {"n": request_id}}
    if key is not None:
        params["_meta"] = {"idempotencyKey": key}
    return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}


def cancellation(request_id: int) -> dict[str, Any]:
    """The client's `notifications/cancelled` for the request `request_id`."""
    return {
        "jsonrpc": "2.0",
        "method": "notifications/cancelled",
        "params": {"requestId": request_id, "reason": "the client gave up"},
    }


@dataclass
class Arrival:
    """When a message reached the server: its place in the order of all arrivals, and the
    event loop's time (`loop.time()`, the monotonic clock)."""

    order: int
    at: float


@dataclass
class CancelRecordingServer:
    """Records each `tools/call` and each `notifications/cancelled` by request id.

    >>> async with CancelRecordingServer() as server:
    ...     await server.cancellation_of(7)   # waits until the server hears it
    """

    tool_seconds: float = 0.05
    url: str = ""
    calls: dict[str, Arrival] = field(default_factory=dict)
    """Request id (as JSON) of every `tools/call` that arrived."""
    cancellations: dict[str, Arrival] = field(default_factory=dict)
    """Request id (as JSON) named by every `notifications/cancelled` that arrived."""
    _arrivals: itertools.count[int] = field(init=False, default_factory=itertools.count)
    _heard: dict[str, asyncio.Event] = field(init=False, default_factory=dict)
    _called: dict[str, asyncio.Event] = field(init=False, default_factory=dict)
    _runner: web.AppRunner | None = field(init=False, default=None)

    def overtaken(self) -> list[str]:
        """The request ids whose cancellation arrived before the call itself (or alone)."""
        return [
            request_id
            for request_id, cancelled in self.cancellations.items()
            if request_id not in self.calls or self.calls[request_id].order > cancelled.order
        ]

    async def cancellation_of(self, request_id: int) -> Arrival:
        """Wait until the cancellation of `request_id` arrives (callers bound the wait)."""
        name = json.dumps(request_id)
        await _event(self._heard, name).wait()
        return self.cancellations[name]

    async def call_of(self, request_id: int) -> Arrival:
        """Wait until the call `request_id` arrives (callers bound the wait)."""
        name = json.dumps(request_id)
        await _event(self._called, name).wait()
        return self.calls[name]

    async def __aenter__(self) -> Self:
        app = web.Application()
        app.router.add_post("/mcp", self._post)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}/mcp"
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _post(self, request: web.Request) -> web.StreamResponse:
        message = await request.json()
        arrival = Arrival(order=next(self._arrivals), at=asyncio.get_running_loop().time())
        if message.get("method") == "notifications/cancelled":
            name = json.dumps(message["params"]["requestId"])
            self.cancellations.setdefault(name, arrival)
            _event(self._heard, name).set()
            return web.Response(status=202)
        if message.get("method") != "tools/call":
            return web.json_response({"jsonrpc": "2.0", "id": message.get("id"), "result": {}})
        name = json.dumps(message["id"])
        self.calls.setdefault(name, arrival)
        _event(self._called, name).set()
        if message["params"]["name"] == "until_cancelled":
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(30):
                    await _event(self._heard, name).wait()
        else:
            await asyncio.sleep(self.tool_seconds)
        result = {"content": [{"type": "text", "text": "done"}], "isError": False}
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": result})


def _event(events: dict[str, asyncio.Event], name: str) -> asyncio.Event:
    return events.setdefault(name, asyncio.Event())
