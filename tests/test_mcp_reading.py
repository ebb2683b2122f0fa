"""Large MCP messages are read in a helper process, and read exactly as small ones are.

Canonical JSON of a large call's arguments takes long enough to stall every
other caller if it ran on the event loop (`gateway.mcp.reading`). The helper
process must change nothing but where the work runs: the same call, key,
fingerprint and forwarded bytes, the same errors with the same codes.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from conftest import GatewayFactory
from hypothesis import given
from hypothesis import strategies as st
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client

from gateway.mcp.calls import fingerprint_call
from gateway.mcp.jsonrpc import JsonRpcError
from gateway.mcp.reading import MessageReader, PostReading, ReadSpec, forward_body, read_post
from gateway.web.offload import Offloader

SPEC = ReadSpec(route="tools", header_keys=(), status_tool="operation_status")


def tools_call(arguments: Any, meta: dict[str, Any] | None = None, name: str = "t") -> bytes:
    params: dict[str, Any] = {"name": name, "arguments": arguments}
    if meta is not None:
        params["_meta"] = meta
    return json.dumps(
        {"jsonrpc": "2.0", "id": 9, "method": "tools/call", "params": params}
    ).encode()


def same_reading(a: PostReading, b: PostReading) -> None:
    assert (a.message.kind, a.message.id, a.message.method) == (
        b.message.kind,
        b.message.id,
        b.message.method,
    )
    assert (a.call is None) == (b.call is None)
    if a.call is not None and b.call is not None:
        assert (a.call.id, a.call.name, a.call.key) == (b.call.id, b.call.name, b.call.key)
        assert fingerprint_call("tools", a.call) == fingerprint_call("tools", b.call)
    if a.call is not None:
        assert a.forward_body() == b.forward_body()
    assert (a.status_question, a.status_error and a.status_error.code) == (
        b.status_question,
        b.status_error and b.status_error.code,
    )
    assert (a.call_error and a.call_error.code) == (b.call_error and b.call_error.code)


@pytest_asyncio.fixture
async def reader() -> AsyncIterator[MessageReader]:
    """A reader that sends every message to the helper process."""
    offloader = Offloader(large=0, workers=1)
    yield MessageReader(offloader)
    offloader.close()


BODIES = {
    "a call with a key": tools_call({"b": [1, 2], "a": "é"}, {"idempotencyKey": "k-1", "x": 1}),
    "a call without _meta": tools_call({}),
    "a status call by key": tools_call({"key": "k-2"}, name="operation_status"),
    "a status call by tool": tools_call(
        {"tool": "t", "arguments": {"n": 1}}, name="operation_status"
    ),
    "a status call asking nothing": tools_call({}, name="operation_status"),
    "arguments with no canonical form": tools_call({"n": 2**60}),
    "a bad key": tools_call({}, {"idempotencyKey": " spaced"}),
    "a list call": b'{"jsonrpc":"2.0","id":"l","method":"tools/list","params":{"cursor":"c"}}',
    "a cancellation": (
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":4}}'
    ),
}


@pytest.mark.parametrize("case", sorted(BODIES))
async def test_the_helper_process_reads_as_the_event_loop_does(
    reader: MessageReader, case: str
) -> None:
    body = BODIES[case]
    in_place = read_post(body, SPEC)
    elsewhere = await reader.read(body, SPEC)
    same_reading(in_place, elsewhere)
    assert elsewhere.message.params == {
        k: v for k, v in in_place.message.params.items() if not isinstance(v, dict | list)
    }


async def test_a_message_the_helper_cannot_read_is_the_same_json_rpc_error(
    reader: MessageReader,
) -> None:
    with pytest.raises(JsonRpcError) as in_place:
        read_post(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}}', SPEC)
    with pytest.raises(JsonRpcError) as elsewhere:
        await reader.read(b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":1,"a":2}}', SPEC)
    assert (elsewhere.value.code, elsewhere.value.message) == (
        in_place.value.code,
        in_place.value.message,
    )


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


@given(
    st.dictionaries(st.text(max_size=6), _JSON, max_size=4),
    st.dictionaries(st.text(max_size=6), _JSON, max_size=3),
    st.none() | st.text(min_size=1, max_size=10),
)
def test_the_forwarded_body_is_the_call_with_the_forwarded_key_last_in_meta(
    params: dict[str, Any], meta: dict[str, Any], key: str | None
) -> None:
    document = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {**params}}
    document["params"]["_meta"] = {**meta, "idempotencyKey": "the caller's"}
    sent = json.loads(forward_body(document).with_key(key))
    expected_meta = {k: v for k, v in meta.items() if k != "idempotencyKey"}
    if key is not None:
        expected_meta["idempotencyKey"] = key
    assert sent == {**document, "params": {**document["params"], "_meta": expected_meta}}


async def test_a_large_call_runs_once_and_replays(gateway_factory: GatewayFactory) -> None:
    """Read in the helper process, claimed, sent with the forwarded key, replayed (400 KiB:
    the server echoes the title twice, and its answer must stay under the SDK's 1 MiB
    event limit and the route's max_stored_response)."""
    title = "x" * (400 * 1024)
    async with CountingMcpServer() as server:
        route = {"name": "tools", "prefix": "/tools", "upstream": server.url, "kind": "mcp"}
        gateway = await gateway_factory(server.url, route=route)
        async with asyncio.timeout(60), mcp_client(gateway.url + "/tools") as client:
            first = await call_with_key(client, "create_ticket", {"title": title}, "big-1")
            again = await call_with_key(client, "create_ticket", {"title": title}, "big-1")
        assert server.count == 1
        assert server.effects[0].arguments == {"title": title}
        assert again.structured_content == first.structured_content
        assert again.meta is not None
        assert again.meta["idempotencyReplayed"] is True


REPLAYED = {
    "a result": b'{"jsonrpc":"2.0","id":1,"result":{"content":[],"_meta":{"x":1}}}',
    "an error": b'{"jsonrpc":"2.0","id":1,"error":{"code":-1,"message":"no","data":[1]}}',
    "an unreadable result": b'{"jsonrpc":"2.0","id":1,"result":{"n":' + b"9" * 5000 + b"}}",
}


@pytest.mark.parametrize("version", [None, "2026-07-28"])
@pytest.mark.parametrize("case", sorted(REPLAYED))
async def test_the_helper_process_replays_as_the_event_loop_does(
    reader: MessageReader, case: str, version: str | None
) -> None:
    """A large receipt's replay is made in the helper: the same bytes as in place."""
    stored = REPLAYED[case]
    in_place = await MessageReader(Offloader(large=len(stored) + 1)).replay(stored, "r-2", version)
    assert await reader.replay(stored, "r-2", version) == in_place
    assert in_place.startswith(b'{"jsonrpc":"2.0","id":"r-2",')
