"""Hostile and malformed bodies on an MCP route: JSON-RPC answers, no crash, no stray effect.

Generated bodies (hypothesis) are POSTed to a gateway MCP route in front of
the official SDK server. Whatever comes in, the gateway answers in JSON-RPC
(or passes the server's answer on), never problem+json and never a 5xx of
its own, stays healthy, and a body that is not a well-formed keyed
`tools/call` of a side-effecting tool makes no effect.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest_asyncio
from conftest import GatewayFactory
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from mcp_upstream import CountingMcpServer
from suite_profile import examples

PREFIX = "/tools"
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=12,
)
params = st.fixed_dictionaries(
    {},
    optional={
        "name": st.sampled_from(["create_ticket", "", "x" * 300]) | st.integers() | st.none(),
        "arguments": json_values,
        "_meta": st.fixed_dictionaries(
            {}, optional={"idempotencyKey": st.text(max_size=300) | st.integers() | st.none()}
        )
        | json_values,
    },
)
messages = st.fixed_dictionaries(
    {},
    optional={
        "jsonrpc": st.sampled_from(["2.0", "1.0"]) | scalars,
        "id": scalars | st.lists(scalars, max_size=2),
        "method": st.sampled_from(["tools/call", "tools/list", "initialize"]) | scalars,
        "params": params | json_values,
    },
)
bodies = (
    messages.map(lambda message: json.dumps(message, allow_nan=True).encode())
    | st.binary(max_size=200)
    | st.lists(messages, max_size=3).map(lambda batch: json.dumps(batch).encode())
)


def is_keyed_ticket_call(body: bytes) -> bool:
    try:
        message: Any = json.loads(body)
    except ValueError:
        return False
    return (
        isinstance(message, dict)
        and message.get("method") == "tools/call"
        and isinstance(message.get("params"), dict)
        and message["params"].get("name") == "create_ticket"
    )


@pytest_asyncio.fixture
async def mcp_gateway(
    gateway_factory: GatewayFactory,
) -> AsyncIterator[tuple[CountingMcpServer, str]]:
    async with CountingMcpServer(stateless=True, json_response=True) as server:
        route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
        gateway = await gateway_factory(server.url, route=route)
        yield server, gateway.url


@settings(
    max_examples=examples(60),
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=list(HealthCheck),
)
@given(body=bodies)
async def test_generated_bodies_get_json_rpc_answers_and_no_stray_effect(
    mcp_gateway: tuple[CountingMcpServer, str], body: bytes
) -> None:
    server, base = mcp_gateway
    before = server.count
    async with (
        aiohttp.ClientSession() as session,
        session.post(base + PREFIX, data=body, headers=HEADERS) as answer,
    ):
        text = await answer.text()
        assert answer.content_type != "application/problem+json", text
        if answer.status >= 500:
            # Only the server's own answer may be a 5xx; the gateway's never.
            assert "idempotency-gateway.dev/problems" not in text, text
    async with aiohttp.ClientSession() as session, session.get(base + "/healthz") as ok:
        assert ok.status == 200
    if server.count != before:
        assert is_keyed_ticket_call(body), body
