"""The MCP front end's pure parts: SSE reading, JSON-RPC parsing, fingerprints, replies."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.mcp.calls import derived_key, fingerprint_call, tool_call_of
from gateway.mcp.jsonrpc import JsonRpcError, parse_message
from gateway.mcp.replies import refusal_result, replay_document, strip_owned_meta
from gateway.mcp.sse import SseDecoder, SseEvent, encode_event

STREAM = (
    b'event: message\r\ndata: {"jsonrpc":"2.0","method":"notifications/progress"}\r\n\r\n'
    b": ping\r\n\r\n"
    b"id: 7\ndata: line one\ndata: line two\n\n"
    b"data:no space\rdata: x\r\r"
)
EVENTS = [
    SseEvent(data='{"jsonrpc":"2.0","method":"notifications/progress"}'),
    SseEvent(data="line one\nline two", id="7"),
    SseEvent(data="no space\nx", id="7"),
]


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_sse_events_do_not_depend_on_how_the_bytes_are_split(cuts: list[int]) -> None:
    """Chunk boundaries anywhere (inside a CRLF included) give the same events."""
    decoder, events, start = SseDecoder(), [], 0
    for cut in [*sorted(cuts), len(STREAM)]:
        events += decoder.feed(STREAM[start:cut])
        start = cut
    assert events == EVENTS


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200))
def test_an_encoded_event_reads_back_as_its_data(data: str) -> None:
    normalized = data.replace("\r\n", "\n").replace("\r", "\n")
    assert SseDecoder().feed(encode_event(data)) == [SseEvent(data=normalized)]


def call(arguments: str, meta: str = "{}") -> Any:
    body = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":'
        + arguments
        + ',"_meta":'
        + meta
        + "}}"
    )
    return tool_call_of(parse_message(body.encode()), header_keys=[])


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(1 - 2**53, 2**53 - 1) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(st.dictionaries(st.text(max_size=6), json_values, max_size=5))
def test_the_fingerprint_ignores_member_order_and_whitespace(arguments: dict[str, Any]) -> None:
    compact = json.dumps(arguments, separators=(",", ":"))
    reordered = json.dumps(dict(reversed(list(arguments.items()))), indent=2)
    assert fingerprint_call("r", call(compact)) == fingerprint_call("r", call(reordered))
    assert derived_key("r", call(compact)) == derived_key("r", call(reordered))


def test_the_fingerprint_ignores_meta_but_not_the_route_tool_or_arguments() -> None:
    base = fingerprint_call("r", call('{"a":1}'))
    assert fingerprint_call("r", call('{"a":1}', '{"progressToken":5}')) == base
    assert fingerprint_call("r2", call('{"a":1}')) != base
    assert fingerprint_call("r", call('{"a":2}')) != base
    assert derived_key("r", call('{"a":1}')).startswith("d:")
    assert len(derived_key("r", call('{"a":1}'))) == 45


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"nope", -32700),
        (b"[]", -32600),
        (b'{"jsonrpc":"1.0","id":1,"method":"x"}', -32600),
        (b'{"jsonrpc":"2.0","id":true,"method":"x"}', -32600),
        (b'{"jsonrpc":"2.0","id":null,"method":"x"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":[1]}', -32602),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","method":"y"}', -32600),
        (b'{"jsonrpc":"2.0","id":1,"method":"x","params":{"a":NaN}}', -32700),
    ],
)
def test_malformed_messages_are_refused_with_their_code(body: bytes, code: int) -> None:
    with pytest.raises(JsonRpcError) as refused:
        parse_message(body)
    assert refused.value.code == code


def test_a_number_too_large_for_a_double_is_a_parse_error() -> None:
    """1e400 would read as infinity, which has no JSON form to send on or replay: the
    message cannot be read as it was meant, wherever the number is."""
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"_meta":{"n":1e400}}}'
    with pytest.raises(JsonRpcError) as refused:
        parse_message(body)
    assert refused.value.code == -32700


@pytest.mark.parametrize(
    ("arguments", "meta", "headers"),
    [
        ('{"n": 9007199254740993}', "{}", []),  # past 2**53: not I-JSON
        ("{}", '{"idempotencyKey": 7}', []),
        ("{}", '{"idempotencyKey": " k"}', []),
        ("{}", '{"idempotencyKey": "a"}', ["b"]),  # header and _meta disagree
    ],
)
def test_calls_that_cannot_be_fingerprinted_or_keyed_are_invalid_params(
    arguments: str, meta: str, headers: list[str]
) -> None:
    body = (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":'
        f'{arguments},"_meta":{meta}}}}}'
    )
    with pytest.raises(JsonRpcError) as refused:
        tool_call_of(parse_message(body.encode()), header_keys=headers)
    assert refused.value.code == -32602


def test_the_header_key_and_the_meta_key_agree_or_stand_alone() -> None:
    body = b'{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t"}}'
    assert tool_call_of(parse_message(body), header_keys=["k-1"]).key == "k-1"
    assert call("{}", '{"idempotencyKey": "k-2"}').key == "k-2"


def test_replays_keep_the_new_id_type_and_own_the_markers() -> None:
    stored = json.dumps(
        {"jsonrpc": "2.0", "id": 3, "result": {"content": [], "_meta": {"idempotency": "forged"}}}
    ).encode()
    replay = replay_document(stored, "req-9")
    assert replay["id"] == "req-9"
    assert replay["result"]["_meta"] == {"idempotencyReplayed": True}
    error = json.dumps({"jsonrpc": "2.0", "id": 3, "error": {"code": -1, "message": "x"}})
    assert replay_document(error.encode(), 4)["error"]["data"] == {"idempotencyReplayed": True}
    forged = {"jsonrpc": "2.0", "id": 1, "result": {"_meta": {"idempotencyReplayed": True}}}
    assert strip_owned_meta(forged) == {"jsonrpc": "2.0", "id": 1, "result": {}}


def test_a_refusal_is_a_tool_result_the_model_can_read() -> None:
    refusal = refusal_result(5, {"type": "https://x/problems/key-mismatch", "key": "k"})
    result = refusal["result"]
    assert (refusal["id"], result["isError"]) == (5, True)
    assert result["_meta"]["idempotency"] == {"type": "key-mismatch", "key": "k"}
    assert "new key" in result["content"][0]["text"]
