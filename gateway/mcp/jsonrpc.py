"""JSON-RPC 2.0 as MCP's Streamable HTTP transport carries it.

The MCP front end reads exactly as much JSON-RPC as it needs to tell a
`tools/call` request from everything else, and to answer in kind: an MCP
client's SDK turns a problem+json body into a bare "Server returned an error
response", so every refusal on an MCP route is JSON-RPC.

Messages are parsed strictly: a member name twice in one object is refused,
because the fingerprint is taken over canonical JSON, and two parsers that
keep different duplicates would read one request as two different calls.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = [
    "INTERNAL_ERROR",
    "INVALID_PARAMS",
    "INVALID_REQUEST",
    "PARSE_ERROR",
    "REQUEST_CANCELLED",
    "JsonRpcError",
    "Message",
    "RequestId",
    "error_message",
    "parse_message",
    "parse_object",
]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
REQUEST_CANCELLED = -32800
"""MCP's "request cancelled": not a receipt, the tool may have run first."""

RequestId = str | int | float
"""A JSON-RPC id as it came (its type is kept in every answer)."""

MessageKind = Literal["request", "notification", "response"]


class JsonRpcError(Exception):
    """A message the gateway refuses, with the JSON-RPC code to refuse it with.

    `data` is the gateway's problem document (type, title, detail, ...), so a
    client that reads `error.data` learns as much as an HTTP caller would.
    """

    def __init__(self, code: int, message: str, *, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data or {}

    def __reduce__(self) -> tuple[Any, ...]:
        # Crosses back from the process that reads large messages (gateway.mcp.reading).
        return (_rebuild_error, (self.code, self.message, self.data))


def _rebuild_error(code: int, message: str, data: dict[str, Any]) -> JsonRpcError:
    return JsonRpcError(code, message, data=data)


@dataclass(frozen=True, slots=True)
class Message:
    """One JSON-RPC message: a request (method and id), a notification (method, no
    id) or a response (id and result or error)."""

    kind: MessageKind
    document: dict[str, Any]
    id: RequestId | None = None
    method: str | None = None
    params: dict[str, Any] = field(default_factory=dict)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    document: dict[str, Any] = {}
    for name, value in pairs:
        if name in document:
            raise JsonRpcError(INVALID_REQUEST, f"member {name!r} appears twice in one object")
        document[name] = value
    return document


def parse_object(raw: bytes | str) -> Any:
    """Strict JSON: duplicate member names and non-standard constants are refused, and
    anything the parser cannot read (numbers of 4,300 digits or more, deep nesting,
    another encoding than UTF-8) is a `JsonRpcError` with `PARSE_ERROR`.

    >>> parse_object(b'{"a": 1}')
    {'a': 1}
    >>> parse_object(b'{"a": 1, "a": 2}')
    Traceback (most recent call last):
    ...
    gateway.mcp.jsonrpc.JsonRpcError: member 'a' appears twice in one object
    """

    def refuse_constant(name: str) -> Any:
        raise JsonRpcError(PARSE_ERROR, f"{name} is not JSON")

    def finite(text: str) -> float:
        number = float(text)
        if math.isinf(number):  # 1e400: a float would turn it into Infinity, not JSON
            raise ValueError(f"the number {text[:20]} is too large for a float")
        return number

    try:
        # UTF-8 only, strictly (JSON-RPC over MCP is UTF-8): no byte-order mark, no
        # UTF-16 guessed from the first bytes, no encoded surrogates let through.
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
        return json.loads(
            text,
            object_pairs_hook=_no_duplicates,
            parse_constant=refuse_constant,
            parse_float=finite,
        )
    except RecursionError as exc:
        raise JsonRpcError(PARSE_ERROR, "the JSON is nested too deeply to be read") from exc
    except ValueError as exc:
        # Syntax errors, bad UTF-8, and numbers too long to convert (the digit limit
        # that protects the interpreter): all a parse error, never a crash.
        raise JsonRpcError(
            PARSE_ERROR, f"the body is not JSON the gateway can read: {exc}"
        ) from exc


def _is_id(value: object) -> bool:
    return isinstance(value, str | int | float) and not isinstance(value, bool)


def parse_message(raw: bytes) -> Message:
    """Classify one POSTed JSON-RPC message; batches are refused (`-32600`).

    >>> parse_message(b'{"jsonrpc": "2.0", "id": 7, "method": "tools/list"}').kind
    'request'
    >>> parse_message(b'{"jsonrpc": "2.0", "method": "notifications/initialized"}').kind
    'notification'
    """
    document = parse_object(raw)
    if isinstance(document, list):
        raise JsonRpcError(INVALID_REQUEST, "JSON-RPC batches are not accepted: send one message")
    if not isinstance(document, dict) or document.get("jsonrpc") != "2.0":
        raise JsonRpcError(INVALID_REQUEST, 'not a JSON-RPC 2.0 message (need "jsonrpc": "2.0")')
    method = document.get("method")
    has_id = "id" in document
    message_id = document.get("id")
    if has_id and message_id is not None and not _is_id(message_id):
        raise JsonRpcError(INVALID_REQUEST, "a JSON-RPC id is a string or a number")
    if method is None:
        if not has_id or ("result" in document) == ("error" in document):
            raise JsonRpcError(INVALID_REQUEST, "neither a request nor a response")
        return Message("response", document, id=message_id)
    if not isinstance(method, str):
        raise JsonRpcError(INVALID_REQUEST, "method must be a string")
    params = document.get("params", {})
    if not isinstance(params, dict):
        raise JsonRpcError(INVALID_PARAMS, "params must be an object")
    if not has_id:
        return Message("notification", document, method=method, params=params)
    if message_id is None:
        raise JsonRpcError(INVALID_REQUEST, "a request's id may not be null")
    return Message("request", document, id=message_id, method=method, params=params)


def error_message(
    message_id: RequestId | None, code: int, message: str, data: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A JSON-RPC error response.

    >>> error_message(3, INVALID_PARAMS, "no")
    {'jsonrpc': '2.0', 'id': 3, 'error': {'code': -32602, 'message': 'no'}}
    """
    error: dict[str, Any] = {"code": code, "message": message}
    if data:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": message_id, "error": error}
