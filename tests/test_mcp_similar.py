"""The same tool call under a new key, on an MCP route: refused while the first is unsettled.

The case that was measured making two tickets: a `slow_ticket` call in flight
and the same call (same tool, same arguments) under a new key from a second
session. Through a real gateway in front of the counting MCP server, with the
official SDK's client: the second call gets an `isError` result naming the
first call's key and the status tool, nothing is sent, and the marker
`_meta.idempotencyDistinct: true` is the way to mean a second ticket.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from conftest import GatewayFactory
from harness import RunningGateway
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client

PREFIX = "/tools"
SLOW = {"title": "printer on fire", "seconds": 3}


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


async def _gateway(
    gateway_factory: GatewayFactory, server: CountingMcpServer, **route: Any
) -> RunningGateway:
    return await gateway_factory(
        server.url,
        route={
            "name": "tools",
            "prefix": PREFIX,
            "upstream": server.url,
            "kind": "mcp",
            "status_tool": "operation_status",
            **route,
        },
    )


async def test_the_same_call_from_a_second_session_under_a_new_key_is_not_sent(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    gateway = await _gateway(gateway_factory, server)
    url = gateway.url + PREFIX
    async with mcp_client(url) as first, mcp_client(url) as second:
        running = asyncio.ensure_future(call_with_key(first, "slow_ticket", SLOW, "run-1:0:c1"))
        await server.wait_for_count(1, seconds=30)

        refused = await call_with_key(second, "slow_ticket", SLOW, "run-2:0:c1")
        assert refused.is_error is True
        assert refused.meta is not None
        meta = refused.meta["idempotency"]
        assert meta["type"] == "similar-operation"
        assert meta["next_action"] == "reconcile"
        assert meta["similar_operation"]["key"] == "run-1:0:c1"
        assert meta["similar_operation"]["state"] == "in_flight"
        [content] = refused.content
        assert content.type == "text"
        assert '"run-1:0:c1"' in content.text
        assert "operation_status" in content.text
        assert "distinct" not in content.text.lower()

        answered = await running
        assert answered.is_error is not True
        # The status tool answers for the first call's key, in the caller's scope.
        status = await call_with_key(second, "operation_status", {"key": "run-1:0:c1"}, None)
        assert status.is_error is not True
    assert len(server.tickets) == 1


async def test_the_distinct_marker_makes_a_second_ticket_and_is_not_forwarded(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    gateway = await _gateway(gateway_factory, server)
    url = gateway.url + PREFIX
    async with mcp_client(url) as client:
        running = asyncio.ensure_future(call_with_key(client, "slow_ticket", SLOW, "d-1"))
        await server.wait_for_count(1, seconds=30)
        second = await call_with_key(
            client, "slow_ticket", SLOW, "d-2", meta={"idempotencyDistinct": True}
        )
        assert second.is_error is not True
        await running
    assert len(server.tickets) == 2
    assert all("idempotencyDistinct" not in effect.meta for effect in server.effects)


async def test_a_malformed_distinct_marker_is_invalid_params(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    gateway = await _gateway(gateway_factory, server)
    async with gateway.session.post(
        gateway.url + PREFIX,
        json={
            "jsonrpc": "2.0",
            "id": 3,
            "method": "tools/call",
            "params": {
                "name": "create_ticket",
                "arguments": {"title": "x"},
                "_meta": {"idempotencyKey": "m-1", "idempotencyDistinct": "yes"},
            },
        },
        headers={
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": "2026-07-28",
        },
    ) as response:
        body = await response.json(content_type=None)
    assert body["error"]["code"] == -32602
    assert "idempotencyDistinct" in body["error"]["message"]
    assert server.effects == []


async def test_a_derived_key_is_not_guarded_but_is_a_twin_of_an_explicit_one(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """With `derive_key`, a keyless call gets its key from its arguments: never refused
    as similar; an explicit key for the same call while it runs is."""
    gateway = await _gateway(gateway_factory, server, derive_key="arguments")
    url = gateway.url + PREFIX
    async with mcp_client(url) as first, mcp_client(url) as second:
        running = asyncio.ensure_future(call_with_key(first, "slow_ticket", SLOW, None))
        await server.wait_for_count(1, seconds=30)
        explicit = await call_with_key(second, "slow_ticket", SLOW, "e-1")
        assert explicit.is_error is True
        assert explicit.meta is not None
        twin = explicit.meta["idempotency"]["similar_operation"]
        assert twin["key"].startswith("d:")
        await running
    assert len(server.tickets) == 1


async def test_a_refusal_after_the_twin_completed_says_it_took_effect(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> None:
    """The same call under key 2 is refused while key 1's call runs; asked again once key
    1's call completed, the refusal no longer says "has not finished or its outcome is
    unknown": it says the earlier call took effect, and still names it."""
    gateway = await _gateway(gateway_factory, server)
    url = gateway.url + PREFIX
    async with mcp_client(url) as first, mcp_client(url) as second:
        running = asyncio.ensure_future(call_with_key(first, "slow_ticket", SLOW, "tw-1:0:c1"))
        await server.wait_for_count(1, seconds=30)
        early = await call_with_key(second, "slow_ticket", SLOW, "tw-2:0:c1")
        await running
        late = await call_with_key(second, "slow_ticket", SLOW, "tw-2:0:c1")
    (early_text,) = [part.text for part in early.content if part.type == "text"]
    (late_text,) = [part.text for part in late.content if part.type == "text"]
    assert "has not finished or its outcome is unknown" in early_text
    assert late.is_error is True
    assert late.meta is not None
    assert late.meta["idempotency"]["similar_operation"]["state"] == "completed"
    assert "not finished" not in late_text
    assert "already took effect" in late_text
    assert '"tw-1:0:c1"' in late_text
    assert len(server.tickets) == 1
