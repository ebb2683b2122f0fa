"""Why a protected MCP call became `unknown` is recorded as it happened, whatever the answer form.

A scripted MCP server on loopback applies the tool's effect, then fails its
answer one way: it answers "request cancelled" (`-32800`), falls silent past
the route's `timeout`, or cuts the connection mid-answer. It does so in a JSON
answer, in an event stream, or in the stream the gateway resumes with
`Last-Event-ID` after an event stream with ids ended without the answer. For
every row the refusal's problem type, its detail and the operation's evidence
name the same, true cause; the call is `unknown`, and its retry is not
forwarded.

The silences are unbounded (they last until the test ends), so the route's
`timeout` alone decides when the gateway gives up: a slow machine cannot turn
a row green or red. Rows where timing is not the subject get a generous one.
"""

from __future__ import annotations

import asyncio
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

from gateway.mcp.sse import SseDecoder

PREFIX = "/tools"
HEADERS = {"Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-11-25"}
CALL_ID = 7
SUBJECT_TIMEOUT = "1s"
"""The route's timeout where silence is the subject (the server's silence has no end)."""
GENEROUS_TIMEOUT = "30s"
"""The route's timeout where it is not: far beyond anything the rows wait for."""

JSON, STREAM, RESUMED = "json", "sse", "sse-resumed"
CANCELLED, SILENT, CUT = "cancelled", "silent", "cut"
CAUSES = {
    CANCELLED: ("outcome-unknown", "cancelled the call (-32800"),
    SILENT: ("upstream-timeout", "the route's timeout"),
    CUT: ("upstream-connection-lost", "broke"),
}
"""Per failure: the problem type, and the words of the detail that name the cause."""


