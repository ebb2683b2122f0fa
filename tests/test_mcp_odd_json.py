"""JSON the gateway's parser cannot read, on an MCP route: an answer, never a crash.

Python refuses numbers of 4,300 digits or more and nesting deeper than its
recursion limit. A client's request holding them is a JSON-RPC error (never
HTTP 500 or problem+json, which the SDKs cannot read), and nothing is recorded
or sent. A server's *answer* holding them was sent by a tool that ran: it is
the receipt, kept as the bytes received and replayed under the retry's id,
never lost and never `unknown` only because the gateway could not read it.
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
from harness import RunningGateway
from upstream import serve_mcp_handlers

PREFIX = "/tools"
BIG = "7" * 5000
DEEP = "[" * 50_000 + "]" * 50_000
ESCAPES = '{"x":"\\\\ \\"}\\" ]","n":' + BIG + "}"
"""Escaped quotes and backslashes and brackets inside a string, beside a long number."""
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "Authorization": "Bearer odd-json",
}


def call(key: str, arguments: str = "{}", *, call_id: str = "1", meta: str = "") -> str:
    return (
        f'{{"jsonrpc":"2.0","id":{call_id},"method":"tools/call","params":{{"name":"t",'
        f'"arguments":{arguments},"_meta":{{{meta}"idempotencyKey":"{key}"}}}}}}'
    )


@dataclass
class ScriptedServer:
    """An MCP server whose every tools/call answer holds `payload` in its result (as
    JSON or as one SSE event); it counts the calls that reached it."""

    payload: str = BIG
    stream: bool = False
    error: str | None = None
    calls: list[Any] = field(default_factory=list)
    url: str = ""

    async def post(self, request: web.Request) -> web.StreamResponse:
        # The server reads only the id (the gateway's forwarded body is plain JSON).
        document = json.loads(await request.text())
        self.calls.append(document)
        if self.error is not None:
            member = f'"error":{self.error}'
        else:
            member = f'"result":{{"content":[],"structuredContent":{{"n":{self.payload}}}}}'
        body = f'{{"jsonrpc":"2.0","id":{json.dumps(document["id"])},{member}}}'
        if not self.stream:
            return web.Response(text=body, content_type="application/json")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(f"event: message\ndata: {body}\n\n".encode())
        await response.write_eof()
        return response

    async def get(self, request: web.Request) -> web.Response:
        return web.Response(status=405)


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def gateway_in_front(factory: GatewayFactory, server: ScriptedServer) -> RunningGateway:
    route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
    return await factory(server.url, route=route)


async def post(
    http: aiohttp.ClientSession, gateway: RunningGateway, body: str | bytes, **headers: str
) -> tuple[int, str, bytes]:
    async with http.post(gateway.url + PREFIX, data=body, headers={**HEADERS, **headers}) as answer:
        return answer.status, answer.headers.get("Content-Type", ""), await answer.read()


async def state_of(gateway: RunningGateway, key: str) -> str | None:
    answer = await gateway.get(f"/operations/{key}", headers={"Authorization": "Bearer odd-json"})
    if answer.status == 404:
        return None
    document = await answer.json()
    return str(document["state"])


REFUSED_REQUESTS = {
    "a 5,000-digit integer argument": (call("k-big", f'{{"n":{BIG}}}'), -32700, "k-big"),
    "a 5,000-digit id": (call("k-id", call_id=BIG), -32700, "k-id"),
    "a 5,000-digit number in _meta": (call("k-meta", meta=f'"n":{BIG},'), -32700, "k-meta"),
    "nesting 50,000 deep": (call("k-deep", f'{{"n":{DEEP}}}'), -32700, "k-deep"),
    "a float too large for a double": (call("k-float", '{"n":1e400}'), -32700, "k-float"),
    "UTF-16": (call("k-utf16").encode("utf-16"), -32700, "k-utf16"),
    "a byte-order mark": (b"\xef\xbb\xbf" + call("k-bom").encode(), -32700, "k-bom"),
    "Latin-1 bytes": (call("k-latin", '{"a":"\xe9"}').encode("latin-1"), -32700, "k-latin"),
    "a lone surrogate in the arguments": (call("k-sur", '{"a":"\\ud800"}'), -32602, "k-sur"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_REQUESTS))
async def test_a_request_the_parser_cannot_read_is_a_json_rpc_error_and_nothing_is_sent(
    gateway_factory: GatewayFactory, http: aiohttp.ClientSession, case: str
) -> None:
    body, code, key = REFUSED_REQUESTS[case]
    server = ScriptedServer()
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        gateway = await gateway_in_front(gateway_factory, server)
        status, content_type, answer = await post(http, gateway, body)
        assert status == 400, answer[:200]
        assert content_type.startswith("application/json")
        error = json.loads(answer)["error"]
        assert error["code"] == code
        assert server.calls == []
        assert await state_of(gateway, key) is None


async def test_a_lone_surrogate_outside_the_arguments_goes_through_escaped(
    gateway_factory: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """JSON lets a client escape a lone surrogate; it has no UTF-8 form, so the gateway
    sends it on escaped, as the client wrote it, instead of failing to encode it."""
    server = ScriptedServer(payload="1")
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        gateway = await gateway_in_front(gateway_factory, server)
        status, _, answer = await post(http, gateway, call("k-s", meta='"x":"\\udc00",'))
        assert status == 200, answer[:200]
        assert server.calls[0]["params"]["_meta"]["x"] == "\udc00"
        assert await state_of(gateway, "k-s") == "completed"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
@pytest.mark.parametrize("payload", [BIG, DEEP, ESCAPES], ids=["long", "deep", "escapes"])
async def test_an_answer_the_parser_cannot_read_is_the_receipt_kept_as_bytes(
    gateway_factory: GatewayFactory, http: aiohttp.ClientSession, stream: bool, payload: str
) -> None:
    server = ScriptedServer(payload=payload, stream=stream)
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        gateway = await gateway_in_front(gateway_factory, server)
        status, _, first = await post(http, gateway, call("k-ans", call_id='"first"'))
        assert status == 200
        assert payload in first.decode()
        assert first.decode().startswith('{"jsonrpc":"2.0","id":"first",') or stream
        assert await state_of(gateway, "k-ans") == "completed"

        status, _, again = await post(
            http,
            gateway,
            call("k-ans", call_id="2"),
            Accept="application/json",
            **{"MCP-Protocol-Version": "2026-07-28"},
        )
        assert status == 200
        text = again.decode()
        assert text.startswith('{"jsonrpc":"2.0","id":2,"result":{"content":[],')
        assert payload in text
        assert text.endswith(',"_meta":{"idempotencyReplayed":true},"resultType":"complete"}}')
        assert len(server.calls) == 1


async def test_an_unreadable_cancellation_is_still_a_cancellation(
    gateway_factory: GatewayFactory, http: aiohttp.ClientSession
) -> None:
    """A server's -32800 whose data the parser cannot read: not a receipt, `unknown`."""
    server = ScriptedServer(error=f'{{"code":-32800,"message":"cancelled","data":{BIG}}}')
    async with serve_mcp_handlers(server.post, server.get) as server.url:
        gateway = await gateway_in_front(gateway_factory, server)
        status, _, answer = await post(http, gateway, call("k-cancel"))
        assert status == 200
        assert json.loads(answer)["result"]["_meta"]["idempotency"]["type"] == "outcome-unknown"
        assert await state_of(gateway, "k-cancel") == "unknown"
