"""A `tools/call` as the gateway sees it: which tool, which arguments, which key.

Protection, key and fingerprint come from the JSON-RPC body only. The
JSON-RPC `id`, everything in `_meta` but the key (`progressToken`, client
info), the session and the transport headers are left out of the
fingerprint: an honest retry comes on a new session with a new id, and it is
the same call. The arguments are fingerprinted as RFC 8785 canonical JSON,
so `{"a": 1, "b": 2}` and `{"b":2,"a":1.0}` are one call.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import rfc8785

from gateway.engine.errors import InvalidKey
from gateway.engine.keys import MAX_KEY_LENGTH, parse_idempotency_key
from gateway.mcp.jsonrpc import INVALID_PARAMS, INVALID_REQUEST, JsonRpcError, Message, RequestId

__all__ = [
    "DISTINCT_META",
    "KEY_META",
    "ToolCall",
    "derived_key",
    "fingerprint_call",
    "tool_call_of",
]

KEY_META = "idempotencyKey"
"""Where the key goes in `params._meta`: the official SDKs can set `_meta` per call,
not a header."""
DISTINCT_META = "idempotencyDistinct"
"""`params._meta.idempotencyDistinct: true` marks a deliberate second effect (HTTP's
`Idempotency-Distinct: ?1`): gateway-owned, never forwarded nor fingerprinted."""

_FINGERPRINT_VERSION = b"idempotency-gateway/mcp-fingerprint/v1"


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One `tools/call` request, read and checked."""

    id: RequestId
    name: str
    arguments: dict[str, Any]
    canonical_arguments: bytes
    key: str | None
    """From `params._meta.idempotencyKey` or the `Idempotency-Key` header (equal when both)."""
    distinct: bool = False
    """Marked a deliberate second effect (`DISTINCT_META`)."""


def tool_call_of(
    message: Message,
    *,
    header_keys: list[str],
    mcp_method: str | None = None,
    mcp_name: str | None = None,
) -> ToolCall:
    """Read a `tools/call` request; `JsonRpcError` for anything malformed.

    `mcp_method`/`mcp_name` are the stateless generation's `Mcp-Method` and
    `Mcp-Name` headers: an intermediary may route by them, so one that names
    another tool than the body does is refused rather than believed.
    """
    assert message.id is not None
    params = message.params
    name = params.get("name")
    if not isinstance(name, str) or not name:
        raise JsonRpcError(INVALID_PARAMS, "tools/call needs params.name, a tool name")
    arguments = params.get("arguments", {})
    if arguments is None:
        arguments = {}
    if not isinstance(arguments, dict):
        raise JsonRpcError(INVALID_PARAMS, "params.arguments must be an object")
    if mcp_method is not None and mcp_method != message.method:
        raise JsonRpcError(INVALID_REQUEST, f"Mcp-Method {mcp_method!r} is not the body's method")
    if mcp_name is not None and mcp_name != name:
        raise JsonRpcError(INVALID_REQUEST, f"Mcp-Name {mcp_name!r} is not the body's tool")
    try:
        canonical = rfc8785.dumps(arguments)
    except rfc8785.CanonicalizationError as exc:
        raise JsonRpcError(
            INVALID_PARAMS, f"the arguments have no canonical JSON form: {exc}"
        ) from exc
    return ToolCall(
        id=message.id,
        name=name,
        arguments=arguments,
        canonical_arguments=canonical,
        key=_key(params.get("_meta"), header_keys),
        distinct=_distinct(params.get("_meta")),
    )


def _distinct(meta: object) -> bool:
    """The distinct marker: `true`, `false` or absent; anything else is refused, never
    guessed (a guess either refuses a call meant twice or lets a duplicate through)."""
    value = meta.get(DISTINCT_META, False) if isinstance(meta, dict) else False
    if not isinstance(value, bool):
        raise JsonRpcError(INVALID_PARAMS, "_meta.idempotencyDistinct must be true or false")
    return value


def _key(meta: object, header_keys: list[str]) -> str | None:
    from_header = _parse_key(header_keys)
    if meta is not None and not isinstance(meta, dict):
        raise JsonRpcError(INVALID_PARAMS, "params._meta must be an object")
    from_meta = None
    if isinstance(meta, dict) and KEY_META in meta:
        value = meta[KEY_META]
        if not isinstance(value, str):
            raise _invalid_key("_meta.idempotencyKey must be a string")
        if value != value.strip(" \t"):
            # A header's outer whitespace is not part of it; in JSON it would be,
            # and " k" and "k" would name one effect.
            raise _invalid_key("_meta.idempotencyKey has leading or trailing whitespace")
        from_meta = _parse_key([value])
    if from_meta is not None and from_header is not None and from_meta != from_header:
        raise _invalid_key("the Idempotency-Key header and _meta.idempotencyKey differ")
    return from_meta if from_meta is not None else from_header


def _parse_key(values: list[str]) -> str | None:

    try:
        return parse_idempotency_key(values)
    except InvalidKey as exc:
        raise _invalid_key(exc.detail) from exc


def _invalid_key(detail: str) -> JsonRpcError:
    problem = InvalidKey(detail)
    return JsonRpcError(
        INVALID_PARAMS,
        f"invalid idempotency key: {detail}",
        data={
            "type": problem.type_uri,
            "title": problem.title,
            "status": problem.status,
            "detail": detail,
            "max_length": MAX_KEY_LENGTH,
        },
    )


def fingerprint_call(route: str, call: ToolCall) -> str:
    """`sha256:<hex>` over the route, the tool and the canonical arguments: the plain
    fingerprint, stored and looked up only keyed per scope (`gateway.engine.digests`).

    >>> from gateway.mcp.jsonrpc import parse_message
    >>> def call(args: str) -> ToolCall:
    ...     body = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"t","arguments":'
    ...     return tool_call_of(parse_message((body + args + "}}").encode()), header_keys=[])
    >>> same = fingerprint_call("r", call('{"a":1,"b":2}'))
    >>> same == fingerprint_call("r", call('{"b":2,"a":1.0}'))
    True
    """
    digest = hashlib.sha256(_FINGERPRINT_VERSION)
    for part in (route.encode(), call.name.encode(), call.canonical_arguments):
        digest.update(len(part).to_bytes(8, "big") + part)
    return "sha256:" + digest.hexdigest()


def derived_key(route: str, call: ToolCall) -> str:
    """The plain key of a call that came without one (`derive_key = "arguments"`):
    `d:` + base64url(SHA-256(route NUL tool NUL canonical arguments)). Calls are claimed
    under its keyed form (`gateway.mcp.derived_keys`); this one is what a gateway of
    before stored, still looked up for a while after the upgrade.

    The same call made again within `derived_key_retention` is then taken for
    a crash-retry and answered from its receipt; after it, it is a new effect.
    """
    material = route.encode() + b"\x00" + call.name.encode() + b"\x00" + call.canonical_arguments
    digest = hashlib.sha256(material).digest()
    return "d:" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