@dataclass
class ScriptedServer:
    """A tools/call applies one effect, then its answer (`form`) fails as `failure` says.

    `RESUMED`: the POST's stream carries event 1 (progress) and ends without the
    answer; the GET with `Last-Event-ID: 1` that resumes it fails instead.
    """

    form: str = JSON
    failure: str = CANCELLED
    effects: int = 0
    posts: int = 0
    resumed_with: list[str] = field(default_factory=list)
    released: asyncio.Event = field(default_factory=asyncio.Event)
    """Set when the test ends: every silence ends with it."""
    url: str = ""

    async def post(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.posts += 1
        self.effects += 1  # the tool applies its effect before the answer fails
        if self.form == JSON:
            return await self._json(request)
        response = await _stream(request)
        await response.write(_event(_PROGRESS, "1" if self.form == RESUMED else None))
        if self.form == RESUMED:
            await response.write_eof()  # ends without the answer: the gateway resumes
            return response
        return await self._fail_stream(request, response, "2")

    async def get(self, request: web.Request) -> web.StreamResponse:
        last = request.headers.get("Last-Event-ID", "")
        self.resumed_with.append(last)
        if last != "1":
            return web.Response(status=405)
        response = await _stream(request)
        await response.write(b": resumed\n\n")
        return await self._fail_stream(request, response, "2")

    async def _json(self, request: web.Request) -> web.StreamResponse:
        if self.failure == CANCELLED:
            return web.json_response(_CANCELLED)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        await response.write(b'{"jsonrpc": "2.0", ')
        return await self._stop(request, response)

    async def _fail_stream(
        self, request: web.Request, response: web.StreamResponse, event_id: str
    ) -> web.StreamResponse:
        if self.failure == CANCELLED:
            await response.write(_event(_CANCELLED, event_id if self.form == RESUMED else None))
            await response.write_eof()
            return response
        return await self._stop(request, response)

    async def _stop(self, request: web.Request, response: web.StreamResponse) -> web.StreamResponse:
        """Fall silent until the test ends, or cut the connection now."""
        if self.failure == SILENT:
            await self.released.wait()
        if request.transport is not None:  # after a silence, the gateway has hung up already
            request.transport.close()
        return response


_PROGRESS = {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progress": 1}}
_CANCELLED = {"jsonrpc": "2.0", "id": CALL_ID, "error": {"code": -32800, "message": "cancelled"}}


async def _stream(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    return response


def _event(message: dict[str, Any], event_id: str | None) -> bytes:
    head = f"id: {event_id}\n".encode() if event_id is not None else b""
    return head + b"data: " + json.dumps(message).encode() + b"\n\n"


@pytest_asyncio.fixture
async def scripted() -> AsyncIterator[ScriptedServer]:
    server = ScriptedServer()
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        yield server
        server.released.set()


async def call(url: str, key: str) -> dict[str, Any]:
    """POST the call; the gateway's final JSON-RPC message, from JSON or from its stream."""
    body = {
        "jsonrpc": "2.0",
        "id": CALL_ID,
        "method": "tools/call",
        "params": {"name": "create_ticket", "arguments": {}, "_meta": {"idempotencyKey": key}},
    }
    async with (
        asyncio.timeout(60),
        aiohttp.ClientSession() as session,
        session.post(url, json=body, headers=HEADERS) as answer,
    ):
        raw = await answer.read()
        if not answer.content_type.startswith("text/event-stream"):
            return dict(json.loads(raw))
    messages = [json.loads(event.data) for event in SseDecoder().feed(raw)]
    return dict(next(m for m in reversed(messages) if m.get("id") == CALL_ID))


@pytest.mark.parametrize("failure", [CANCELLED, SILENT, CUT])
@pytest.mark.parametrize("form", [JSON, STREAM, RESUMED])
async def test_the_recorded_cause_is_the_real_one(
    gateway_factory: GatewayFactory, scripted: ScriptedServer, form: str, failure: str
) -> None:
    """A -32800, a silence past `timeout` and a cut stream are each recorded as what they
    are (problem type, detail and evidence agree), the call is `unknown`, and its retry
    is not forwarded."""
    scripted.form, scripted.failure = form, failure
    problem_type, cause = CAUSES[failure]
    timeout = SUBJECT_TIMEOUT if failure == SILENT else GENEROUS_TIMEOUT
    route = {"name": "tools", "prefix": PREFIX, "upstream": scripted.url, "kind": "mcp"}
    gateway = await gateway_factory(scripted.url, route={**route, "timeout": timeout})
    key = f"cause-{form}-{failure}"

    refused = (await call(gateway.url + PREFIX, key))["result"]["_meta"]["idempotency"]
    operation = await (await gateway.get(f"/operations/{key}")).json()
    retry = (await call(gateway.url + PREFIX, key))["result"]["_meta"]["idempotency"]

    assert (refused["type"], refused["state"]) == (problem_type, "unknown"), refused
    assert cause in refused["detail"], refused["detail"]
    assert operation["state"] == "unknown"
    assert [item["detail"] for item in operation["evidence"]] == [refused["detail"]]
    for other, (_, words) in CAUSES.items():
        if other != failure:
            assert words not in refused["detail"], refused["detail"]
    assert (retry["type"], retry["state"]) == ("outcome-unknown", "unknown")
    assert (scripted.effects, scripted.posts) == (1, 1)
    assert scripted.resumed_with == (["1"] if form == RESUMED else [])


async def test_the_first_caller_of_a_cancelled_call_reads_what_happened_to_it(
    gateway_factory: GatewayFactory, scripted: ScriptedServer
) -> None:
    """After a server's -32800 the first caller read "An earlier attempt of this call was
    sent", the retry's sentence. It now reads that the server cancelled its call, which
    may have taken effect; the retry still reads of the earlier attempt."""
    scripted.form, scripted.failure = JSON, CANCELLED
    route = {"name": "tools", "prefix": PREFIX, "upstream": scripted.url, "kind": "mcp"}
    gateway = await gateway_factory(scripted.url, route={**route, "timeout": GENEROUS_TIMEOUT})
    first = (await call(gateway.url + PREFIX, "cancelled-1"))["result"]
    retry = (await call(gateway.url + PREFIX, "cancelled-1"))["result"]
    (first_text,) = [part["text"] for part in first["content"]]
    (retry_text,) = [part["text"] for part in retry["content"]]
    assert first["_meta"]["idempotency"]["type"] == "outcome-unknown"
    assert "earlier attempt" not in first_text
    assert first_text.startswith("The tool's server cancelled this call"), first_text
    assert "Do not call it again" in first_text
    assert retry_text.startswith("An earlier attempt of this call was sent"), retry_text
