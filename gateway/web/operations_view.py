"""`/operations/<key>`: what happened to an effect, and settling it when nobody knows.

Scoped exactly like proxied requests: a caller sees and resolves only its own
scope's keys. The key is one percent-encoded path segment, so keys containing
`/` work.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from aiohttp import web

from gateway.engine.errors import (
    InvalidKey,
    InvalidRequest,
    NotFound,
    PreconditionFailed,
    UnknownKey,
)
from gateway.engine.keys import MAX_KEY_LENGTH
from gateway.engine.models import Operation
from gateway.engine.scopes import settled_scope
from gateway.proxy.request_body import read_in_time, read_limited
from gateway.web.appkeys import ENGINE, SCOPES, SETTINGS, STORE
from gateway.web.operation_document import document_response, operation_document
from gateway.web.resolve_body import parse_resolve_body

_PREFIX = "/operations/"
_RESOLVE = "/resolve"
MAX_RESOLVE_BODY = 2 * 1024 * 1024


def key_from_segment(encoded: str) -> str:
    """The normalized key named by one percent-encoded path segment."""
    if not encoded or "/" in encoded:
        raise InvalidKey("the operation path must be /operations/<percent-encoded key>")
    try:
        key = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        key = ""  # not even UTF-8, so certainly not printable ASCII
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all(" " <= ch <= "~" for ch in key):
        raise InvalidKey(f"a key is 1 to {MAX_KEY_LENGTH} printable ASCII characters")
    return key


async def operation_response(
    request: web.Request, operation: Operation, *, admin: bool = False
) -> web.Response:
    """The operation JSON with its ETag (and, for a caller's own key, the key headers)."""
    document = await operation_document(request, operation, admin=admin)
    return document_response(document, operation, key_headers=not admin)


# An ETag as `Operation.etag` writes it, `"<id>.<version>"` (the quotes and a
# `W/` tolerated), in ASCII only: `\d` and `str.isdigit` also take digits such
# as "²" or "٣". At most 19 digits, so `int` never meets a huge string.
_ETAG = re.compile(r'(?:W/)?("?)(?P<id>[\x21\x23-\x7e]+)\.(?P<version>[0-9]{1,19})\1')
_MAX_VERSION = 2**63 - 1
"""The largest version a store can hold (SQLite INTEGER, PostgreSQL bigint)."""


def expected_version(request: web.Request, operation: Operation) -> int | None:
    """The version an `If-Match` names; 412 at once unless it could be this operation's.

    Another operation's ETag, a malformed one, or a version no store can hold
    (beyond 2**63 - 1, or not in ASCII digits) names no current version of this
    operation: `412 precondition-failed`, before the store is asked.
    """
    value = request.headers.get("If-Match")
    if value is None or value.strip(" \t") == "*":
        return None
    tag = _ETAG.fullmatch(value.strip(" \t"))
    version = int(tag["version"]) if tag is not None and tag["id"] == operation.id else None
    if version is None or version > _MAX_VERSION:
        raise PreconditionFailed(
            "If-Match does not name this operation's current ETag",
            key=operation.key,
            state=operation.state.value,
            operation_id=operation.id,
        )
    return version


async def read_operator_body(request: web.Request) -> bytes:
    """The JSON body of a resolve or redact request: at most `MAX_RESOLVE_BODY`, within
    `client_timeout` (the same time limit as a proxied body)."""
    return await read_in_time(
        request,
        lambda: read_limited(request, MAX_RESOLVE_BODY),
        request.app[SETTINGS].server.client_timeout,
    )


async def lookup(request: web.Request) -> web.Response:
    key = key_from_segment(request.rel_url.raw_path[len(_PREFIX) :])
    caller = request.app[SCOPES].resolve(request.headers)
    caller = await settled_scope(caller, key, request.app[STORE].get)
    operation = await request.app[ENGINE].lookup(caller.scope, key)
    if operation is None:
        raise UnknownKey(f"no operation with key {key!r} in this scope", key=key)
    return await operation_response(request, operation)


async def resolve(request: web.Request) -> web.Response:
    raw_path = request.rel_url.raw_path
    if not raw_path.endswith(_RESOLVE):
        raise NotFound(f"nothing at {request.path}")
    key = key_from_segment(raw_path[len(_PREFIX) : -len(_RESOLVE)])
    caller = await settled_scope(
        request.app[SCOPES].resolve(request.headers), key, request.app[STORE].get
    )
    body = parse_resolve_body(await read_operator_body(request))
    if body.force or body.share_with_owner:
        raise InvalidRequest(
            "force and share_with_owner are accepted only on the admin endpoints; "
            "an owner's resolve is judged as sent"
        )
    operation = await request.app[STORE].get(caller.scope, key)
    if operation is None:
        raise UnknownKey(f"no operation with key {key!r} in this scope", key=key)
    resolved = await request.app[ENGINE].resolve(
        operation,
        outcome=body.outcome,
        by="owner",
        response=body.receipt_for(operation),
        note=body.note,
        expected_version=expected_version(request, operation),
    )
    return await operation_response(request, resolved)
