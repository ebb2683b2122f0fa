"""The counting MCP server does what gateway tests need, seen through the official client.

No gateway here: the SDK's Streamable HTTP client talks to ``CountingMcpServer``
on loopback, so a later failure behind the gateway cannot be the harness's.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING

import httpx2
import pytest
from mcp import Client
from mcp.shared.exceptions import MCPError
from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT, TextContent
from mcp_upstream import (
    INITIALIZE,
    MODERN,
    CountingMcpServer,
    HttpExchange,
    ProgressLog,
    call_with_key,
    mcp_client,
)

from examples.mcp_server import create_server

if TYPE_CHECKING:
    from collections.abc import AsyncIterator

LIMIT = 5.0
"""Seconds any one test may take; every test body runs under asyncio.timeout(LIMIT)."""

ACCEPT = "application/json, text/event-stream"


@pytest.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    """The default server: sessions, SSE answers."""
    async with CountingMcpServer() as started:
        yield started


def tool_calls(server: CountingMcpServer) -> list[HttpExchange]:
    """The POSTs that carried a tools/call, in arrival order."""
    return [
        exchange
        for exchange in server.requests
        if isinstance(exchange.json, dict) and exchange.json.get("method") == "tools/call"
    ]


async def test_initialize_and_list_tools(server: CountingMcpServer) -> None:
    """The legacy handshake opens a session; tools/list shows every tool, the read-only
    one with readOnlyHint: true; nothing is an effect."""
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        assert client.protocol_version == "2025-11-25"
        listed = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert set(listed) == {
        "create_ticket",
        "slow_ticket",
        "notify_then_ticket",
        "lose_connection",
        "failing_tool",
        "lookup_ticket",
        "send_email",
        "chatty_ticket",
        "large_ticket",
        "until_cancelled",
    }
    annotations = listed["lookup_ticket"].annotations
    assert annotations is not None
    assert annotations.read_only_hint is True
    assert listed["create_ticket"].annotations is None
    initialize = server.requests[0]
    assert initialize.json["method"] == "initialize"
    assert initialize.status == 200
    assert initialize.response_headers is not None
    assert initialize.response_headers["mcp-session-id"]
    assert server.count == 0


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_create_ticket_counts_one_effect(json_response: bool) -> None:
    """One call, one effect, with the _meta.idempotencyKey the client set and the HTTP
    headers of the POST (the session's id, the protocol version, any extra header)."""
    async with (
        asyncio.timeout(LIMIT),
        CountingMcpServer(json_response=json_response) as server,
    ):
        async with mcp_client(server.url, headers={"Idempotency-Key": "k-1"}) as client:
            result = await call_with_key(client, "create_ticket", {"title": "Disk full"}, "k-1")
        assert not result.is_error
        assert result.structured_content == {"id": "T-1", "title": "Disk full"}
        assert server.count == 1
        assert server.count_for("k-1") == 1
        assert server.count_for("k-2") == 0
        effect = server.effects[0]
        assert (effect.number, effect.tool, effect.arguments) == (
            1,
            "create_ticket",
            {"title": "Disk full"},
        )
        assert effect.meta == {"idempotencyKey": "k-1"}
        assert effect.key == "k-1"
        assert effect.headers["idempotency-key"] == "k-1"
        assert server.requests[0].response_headers is not None
        assert effect.session_id == server.requests[0].response_headers["mcp-session-id"]
        assert effect.protocol_version == "2025-11-25"
        (call,) = tool_calls(server)
        assert call.headers["accept"] == ACCEPT
        assert call.content_type == ("application/json" if json_response else "text/event-stream")


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_modern_protocol_has_no_handshake_and_no_session(json_response: bool) -> None:
    """A 2026-07-28 client (what the SDK's default mode="auto" settles on with an SDK 2.x
    server) sends no initialize, gets no session, and stamps every _meta."""
    async with (
        asyncio.timeout(LIMIT),
        CountingMcpServer(json_response=json_response) as server,
    ):
        async with mcp_client(server.url, mode=MODERN) as client:
            result = await call_with_key(client, "create_ticket", {"title": "t"}, "k-1")
        assert result.structured_content == {"id": "T-1", "title": "t"}
        effect = server.effects[0]
        assert effect.key == "k-1"
        assert effect.meta["io.modelcontextprotocol/protocolVersion"] == MODERN
        assert effect.session_id is None
        assert effect.protocol_version == MODERN
        assert effect.headers["mcp-method"] == "tools/call"
        assert effect.headers["mcp-name"] == "create_ticket"
        assert {exchange.method for exchange in server.requests} == {"POST"}
        assert all(exchange.json["method"] != "initialize" for exchange in server.requests)
        # Without a notification to send, even SSE mode answers a short call with JSON.
        assert tool_calls(server)[0].content_type == "application/json"


async def test_stateless_server_issues_no_session() -> None:
    """stateless=True: initialize is answered without Mcp-Session-Id, so the client
    opens no GET stream and sends no DELETE."""
    async with asyncio.timeout(LIMIT), CountingMcpServer(stateless=True) as server:
        async with mcp_client(server.url) as client:
            await call_with_key(client, "create_ticket", {"title": "t"}, "k-1")
        assert server.requests[0].response_headers is not None
        assert "mcp-session-id" not in server.requests[0].response_headers
        assert server.effects[0].session_id is None
        assert {exchange.method for exchange in server.requests} == {"POST"}
        assert server.count_for("k-1") == 1


async def test_progress_reaches_the_client_before_the_answer(server: CountingMcpServer) -> None:
    """notify_then_ticket: the progress notification arrives `seconds` before the answer,
    so it was streamed, not buffered with the response."""
    log = ProgressLog()
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        result = await call_with_key(
            client, "notify_then_ticket", {"title": "t", "seconds": 0.5}, "k-1", progress=log
        )
        answered = time.monotonic()
    assert result.structured_content == {"id": "T-1", "title": "t"}
    ((arrived, progress, total, message),) = log.events
    assert (progress, total, message) == (0, 1, "working")
    assert answered - arrived >= 0.4
    # The SDK asks for progress with _meta.progressToken = the JSON-RPC request id.
    (call,) = tool_calls(server)
    assert server.effects[0].meta == {"idempotencyKey": "k-1", "progressToken": call.json["id"]}


async def test_slow_ticket_applies_the_effect_before_answering(server: CountingMcpServer) -> None:
    """slow_ticket: the effect exists and progress arrived while the call is still open."""
    log = ProgressLog()
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        call = asyncio.create_task(
            call_with_key(
                client, "slow_ticket", {"title": "t", "seconds": 0.5}, "k-1", progress=log
            )
        )
        await server.wait_for_count(1)
        assert not call.done()
        result = await call
    assert result.structured_content == {"id": "T-1", "title": "t"}
    assert [event[1:] for event in log.events] == [(1, 1, "created T-1")]
    assert server.count_for("k-1") == 1


async def test_client_timeout_leaves_the_effect(server: CountingMcpServer) -> None:
    """A client that stops waiting gets MCPError -32001 and POSTs notifications/cancelled;
    the effect already happened, and the session is still usable."""
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        with pytest.raises(MCPError) as info:
            await call_with_key(
                client, "slow_ticket", {"title": "t", "seconds": 3}, "k-1", read_timeout=0.3
            )
        assert info.value.error.code == REQUEST_TIMEOUT
        after = await call_with_key(client, "create_ticket", {"title": "u"}, "k-2")
    assert after.structured_content == {"id": "T-2", "title": "u"}
    assert server.count_for("k-1") == 1
    (timed_out, _) = tool_calls(server)
    cancelled = [
        exchange.json["params"]
        for exchange in server.requests
        if isinstance(exchange.json, dict) and exchange.json["method"] == "notifications/cancelled"
    ]
    assert [params["requestId"] for params in cancelled] == [timed_out.json["id"]]


async def test_lost_connection_on_an_sse_answer(server: CountingMcpServer) -> None:
    """lose_connection with an SSE answer: the stream opened (200, text/event-stream) and
    ended without the response. The SDK resolves the call with MCPError -32000
    (CONNECTION_CLOSED) "SSE stream ended without a response" (the event carried no id,
    so it cannot resume), and the session stays usable. The effect happened once."""
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        with pytest.raises(MCPError) as info:
            await call_with_key(client, "lose_connection", {"title": "t"}, "k-1")
        assert info.value.error.code == CONNECTION_CLOSED
        assert info.value.error.message == "SSE stream ended without a response"
        after = await call_with_key(client, "create_ticket", {"title": "u"}, "k-2")
    assert after.structured_content == {"id": "T-2", "title": "u"}
    assert server.count_for("k-1") == 1
    assert server.count == 2
    (cut,) = [exchange for exchange in server.requests if exchange.cut]
    assert (cut.status, cut.content_type) == (200, "text/event-stream")


@pytest.mark.parametrize("mode", ["legacy", MODERN])
async def test_lost_connection_on_a_json_answer(mode: str) -> None:
    """lose_connection with a JSON answer: the connection closes before any byte of the
    answer. The SDK's transport does not resolve the call: httpx2.RemoteProtocolError
    ("Server disconnected without sending a response.") escapes its task group, the
    pending call is cancelled, and leaving the client raises an ExceptionGroup holding
    it. The client is dead; a retry needs a new one. The effect happened once."""
    async with (
        asyncio.timeout(LIMIT),
        CountingMcpServer(json_response=True) as server,
    ):
        with pytest.raises(ExceptionGroup) as info:
            async with mcp_client(server.url, mode=mode) as client:
                await call_with_key(client, "lose_connection", {"title": "t"}, "k-1")
        assert info.group_contains(httpx2.RemoteProtocolError)
        assert server.count_for("k-1") == 1
        (cut,) = [exchange for exchange in server.requests if exchange.cut]
        assert cut.content_type == "application/json"  # what the server meant to send


async def test_failing_tool_is_a_tool_error_and_an_effect(server: CountingMcpServer) -> None:
    """failing_tool answers a normal result with isError: true (not a JSON-RPC error)."""
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        result = await call_with_key(client, "failing_tool", {}, "k-1")
    assert result.is_error
    assert result.content == [
        TextContent(type="text", text="the ticket system refused the request")
    ]
    assert server.count_for("k-1") == 1


async def test_lookup_ticket_reads_without_an_effect(server: CountingMcpServer) -> None:
    """lookup_ticket finds a created ticket and applies nothing; an unknown id is a tool
    error. Every call that reached a tool is in calls_seen."""
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        await call_with_key(client, "create_ticket", {"title": "t"}, "k-1")
        found = await call_with_key(client, "lookup_ticket", {"id": "T-1"}, "k-2")
        missing = await call_with_key(client, "lookup_ticket", {"id": "T-9"}, None)
    assert found.structured_content == {"id": "T-1", "title": "t"}
    assert missing.is_error
    assert missing.content == [
        TextContent(type="text", text="Error executing tool lookup_ticket: no ticket 'T-9'")
    ]
    assert server.count == 1
    assert [call.tool for call in server.calls_seen] == [
        "create_ticket",
        "lookup_ticket",
        "lookup_ticket",
    ]
    assert [call.key for call in server.calls_seen] == ["k-1", "k-2", None]


async def test_send_email_is_a_second_kind_of_effect(server: CountingMcpServer) -> None:
    async with asyncio.timeout(LIMIT), mcp_client(server.url) as client:
        ticket = await call_with_key(client, "create_ticket", {"title": "t"}, "k-1")
        email = await call_with_key(
            client, "send_email", {"to": "ops@example.com", "subject": "T-1"}, "k-2"
        )
    assert ticket.structured_content == {"id": "T-1", "title": "t"}
    assert email.structured_content == {"id": "E-1", "to": "ops@example.com", "subject": "T-1"}
    assert [(effect.number, effect.tool, effect.key) for effect in server.effects] == [
        (1, "create_ticket", "k-1"),
        (2, "send_email", "k-2"),
    ]


async def test_session_get_stream_and_delete(server: CountingMcpServer) -> None:
    """The client opens the server's GET stream with its session id, and DELETEs the
    session when it closes; the session's id is then refused with 404."""
    async with asyncio.timeout(LIMIT):
        async with mcp_client(server.url) as client:
            await call_with_key(client, "create_ticket", {"title": "t"}, "k-1")
            stream = await server.wait_for_request("GET")
        session_id = server.effects[0].session_id
        assert session_id
        assert stream.headers["mcp-session-id"] == session_id
        assert stream.headers["mcp-protocol-version"] == "2025-11-25"
        assert (stream.status, stream.content_type) == (200, "text/event-stream")
        (delete,) = [exchange for exchange in server.requests if exchange.method == "DELETE"]
        assert delete.headers["mcp-session-id"] == session_id
        assert delete.status == 200
        async with httpx2.AsyncClient() as http:
            response = await http.post(
                server.url,
                json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                headers={
                    "Accept": ACCEPT,
                    "Mcp-Session-Id": session_id,
                    "MCP-Protocol-Version": "2025-11-25",
                },
            )
        assert response.status_code == 404


@pytest.mark.parametrize("json_response", [False, True], ids=["sse", "json"])
async def test_wire_format_of_an_answer(json_response: bool) -> None:
    """What a proxy sees (raw HTTP, no SDK client): SSE answers are `event: message`
    events with CRLF line ends and no `id:` line (no event store, so not resumable);
    JSON answers are one JSON-RPC object with a Content-Length."""
    initialize = INITIALIZE
    async with (
        asyncio.timeout(LIMIT),
        CountingMcpServer(json_response=json_response) as server,
        httpx2.AsyncClient() as http,
    ):
        response = await http.post(server.url, json=initialize, headers={"Accept": ACCEPT})
    assert response.status_code == 200
    assert response.headers["mcp-session-id"]
    if json_response:
        assert response.headers["content-type"] == "application/json"
        assert response.headers["content-length"] == str(len(response.content))
        answer = json.loads(response.content)
    else:
        assert response.headers["content-type"] == "text/event-stream"
        assert response.headers["cache-control"] == "no-cache, no-transform"
        assert response.headers["transfer-encoding"] == "chunked"
        text = response.text
        assert text.startswith("event: message\r\ndata: ")
        assert text.endswith("\r\n\r\n")
        assert text.count("\r\n\r\n") == 1
        assert "\r\nid:" not in text
        answer = json.loads(text.removeprefix("event: message\r\ndata: ").strip())
    assert answer["id"] == 1
    assert answer["result"]["protocolVersion"] == "2025-11-25"


async def test_stop_ends_open_sessions_at_once(caplog: pytest.LogCaptureFixture) -> None:
    """stop() with a client still connected (its GET stream open) ends the session and
    its streams rather than waiting out the graceful-shutdown timeout, without errors."""
    # A shutdown timeout far beyond what a stop takes, even on a loaded machine: a stop that
    # waited it out is told apart from one at once by a factor of 10, not by a second.
    async with (
        asyncio.timeout(LIMIT + 300),
        CountingMcpServer(shutdown_timeout=300) as server,
        mcp_client(server.url) as client,
    ):
        await call_with_key(client, "create_ticket", {"title": "t"}, "k-1")
        await server.wait_for_request("GET")
        started = time.monotonic()
        await server.stop()
        assert time.monotonic() - started < 30
    assert [record for record in caplog.records if record.levelno >= logging.ERROR] == []


async def test_example_server_records_the_key_it_arrived_with() -> None:
    """examples/mcp_server.py (in-process): a retry is a second ticket, each with the
    _meta.idempotencyKey its call carried; list_tickets is read-only."""
    async with asyncio.timeout(LIMIT), Client(create_server(), mode="legacy") as client:
        listed = {tool.name: tool.annotations for tool in (await client.list_tools()).tools}
        for _ in range(2):
            await call_with_key(client, "create_ticket", {"title": "Disk full"}, "op-1")
        tickets = await call_with_key(client, "list_tickets", {}, None)
    assert listed["list_tickets"] is not None
    assert listed["list_tickets"].read_only_hint is True
    assert listed["create_ticket"] is not None
    assert listed["create_ticket"].read_only_hint is False
    assert tickets.structured_content == {
        "items": [
            {"id": "T-1", "title": "Disk full", "idempotency_key": "op-1"},
            {"id": "T-2", "title": "Disk full", "idempotency_key": "op-1"},
        ]
    }
