"""A server's answer the gateway's parser cannot read, kept and replayed as its bytes.

Python's parser refuses numbers of 4,300 digits or more and nesting deeper
than the interpreter's recursion limit; an MCP server may still answer with
them. When the tool ran and answered, losing the answer for that reason
would turn a receipt into an `unknown` operation and an operator's chore.
So an answer that cannot be parsed whole is read only as far as the gateway
needs: the top-level members of the JSON-RPC response (is it a response, to
which id, a result or an error) and, to replay it, the members of `result`
(or `error`) and their `_meta` (or `data`). Values are skipped, not parsed:
strings by a pattern, objects and arrays by counting brackets, so neither a
long number nor deep nesting costs more than one pass over the bytes.

The scan is lenient (it trusts the server's brackets), which is enough for
answers that are only ever stored and sent back as they came; everything the
gateway decides on (the id, the error code, `resultType`) is parsed from its
own small value, strictly.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Member", "RawResponse", "read_raw_response", "replay_raw"]

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_SCALAR = re.compile(r"[^,:\]\}\s]+")
_BLANK = re.compile(r"[ \t\r\n]*")
_STRUCTURE = re.compile(r'["{}\[\]]')

_REPLAYED = "idempotencyReplayed"
_OWNED = ("idempotencyReplayed", "idempotency", "idempotencyProbe")


class Unscannable(ValueError):
    """The text is not even shaped like a JSON object."""


@dataclass(frozen=True, slots=True)
class Member:
    """One member of an object: its name and where its value lies in the text."""

    name: str
    start: int
    end: int

    def raw(self, text: str) -> str:
        return text[self.start : self.end]


@dataclass(frozen=True, slots=True)
class RawResponse:
    """What the gateway needs to know of a JSON-RPC response it cannot parse whole."""

    id: Any
    """The response's id, parsed (None when it has none, or one that cannot be read)."""
    is_error: bool
    error_code: Any
    result_type: Any


def read_raw_response(data: bytes) -> RawResponse | None:
    """The response's id and kind, when `data` is shaped like one JSON-RPC response
    (an object with an `id`, one of `result` and `error`, no `method`); else None.

    >>> read_raw_response(b'{"jsonrpc":"2.0","id":3,"result":{"n":' + b"9" * 5000 + b"}}")
    RawResponse(id=3, is_error=False, error_code=None, result_type=None)
    >>> read_raw_response(b"<html>") is None
    True
    """
    try:
        text = data.decode("utf-8")
        members = _by_name(text, _object_members(text, _skip_blank(text, 0))[0])
    except (UnicodeDecodeError, Unscannable):
        return None
    if "method" in members or "id" not in members or ("result" in members) == ("error" in members):
        return None
    error_code = result_type = None
    if "error" in members:
        error_code = _member_value(text, members["error"], "code")
    else:
        result_type = _member_value(text, members["result"], "resultType")
    return RawResponse(
        id=_small_value(members["id"].raw(text)),
        is_error="error" in members,
        error_code=error_code,
        result_type=result_type,
    )


def replay_raw(data: bytes, new_id: Any, *, result_type: str | None = None) -> bytes:
    """The stored answer under `new_id`, marked replayed like a parsed one (the gateway's
    own `_meta` keys replaced, `resultType` added when `result_type` is given and the
    result has none); every other byte as the server sent it.

    >>> raw = b'{"jsonrpc":"2.0","id":1,"result":{"n":' + b"7" * 5000 + b"}}"
    >>> replayed = replay_raw(raw, "r-2", result_type="complete").decode()
    >>> replayed[:38]
    '{"jsonrpc":"2.0","id":"r-2","result":{'
    >>> replayed[-63:]
    ',"_meta":{"idempotencyReplayed":true},"resultType":"complete"}}'
    """
    text = data.decode("utf-8")
    members, _ = _object_members(text, _skip_blank(text, 0))
    parts = []
    for member in members:
        value = member.raw(text)
        if member.name == "id":
            value = json.dumps(new_id)
        elif member.name == "result" and value.startswith("{"):
            value = _marked(text, member, "_meta", result_type=result_type)
        elif member.name == "error" and value.startswith("{"):
            value = _marked(text, member, "data", result_type=None)
        parts.append(f"{json.dumps(member.name)}:{value}")
    return ("{" + ",".join(parts) + "}").encode()


