"""MCP routes end to end: the official MCP client, the gateway, the official MCP server.

Real software on both sides (the `mcp` SDK's Streamable HTTP client and
server, see tests/mcp_upstream.py), real HTTP between them, and a server that
counts effects: at most one effect per key, whatever the client retries.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web
from conftest import GatewayFactory
from harness import RunningGateway
from mcp.shared.exceptions import MCPError
from mcp_upstream import (
    ACCEPT_BOTH,
    INITIALIZE,
    MODERN,
    CountingMcpServer,
    ProgressLog,
    call_with_key,
    mcp_client,
)

PREFIX = "/tools"
TIMEOUT = 20


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


def mcp_route(server: CountingMcpServer, **options: Any) -> dict[str, Any]:
    return {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp", **options}


async def gateway_for(
    gateway_factory: GatewayFactory, server: CountingMcpServer, **options: Any
) -> RunningGateway:
    return await gateway_factory(server.url, route=mcp_route(server, **options))


async def lost_then_retried(url: str, key: str) -> tuple[Any, Any]:
    """A call whose connection drops after the tool's effect, then its retry on a new
    session: both results."""
    async with asyncio.timeout(TIMEOUT):
        async with mcp_client(url) as client:
            lost = await call_with_key(client, "lose_connection", {"title": "x"}, key)
        async with mcp_client(url) as client:
            retry = await call_with_key(client, "lose_connection", {"title": "x"}, key)
    return lost, retry


def meta(result: Any) -> dict[str, Any]:
    return dict(result.meta or {})


async def test_a_keyed_call_runs_once_and_its_retry_on_a_new_session_is_replayed(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """initialize, tools/list and a call pass the gateway; the same call again, on a new
    session with a new JSON-RPC id, gets the stored result and the tool runs once."""
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT):
        async with mcp_client(url) as client:
            tools = await client.list_tools()
            assert "create_ticket" in {tool.name for tool in tools.tools}
            first = await call_with_key(client, "create_ticket", {"title": "Printer"}, "run-1:0:c1")
        async with mcp_client(url) as client:
            await client.call_tool("lookup_ticket", {"id": "T-1"})  # a new id sequence
            again = await call_with_key(client, "create_ticket", {"title": "Printer"}, "run-1:0:c1")
    assert server.count == 1
    assert first.is_error is False
    assert again.structured_content == first.structured_content
    assert meta(again).get("idempotencyReplayed") is True
    assert "idempotencyReplayed" not in meta(first)
    lookup = await gateway.get("/operations/run-1:0:c1")
    operation = await lookup.json()
    assert (operation["state"], operation["method"], operation["path"]) == (
        "completed",
        "tools/call",
        "create_ticket",
    )
    # The server saw the forwarded key (the operation id), never the caller's.
    assert server.effects[0].meta.get("idempotencyKey") == operation["id"]


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_replays_come_in_either_answer_form(
    gateway_factory: GatewayFactory, json_response: bool
) -> None:
    """A server that answers JSON or an event stream: the receipt is the JSON-RPC response
    either way, and the retry is replayed."""
    async with CountingMcpServer(json_response=json_response) as server:
        gateway = await gateway_for(gateway_factory, server)
        async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
            first = await call_with_key(client, "create_ticket", {"title": "a"}, "form-1")
            again = await call_with_key(client, "create_ticket", {"title": "a"}, "form-1")
        assert server.count == 1
        assert again.structured_content == first.structured_content
        assert meta(again)["idempotencyReplayed"] is True


async def test_progress_reaches_the_client_before_the_answer(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """A progress event sent 1 s before the answer arrives about 1 s before it: the
    gateway streams a protected call's events as they come."""
    gateway = await gateway_for(gateway_factory, server)
    progress = ProgressLog()
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        result = await call_with_key(
            client,
            "notify_then_ticket",
            {"title": "p", "seconds": 1.0},
            "progress-1",
            progress=progress,
        )
        answered = time.monotonic()
    assert result.is_error is False
    assert progress.events, "no progress notification reached the client"
    assert answered - progress.events[0][0] > 0.6
    assert server.count == 1


