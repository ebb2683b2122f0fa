"""What an MCP client gets back from the gateway itself: replays and refusals.

A replay is the stored JSON-RPC response under the new request's `id` (its
type kept: a client matches responses to requests by id), marked in
`result._meta.idempotencyReplayed` (or `error.data` for an error receipt).

A refusal the model must read is a tool result with `isError: true`, not a
transport error: MCP reports tool failures in the result so the model can
see them and act, and the SDKs turn an HTTP error body into a bare "Server
returned an error response". The problem goes in `_meta.idempotency`.

The gateway owns `_meta.idempotencyReplayed` and `_meta.idempotency`: copies
an upstream server sent are removed from every answer, so a client can trust
them.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.engine.models import StoredResponse
from gateway.mcp.jsonrpc import JsonRpcError, RequestId, parse_object
from gateway.mcp.raw_json import replay_raw
from gateway.mcp.sentences import sentence_for, similar_sentence
from gateway.mcp.versions import complete_result, needs_result_type

__all__ = [
    "OWNED_META",
    "PROBE_META",
    "REPLAYED_META",
    "STATE_META",
    "refusal_result",
    "replay_body",
    "replay_document",
    "strip_owned_meta",
]

TOOL_CALL = "tools/call"
"""The `method` of every MCP operation (its `path` is the tool name)."""

REPLAYED_META = "idempotencyReplayed"
STATE_META = "idempotency"
PROBE_META = "idempotencyProbe"
"""Marks a receipt that a probe made (the probe tool's answer, not the tool's own)."""
OWNED_META = (REPLAYED_META, STATE_META, PROBE_META)
_SET_ON_REPLAY = (REPLAYED_META, STATE_META)


def strip_owned_meta(
    response: dict[str, Any], owned: tuple[str, ...] = OWNED_META
) -> dict[str, Any]:
    """A JSON-RPC response without the gateway's own `_meta` keys (an upstream
    cannot forge "replayed", a state or a probe's mark)."""
    result = response.get("result")
    if isinstance(result, dict) and isinstance(result.get("_meta"), dict):
        meta = {k: v for k, v in result["_meta"].items() if k not in owned}
        result = {**result, "_meta": meta} if meta else _without(result, "_meta")
        response = {**response, "result": result}
    error = response.get("error")
    if isinstance(error, dict) and isinstance(error.get("data"), dict):
        data = {k: v for k, v in error["data"].items() if k not in owned}
        response = {**response, "error": {**error, "data": data}}
    return response


def replay_document(stored: bytes, new_id: RequestId, version: str | None = None) -> dict[str, Any]:
    """The stored response, re-addressed to `new_id`, marked replayed and valid for the
    protocol `version` the retry speaks (a receipt recorded in one generation may be
    replayed in the other). A probe's mark on the receipt is kept.

    >>> stored = b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}'
    >>> replay_document(stored, "a-7")["id"], replay_document(stored, "a-7")["result"]["_meta"]
    ('a-7', {'idempotencyReplayed': True})
    >>> replay_document(stored, 2, "2026-07-28")["result"]["resultType"]
    'complete'
    """
    response = strip_owned_meta(parse_object(stored), _SET_ON_REPLAY)
    response["id"] = new_id
    if isinstance(response.get("result"), dict):
        result = complete_result(response["result"], version)
        result["_meta"] = {**result.get("_meta", {}), REPLAYED_META: True}
    elif isinstance(response.get("error"), dict):
        error = response["error"]
        data = error.get("data")
        error["data"] = (
            {**data, REPLAYED_META: True}
            if isinstance(data, dict)
            else {
                REPLAYED_META: True,
                **({"original": data} if data is not None else {}),
            }
        )
    return response


def replay_body(stored: bytes, new_id: RequestId, version: str | None = None) -> bytes:
    """The replay's bytes: `replay_document`'s, or, for a receipt kept as the bytes the
    server sent because the parser could not read it whole, those bytes with only the
    id and the gateway's markers changed (`gateway.mcp.raw_json`)."""
    try:
        return dumps(replay_document(stored, new_id, version))
    except JsonRpcError:
        result_type = "complete" if needs_result_type(version) else None
        return replay_raw(stored, new_id, result_type=result_type)


def refusal_result(
    message_id: RequestId,
    problem: dict[str, Any],
    version: str | None = None,
    *,
    status_tool: str | None = None,
    sentence: str | None = None,
) -> dict[str, Any]:
    """A tool result that tells the model, in its type's one sentence (or `sentence`, for
    a case its type's does not fit), what happened
    and what to do (`gateway.mcp.sentences`); the problem (type, state, key,
    operation, safe_to_retry) in `_meta.idempotency` for code that reads it; valid
    for the protocol `version` the request speaks.

    >>> doc = refusal_result(4, {"type": "outcome-unknown", "state": "unknown"}, "2026-07-28")
    >>> doc["result"]["isError"], doc["result"]["_meta"]["idempotency"]["type"]
    (True, 'outcome-unknown')
    >>> doc["result"]["resultType"]
    'complete'
    """
    kind = str(problem.get("type", "")).rsplit("/", 1)[-1]
    meta = {name: problem[name] for name in _PROBLEM_FIELDS if name in problem}
    meta["type"] = kind
    twin = problem.get("similar_operation")
    if sentence is not None:
        text = sentence
    elif isinstance(twin, dict):
        state = twin.get("state")
        text = similar_sentence(
            str(twin.get("key")), status_tool, state if isinstance(state, str) else None
        )
    else:
        text = sentence_for(kind)
    result = {
        "isError": True,
        "content": [{"type": "text", "text": text}],
        "_meta": {STATE_META: meta},
    }
    return {"jsonrpc": "2.0", "id": message_id, "result": complete_result(result, version)}


_PROBLEM_FIELDS = (
    "type",
    "title",
    "status",
    "detail",
    "state",
    "key",
    "operation",
    "operation_id",
    "safe_to_retry",
    "next_action",
    "similar_operation",
    "retry_after",
    "request_id",
)


def _without(document: dict[str, Any], name: str) -> dict[str, Any]:
    return {k: v for k, v in document.items() if k != name}


def receipt_json(stored: StoredResponse) -> dict[str, Any]:
    """An MCP receipt as the operation JSON shows it: `{"result": ...}` or `{"error": ...}`."""
    try:
        response = parse_object(stored.body)
    except JsonRpcError:  # kept as the server's bytes: replayed, not shown
        return {"result": None}
    if isinstance(response, dict) and "error" in response:
        return {"error": response["error"]}
    return {"result": response.get("result") if isinstance(response, dict) else None}


def stored_result(result: dict[str, Any]) -> StoredResponse:
    """A tool result an operator vouches for, kept as a JSON-RPC response (its id is
    replaced by each replay's)."""
    body = dumps({"jsonrpc": "2.0", "id": None, "result": result})
    return StoredResponse(status=200, headers=(("Content-Type", "application/json"),), body=body)


def dumps(document: dict[str, Any]) -> bytes:
    """Compact JSON bytes for an answer or a forwarded body.

    ASCII with `\\u` escapes: a string may hold a lone surrogate (JSON lets a client
    escape one), which has no UTF-8 form; escaped, it goes on as the client wrote it.

    >>> dumps({"a": "\\ud800", "b": "é"})
    b'{"a":"\\\\ud800","b":"\\\\u00e9"}'
    """
    return json.dumps(document, separators=(",", ":")).encode()
