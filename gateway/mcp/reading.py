"""Reading a POSTed MCP message, off the event loop when it is large.

Everything the gateway must know of a message comes from its JSON: which
kind, which method and id, and for a `tools/call` the tool, the key, the
fingerprint over the canonical arguments (RFC 8785) and the body to send on.
Canonical JSON is pure Python and costs about half a second per MiB of
arguments, so a large body is read in the shared helper process
(`gateway.web.offload`), which hands back only what the gateway needs: small
fields, the canonical bytes and the body to forward, split where the
forwarded key goes. Smaller bodies are read in place, by the same function.
A replay of a large receipt (parsed, re-addressed, serialized again) is made
there too.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from typing import Any

from gateway.mcp.calls import DISTINCT_META, KEY_META, ToolCall, tool_call_of
from gateway.mcp.jsonrpc import JsonRpcError, Message, RequestId, parse_message
from gateway.mcp.replies import dumps, replay_body
from gateway.mcp.status_tool import StatusQuestion, asked_about
from gateway.web.offload import Offloader

__all__ = ["ForwardBody", "MessageReader", "PostReading", "ReadSpec", "read_post"]

_PLACEHOLDER = f"igw-forwarded-key-{secrets.token_hex(16)}"
"""Stands where the forwarded key goes while the body is serialized; random per process,
so no caller can write it into its arguments."""
_KEY_MEMBER = dumps({KEY_META: _PLACEHOLDER})[1:-1]
_NOT_FORWARDED = frozenset({KEY_META, DISTINCT_META})
"""`_meta` members the gateway replaces (the key: the forwarded one) or keeps to itself."""


@dataclass(frozen=True, slots=True)
class ForwardBody:
    """A protected call as it is sent upstream, with the forwarded key as the last member
    of `params._meta` (or without it, for `forward_key = false`)."""

    before: bytes
    separator: bytes
    after: bytes

    def with_key(self, key: str | None) -> bytes:
        """The body carrying `key` in `params._meta.idempotencyKey` (None: no key).

        >>> body = forward_body({"jsonrpc": "2.0", "id": 1, "params": {"name": "t"}})
        >>> body.with_key("op_1")
        b'{"jsonrpc":"2.0","id":1,"params":{"name":"t","_meta":{"idempotencyKey":"op_1"}}}'
        >>> body.with_key(None)
        b'{"jsonrpc":"2.0","id":1,"params":{"name":"t","_meta":{}}}'
        """
        if key is None:
            return self.before + self.after
        return b"".join((self.before, self.separator, dumps({KEY_META: key})[1:-1], self.after))


def forward_body(document: dict[str, Any]) -> ForwardBody:
    """Serialize the call once, the caller's key replaced by a placeholder that is then
    cut out: sending costs a join, whatever the key."""
    params = dict(document.get("params") or {})
    meta = {k: v for k, v in (params.get("_meta") or {}).items() if k not in _NOT_FORWARDED}
    params["_meta"] = {**meta, KEY_META: _PLACEHOLDER}
    keyed = dumps({**document, "params": params})
    at = keyed.index(_KEY_MEMBER)
    separator = b"," if meta else b""
    return ForwardBody(keyed[: at - len(separator)], separator, keyed[at + len(_KEY_MEMBER) :])


@dataclass(frozen=True, slots=True)
class ReadSpec:
    """What reading a message depends on besides its bytes (all picklable)."""

    route: str
    header_keys: tuple[str, ...] = ()
    mcp_method: str | None = None
    mcp_name: str | None = None
    status_tool: str | None = None


@dataclass(frozen=True, slots=True)
class PostReading:
    """A message, read: the message (for a large one, its params cut to their scalar
    members), and for a `tools/call` the call, or why it cannot be one."""

    message: Message
    call: ToolCall | None = None
    call_error: JsonRpcError | None = None
    forward: ForwardBody | None = None
    """Made in the helper for a large message (whose document stays there)."""
    status_question: StatusQuestion | None = None
    status_error: JsonRpcError | None = None

    def forward_body(self) -> ForwardBody:
        """The body to send on: the helper's for a large message, else made from the
        message when the call is sent (a replay or a refusal never needs it)."""
        return self.forward if self.forward is not None else forward_body(self.message.document)


def read_post(body: bytes, spec: ReadSpec, *, summarize: bool = False) -> PostReading:
    """Read one POSTed message; `JsonRpcError` when it is not a JSON-RPC message.

    A `tools/call` that is malformed as a call (no name, arguments with no
    canonical form, a bad key) is still a message: its error is kept for the
    caller to raise where it matters. With `summarize`, the message keeps only
    the scalar members of its params, and the call its canonical arguments, not
    the parsed ones: what crosses back from the helper process stays small.
    """
    message = parse_message(body)
    if message.method != "tools/call" or message.kind != "request":
        return PostReading(_summary(message) if summarize else message)
    call = call_error = forward = status_question = status_error = None
    try:
        call = tool_call_of(
            message,
            header_keys=list(spec.header_keys),
            mcp_method=spec.mcp_method,
            mcp_name=spec.mcp_name,
        )
    except JsonRpcError as exc:
        call_error = exc
    if spec.status_tool is not None and message.params.get("name") == spec.status_tool:
        try:
            # Asked without the call's own key checks: a status call is never protected.
            asked = call or tool_call_of(message, header_keys=[])
            status_question = asked_about(spec.route, asked)
        except JsonRpcError as exc:
            status_error = exc
    if summarize:
        if call is not None:
            forward = forward_body(message.document)
        message = _summary(message)
        if call is not None:
            call = ToolCall(call.id, call.name, {}, call.canonical_arguments, call.key)
    return PostReading(message, call, call_error, forward, status_question, status_error)


def _summary(message: Message) -> Message:
    params = {k: v for k, v in message.params.items() if not isinstance(v, dict | list)}
    document = {k: v for k, v in message.document.items() if k != "params"}
    return Message(message.kind, document, message.id, message.method, params)


class MessageReader:
    """Reads messages: small ones in place, large ones in the shared helper process
    (`gateway.web.offload`)."""

    def __init__(self, offloader: Offloader) -> None:
        self._offloader = offloader

    async def read(self, body: bytes, spec: ReadSpec) -> PostReading:
        if len(body) < self._offloader.large:
            return read_post(body, spec)
        return await self._offloader.run(len(body), _read_summarized, body, spec)

    async def replay(self, stored: bytes, new_id: RequestId, version: str | None) -> bytes:
        """A replay's bytes (`replay_body`): a large receipt is parsed and serialized
        again in the helper too, so a storm of replays does not stall the loop."""
        return await self._offloader.run(len(stored), replay_body, stored, new_id, version)


def _read_summarized(body: bytes, spec: ReadSpec) -> PostReading:
    return read_post(body, spec, summarize=True)