def _marked(text: str, holder: Member, meta_name: str, *, result_type: str | None) -> str:
    """`holder` (a result or an error object) with its `meta_name` member (`_meta` or
    `data`) holding the replay marker, and `resultType` when asked for."""
    members, _ = _object_members(text, holder.start)
    parts, marked, typed = [], False, False
    for member in members:
        value = member.raw(text)
        if member.name == meta_name:
            marked = True
            value = _with_marker(text, member)
        typed = typed or member.name == "resultType"
        parts.append(f"{json.dumps(member.name)}:{value}")
    if not marked:
        parts.append(f'{json.dumps(meta_name)}:{{"{_REPLAYED}":true}}')
    if result_type is not None and not typed:
        parts.append(f'"resultType":{json.dumps(result_type)}')
    return "{" + ",".join(parts) + "}"


def _with_marker(text: str, meta: Member) -> str:
    """A `_meta`/`data` object without the gateway's own keys, plus the replay marker
    (a `data` that is not an object is kept as `original`, as for parsed receipts)."""
    raw = meta.raw(text)
    if raw == "null":  # no data, as the parsed path reads it: nothing to keep
        return f'{{"{_REPLAYED}":true}}'
    if not raw.startswith("{"):
        return f'{{"{_REPLAYED}":true,"original":{raw}}}'
    members, _ = _object_members(text, meta.start)
    kept = [f"{json.dumps(m.name)}:{m.raw(text)}" for m in members if m.name not in _OWNED]
    return "{" + ",".join([*kept, f'"{_REPLAYED}":true']) + "}"


def _member_value(text: str, holder: Member, name: str) -> Any:
    """The parsed value of `holder`'s member `name` (None when absent or unreadable)."""
    if not holder.raw(text).startswith("{"):
        return None
    members = _by_name(text, _object_members(text, holder.start)[0])
    return _small_value(members[name].raw(text)) if name in members else None


def _small_value(raw: str) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):
        return None


def _by_name(text: str, members: list[Member]) -> dict[str, Member]:
    found: dict[str, Member] = {}
    for member in members:
        if member.name in found:
            raise Unscannable(f"member {member.name!r} appears twice")
        found[member.name] = member
    return found


def _object_members(text: str, start: int) -> tuple[list[Member], int]:
    """The members of the object whose `{` is at `start`, and the index after its `}`."""
    if not text.startswith("{", start):
        raise Unscannable("not an object")
    members: list[Member] = []
    i = _skip_blank(text, start + 1)
    if text.startswith("}", i):
        return members, i + 1
    while True:
        name_match = _STRING.match(text, i)
        if name_match is None:
            raise Unscannable("a member name is not a string")
        name = _small_value(name_match.group())
        i = _skip_blank(text, name_match.end())
        if not isinstance(name, str) or not text.startswith(":", i):
            raise Unscannable("a member has no ':'")
        value_start = _skip_blank(text, i + 1)
        value_end = _skip_value(text, value_start)
        members.append(Member(name, value_start, value_end))
        i = _skip_blank(text, value_end)
        if text.startswith(",", i):
            i = _skip_blank(text, i + 1)
        elif text.startswith("}", i):
            return members, i + 1
        else:
            raise Unscannable("an object does not close")


def _skip_value(text: str, start: int) -> int:
    """The index after the value that begins at `start` (iterative: any depth)."""
    if text.startswith('"', start):
        match = _STRING.match(text, start)
        if match is None:
            raise Unscannable("a string does not close")
        return match.end()
    if text.startswith(("{", "["), start):
        depth, i = 0, start
        while True:
            found = _STRUCTURE.search(text, i)
            if found is None:
                raise Unscannable("a bracket does not close")
            char = found.group()
            if char == '"':
                string = _STRING.match(text, found.start())
                if string is None:
                    raise Unscannable("a string does not close")
                i = string.end()
                continue
            depth += 1 if char in "{[" else -1
            i = found.end()
            if depth == 0:
                return i
    scalar = _SCALAR.match(text, start)
    if scalar is None:
        raise Unscannable("a value is missing")
    return scalar.end()


def _skip_blank(text: str, start: int) -> int:
    match = _BLANK.match(text, start)
    return match.end() if match is not None else start
