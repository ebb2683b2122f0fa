"""A protected call's stream that breaks after event ids is resumed, not given up.

Streamable HTTP lets a server number its events; a client that loses the
stream GETs it again with `Last-Event-ID` and gets the rest. The gateway
does that itself for a protected call (within the route's `timeout`) before
it would mark the call `unknown`. The official SDK server sends no event ids,
so this server is a small aiohttp one that does, on loopback.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import GatewayFactory
from upstream import serve_mcp_handlers

PREFIX = "/tools"
ACCEPT = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}


@dataclass
class ResumableServer:
    """Answers a tools/call with event 1 (progress), then breaks the stream; a GET with
    Last-Event-ID: 1 gets event 2, the response (unless `resumable` is off)."""

    resumable: bool = True
    effects: int = 0
    resumed_with: list[str] = field(default_factory=list)
    pending: dict[str, Any] = field(default_factory=dict)
    url: str = ""

    async def post(self, request: web.Request) -> web.StreamResponse:
        call = await request.json()
        self.effects += 1
        self.pending["1"] = {
            "jsonrpc": "2.0",
            "id": call["id"],
            "result": {"content": [{"type": "text", "text": "T-1"}], "isError": False},
        }
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        progress = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {}}
        await response.write(b"id: 1\ndata: " + json.dumps(progress).encode() + b"\n\n")
        assert request.transport is not None
        request.transport.close()  # the stream breaks before the response
        return response

    async def get(self, request: web.Request) -> web.StreamResponse:
        last = request.headers.get("Last-Event-ID", "")
        self.resumed_with.append(last)
        if not self.resumable or last not in self.pending:
            return web.Response(status=405)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        body = json.dumps(self.pending.pop(last)).encode()
        await response.write(b"id: 2\ndata: " + body + b"\n\n")
        await response.write_eof()
        return response


@pytest_asyncio.fixture
async def resumable() -> AsyncIterator[ResumableServer]:
    server = ResumableServer()
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        yield server


async def call(url: str, key: str) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "tools/call",
        "params": {"name": "create_ticket", "arguments": {}, "_meta": {"idempotencyKey": key}},
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=ACCEPT) as got,
    ):
        return await got.text()


@pytest.mark.parametrize("resumable_server", [True, False], ids=["resumed", "not-resumable"])
async def test_a_broken_stream_with_event_ids_is_resumed_before_unknown(
    gateway_factory: GatewayFactory, resumable: ResumableServer, resumable_server: bool
) -> None:
    resumable.resumable = resumable_server
    route = {"name": "tools", "prefix": PREFIX, "upstream": resumable.url, "kind": "mcp"}
    gateway = await gateway_factory(resumable.url, route=route)
    answer = await call(gateway.url + PREFIX, "resume-1")
    operation = await (await gateway.get("/operations/resume-1")).json()
    assert resumable.effects == 1
    assert resumable.resumed_with == ["1"]
    if resumable_server:
        assert operation["state"] == "completed"
        assert operation["result"]["content"][0]["text"] == "T-1"
        assert '"text":"T-1"' in answer.replace(" ", "")
    else:
        assert operation["state"] == "unknown"
        assert '"state":"unknown"' in answer.replace(" ", "")