async def test_a_lost_answer_is_unknown_and_the_retry_is_refused_as_a_tool_result(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """The tool applies its effect and the connection drops: `unknown`. The retry, on a
    new session with a new id, gets an isError result naming outcome-unknown; the tool is
    not run again. Resolved applied with a tool result, the next retry replays it."""
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    lost, retry = await lost_then_retried(url, "lost-1")
    assert server.count == 1
    for result in (lost, retry):
        assert result.is_error is True
        state = meta(result)["idempotency"]
        assert state["state"] == "unknown"
        assert state["safe_to_retry"] is False
    assert meta(retry)["idempotency"]["type"] == "outcome-unknown"
    assert "Do not call it again" in retry.content[0].text  # type: ignore[union-attr]
    operation = await (await gateway.get("/operations/lost-1")).json()
    assert operation["state"] == "unknown"
    assert "response" not in operation

    # The owner found the ticket: resolved applied with the tool result to replay.
    wrong = await gateway.session.post(
        f"{gateway.url}/operations/lost-1/resolve",
        json={"outcome": "applied", "response": {"status": 200}},
    )
    assert wrong.status == 400
    found = {
        "content": [{"type": "text", "text": "T-1 exists"}],
        "structuredContent": {"id": "T-1", "title": "x"},  # the tool's output schema wants it
        "isError": False,
    }
    resolved = await gateway.session.post(
        f"{gateway.url}/operations/lost-1/resolve",
        json={"outcome": "applied", "result": found, "note": "seen in the tool"},
    )
    assert resolved.status == 200, await resolved.text()
    document = await resolved.json()
    assert (document["state"], document["result"]) == ("completed", found)
    async with asyncio.timeout(TIMEOUT), mcp_client(url) as client:
        replayed = await call_with_key(client, "lose_connection", {"title": "x"}, "lost-1")
    assert replayed.is_error is False
    assert replayed.content[0].text == "T-1 exists"  # type: ignore[union-attr]
    assert meta(replayed)["idempotencyReplayed"] is True
    assert server.count == 1


async def test_a_lost_answer_names_its_operation_as_the_retry_does(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """The isError result of the lost call itself carries the operation's lookup URL and id
    in `_meta.idempotency`, as the retry's outcome-unknown result does."""
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    lost, retry = await lost_then_retried(url, "lost-named")
    operation = await (await gateway.get("/operations/lost-named")).json()

    assert meta(lost)["idempotency"]["type"] == "upstream-connection-lost"
    assert meta(retry)["idempotency"]["type"] == "outcome-unknown"
    for result in (lost, retry):
        state = meta(result)["idempotency"]
        assert state["operation"] == "/operations/lost-named"
        assert state["operation_id"] == operation["id"]
    assert server.count == 1


async def test_a_key_reused_for_other_arguments_is_refused(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    gateway = await gateway_for(gateway_factory, server)
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        await call_with_key(client, "create_ticket", {"title": "a"}, "reused")
        other = await call_with_key(client, "create_ticket", {"title": "b"}, "reused")
    assert other.is_error is True
    assert meta(other)["idempotency"]["type"] == "key-mismatch"
    assert server.count == 1


async def test_a_slow_tool_and_a_client_that_times_out_and_retries_make_one_effect(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """The client gives up after 0.5 s and sends notifications/cancelled, which the
    gateway holds back (it proves nothing); the tool finishes at 1.5 s. The retry, on a
    new session, waits for the outcome and gets the receipt. (The first client leaves its
    session open: a session ended by DELETE ends its calls on the server, and the call
    is then `unknown`, which test_a_lost_answer... covers.)"""
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    arguments = {"title": "slow", "seconds": 1.5}
    async with asyncio.timeout(TIMEOUT):
        async with mcp_client(url, terminate_on_close=False) as client:
            with pytest.raises(MCPError):
                await call_with_key(client, "slow_ticket", arguments, "slow-1", read_timeout=0.5)
            await asyncio.sleep(0.5)  # the client's notifications/cancelled goes out meanwhile
        async with mcp_client(url) as client:
            retry = await call_with_key(client, "slow_ticket", arguments, "slow-1")
    assert retry.is_error is False, retry
    assert server.count == 1
    methods = [e.json.get("method") for e in server.requests if isinstance(e.json, dict)]
    assert "notifications/cancelled" not in methods  # held back by the gateway


async def test_calls_without_a_key_pass_through_unrecorded_by_default(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """Without require_key (the MCP default), a key-less call is not recorded."""
    gateway = await gateway_for(gateway_factory, server)
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        await call_with_key(client, "create_ticket", {"title": "a"}, None)
        await call_with_key(client, "create_ticket", {"title": "a"}, None)
    assert server.count == 2


async def test_require_key_refuses_key_less_calls_but_read_only_tools_pass(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """With require_key, a key-less call to a tool the server marks read-only still
    passes; one to any other tool is refused before it reaches the server."""
    gateway = await gateway_for(gateway_factory, server, require_key=True)
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        await client.list_tools()  # the gateway learns the read-only hints from this answer
        read = await client.call_tool("lookup_ticket", {"id": "T-1"})
        with pytest.raises(MCPError) as refused:
            await call_with_key(client, "create_ticket", {"title": "b"}, None)
    assert "idempotency key" in str(refused.value)
    assert read.is_error is True  # no such ticket: the tool's own answer, not a refusal
    assert "idempotency" not in meta(read)
    assert server.count == 0


async def test_derived_keys_dedupe_a_retry_within_their_retention(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """derive_key = "arguments": a key-less retry of the same call is the same operation."""
    gateway = await gateway_for(gateway_factory, server, derive_key="arguments")
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        first = await call_with_key(client, "create_ticket", {"title": "d"}, None)
        again = await call_with_key(client, "create_ticket", {"title": "d"}, None)
        other = await call_with_key(client, "create_ticket", {"title": "e"}, None)
    assert server.count == 2
    assert meta(again)["idempotencyReplayed"] is True
    assert again.structured_content == first.structured_content
    assert other.is_error is False
    effect_keys = {effect.meta.get("idempotencyKey") for effect in server.effects}
    assert len(effect_keys) == 2  # the forwarded keys: one operation id per call


async def test_the_stateless_protocol_generation_is_protected_too(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """2026-07-28 (no session, Mcp-Method/Mcp-Name headers): same key, one effect."""
    gateway = await gateway_for(gateway_factory, server)
    async with asyncio.timeout(TIMEOUT):
        for _ in range(2):
            async with mcp_client(gateway.url + PREFIX, mode=MODERN) as client:
                result = await call_with_key(client, "create_ticket", {"title": "m"}, "modern-1")
                assert result.is_error is False
    assert server.count == 1


async def test_malformed_messages_get_json_rpc_errors_not_problem_json(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    gateway = await gateway_for(gateway_factory, server)
    url = gateway.url + PREFIX
    cases = [
        (b"{not json", -32700),
        (b'[{"jsonrpc":"2.0","id":1,"method":"tools/list"}]', -32600),
        (b'{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/list"}', -32600),
        (
            b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_ticket",'
            b'"arguments":{"title":"x"},"_meta":{"idempotencyKey":""}}}',
            -32602,
        ),
    ]
    async with aiohttp.ClientSession() as session:
        for body, code in cases:
            async with session.post(
                url, data=body, headers={"Content-Type": "application/json"}
            ) as response:
                assert response.status == 400, body
                assert response.content_type == "application/json"
                document = await response.json()
                assert document["error"]["code"] == code, (body, document)
    assert server.count == 0


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


CLIENTS = [
    {"name": "agent-a", "token_sha256": [sha256("tok-a")]},
    {"name": "agent-b", "token_sha256": [sha256("tok-b")]},
]
ACCEPT = ACCEPT_BOTH


async def test_a_session_id_works_only_for_the_client_that_opened_it(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """With [[clients]], agent-a's session id carries a tag of agent-a's scope: agent-b
    presenting it gets 404 and nothing reaches the server; agent-a's client works."""
    gateway = await gateway_factory(server.url, route=mcp_route(server), clients=CLIENTS)
    url = gateway.url + PREFIX
    agent_a = {**ACCEPT, "Authorization": "Bearer tok-a"}
    agent_b = {**ACCEPT, "Authorization": "Bearer tok-b"}
    async with aiohttp.ClientSession() as session:
        async with session.post(url, json=INITIALIZE, headers=agent_a) as opened:
            assert opened.status == 200
            tagged = opened.headers["Mcp-Session-Id"]
        server_session = server.requests[-1].response_headers["mcp-session-id"]
        assert tagged.startswith(server_session + ".")
        seen = len(server.requests)
        listing = {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}
        hijack = {**agent_b, "Mcp-Session-Id": tagged, "MCP-Protocol-Version": "2025-11-25"}
        async with session.post(url, json=listing, headers=hijack) as refused:
            assert refused.status == 404
            assert (await refused.json())["error"]["message"] == "Session not found"
        assert len(server.requests) == seen
    async with (
        asyncio.timeout(TIMEOUT),
        mcp_client(url, headers={"Authorization": "Bearer tok-a"}) as client,
    ):
        result = await call_with_key(client, "create_ticket", {"title": "a"}, "tagged-1")
    assert result.is_error is False
    assert server.count == 1
    assert server.effects[0].session_id is not None
    assert "." not in server.effects[0].session_id  # the server saw its own id, untagged


async def test_a_derived_key_is_forgotten_after_its_retention(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """The same key-less call made after derived_key_retention is a new effect."""
    gateway = await gateway_for(
        gateway_factory, server, derive_key="arguments", derived_key_retention="1s"
    )
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        first = await call_with_key(client, "create_ticket", {"title": "later"}, None)
        await asyncio.sleep(1.3)
        later = await call_with_key(client, "create_ticket", {"title": "later"}, None)
    assert first.is_error is False
    assert later.is_error is False, later
    assert "idempotencyReplayed" not in meta(later)
    assert server.count == 2


async def test_an_unknown_session_releases_the_key(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """The server's 404 for a session it does not know proves the call was not
    processed: the key is released and the 404 passes through as the server sent it."""
    gateway = await gateway_for(gateway_factory, server)
    body = {
        "jsonrpc": "2.0",
        "id": 4,
        "method": "tools/call",
        "params": {
            "name": "create_ticket",
            "arguments": {"title": "s"},
            "_meta": {"idempotencyKey": "stale-session"},
        },
    }
    headers = {**ACCEPT, "Mcp-Session-Id": "no-such-session", "MCP-Protocol-Version": "2025-11-25"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(gateway.url + PREFIX, json=body, headers=headers) as answer,
    ):
        assert answer.status == 404
        assert answer.headers["Idempotency-Status"] == "released"
    operation = await (await gateway.get("/operations/stale-session")).json()
    assert operation["state"] == "released"
    assert server.count == 0
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        result = await call_with_key(client, "create_ticket", {"title": "s"}, "stale-session")
    assert result.is_error is False
    assert server.count == 1


async def test_the_status_tool_answers_from_the_store_in_the_callers_scope(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """status_tool = "operation_status": listed with the server's tools, answered by the
    gateway (never forwarded) by key, or by tool and arguments for a derived key."""
    gateway = await gateway_for(
        gateway_factory, server, status_tool="operation_status", derive_key="arguments"
    )
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert "create_ticket" in tools
        assert tools["operation_status"].annotations.read_only_hint is True  # type: ignore[union-attr]
        await call_with_key(client, "create_ticket", {"title": "a"}, "known-1")
        await call_with_key(client, "lose_connection", {"title": "b"}, "lost-2")
        await call_with_key(client, "create_ticket", {"title": "derived"}, None)
        done = await client.call_tool("operation_status", {"key": "known-1"})
        lost = await client.call_tool("operation_status", {"key": "lost-2"})
        derived = await client.call_tool(
            "operation_status", {"tool": "create_ticket", "arguments": {"title": "derived"}}
        )
        never = await client.call_tool("operation_status", {"key": "never-used"})
    assert done.structured_content is not None
    assert done.structured_content["state"] == "completed"
    assert done.structured_content["result"]["structuredContent"]["title"] == "a"
    assert lost.structured_content is not None
    assert lost.structured_content["state"] == "unknown"
    assert "Do not call it again" in lost.content[0].text  # type: ignore[union-attr]
    assert derived.structured_content is not None
    assert derived.structured_content["state"] == "completed"
    assert never.structured_content == {"key": "never-used", "state": None}
    assert "operation_status" not in {call.tool for call in server.calls_seen}
    assert server.count == 3


async def test_the_status_tool_finds_a_call_made_under_an_explicit_key(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """Asked with {tool, arguments} about a call made under an explicit key (whose answer
    was lost: unknown), the status tool finds it by the call itself and names its key,
    instead of saying it was never made (an agent believing that calls again under a new
    key: a second effect). "Never made" is said only of calls it has no record of, and
    only for the span the gateway remembers them."""
    gateway = await gateway_for(gateway_factory, server, status_tool="operation_status")
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        await call_with_key(client, "lose_connection", {"title": "pay 7", "n": 1}, "explicit-1")
        found = await client.call_tool(
            "operation_status",
            {"tool": "lose_connection", "arguments": {"n": 1.0, "title": "pay 7"}},
        )
        never = await client.call_tool(
            "operation_status", {"tool": "lose_connection", "arguments": {"title": "other"}}
        )
    assert found.structured_content is not None
    assert found.structured_content["key"] == "explicit-1"
    assert found.structured_content["state"] == "unknown"
    assert "Do not call it again" in found.content[0].text  # type: ignore[union-attr]
    assert never.structured_content == {"key": None, "state": None}
    text = never.content[0].text  # type: ignore[union-attr]
    assert "was made through this gateway" in text
    assert "in the last 30 days" in text
    assert server.count == 1


FORGED_META = {"idempotencyReplayed": True, "idempotency": {"state": "completed"}, "kept": 1}


async def forging_server(stream: bool) -> tuple[web.AppRunner, str]:
    """An MCP-shaped server whose every tool result claims to be a gateway replay."""

    async def answer(request: web.Request) -> web.StreamResponse:
        call = await request.json()
        document = {
            "jsonrpc": "2.0",
            "id": call["id"],
            "result": {"content": [], "isError": False, "_meta": FORGED_META},
        }
        if not stream:
            return web.json_response(document)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write(b"id: e-1\ndata: " + json.dumps(document).encode() + b"\n\n")
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_post("/mcp", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/mcp"


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
async def test_a_server_cannot_forge_the_gateways_meta_keys(
    gateway_factory: GatewayFactory, stream: bool
) -> None:
    """_meta.idempotencyReplayed and _meta.idempotency are the gateway's: removed from a
    server's answers, protected or not; the server's other _meta keys stay."""
    runner, url = await forging_server(stream)
    try:
        gateway = await gateway_factory(url, route={**ROUTE_KEYS, "upstream": url})
        call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "t"}}
        keyed = {**call, "params": {"name": "t", "_meta": {"idempotencyKey": "forge-1"}}}
        async with aiohttp.ClientSession() as session:
            for body in (call, keyed):
                async with session.post(gateway.url + PREFIX, json=body, headers=ACCEPT) as got:
                    text = await got.text()
                    data = text.split("data: ", 1)[1] if stream and "data: " in text else text
                    assert json.loads(data)["result"]["_meta"] == {"kept": 1}, text
    finally:
        await runner.cleanup()


ROUTE_KEYS = {"name": "tools", "prefix": PREFIX, "kind": "mcp"}


async def test_a_saturated_route_refuses_with_its_retry_hint(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """At max_concurrency the next call is refused before anything is recorded: a tool
    result marked safe to retry, with the Retry-After hint in _meta and in the header,
    naming the call's key and its lookup URL."""
    gateway = await gateway_for(gateway_factory, server, max_concurrency=1)
    url = gateway.url + PREFIX
    async with asyncio.timeout(TIMEOUT), mcp_client(url) as client:
        slow = asyncio.create_task(
            call_with_key(client, "slow_ticket", {"title": "s", "seconds": 1.0}, "busy-1")
        )
        await server.wait_for_count(1)
        refused = await call_with_key(client, "create_ticket", {"title": "t"}, "busy-2")
        await slow
    state = meta(refused)["idempotency"]
    assert refused.is_error is True
    assert (state["type"], state["safe_to_retry"], state["retry_after"]) == (
        "route-saturated",
        True,
        1,
    )
    assert (state["key"], state["operation"]) == ("busy-2", "/operations/busy-2")
    assert "state" not in state
    assert server.count == 1
    missing = await gateway.get("/operations/busy-2")
    assert missing.status == 404  # nothing was recorded


async def test_a_derived_key_always_forwards_the_operation_id(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """Even on a route that forwards callers' keys as they came, a derived operation
    forwards its operation id: the derived key names arguments, not a chosen effect."""
    gateway = await gateway_factory(
        server.url,
        route=mcp_route(server, derive_key="arguments", forward_key="key"),
        idempotency={"scope_headers": [], "shared_scope": True},
    )
    async with asyncio.timeout(TIMEOUT), mcp_client(gateway.url + PREFIX) as client:
        await call_with_key(client, "create_ticket", {"title": "derived"}, None)
        await call_with_key(client, "create_ticket", {"title": "chosen"}, "chosen-1")
    derived, chosen = (effect.meta.get("idempotencyKey") for effect in server.effects)
    assert str(derived).startswith("op_")
    assert chosen == "chosen-1"
