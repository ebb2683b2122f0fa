"""`GET /operations/<key>`: what happened to an effect, asked by the agent's recovery logic.

Scoped exactly like proxied requests: a caller sees only its own scope's keys.
The key is one percent-encoded path segment, so keys containing `/` work.
"""

from __future__ import annotations

import json
import time
from urllib.parse import unquote

from aiohttp import web

from gateway.appkeys import SCOPES, STORE
from gateway.errors import InvalidKey, UnknownKey
from gateway.headers import IDEMPOTENCY_KEY, IDEMPOTENCY_STATUS
from gateway.keys import MAX_KEY_LENGTH
from gateway.operation_json import operation_json
from gateway.problems import operation_url

_PREFIX = "/operations/"


def key_from_path(raw_path: str) -> str:
    """The normalized key named by `/operations/<percent-encoded key>`."""
    encoded = raw_path[len(_PREFIX) :]
    if not encoded or "/" in encoded:
        raise InvalidKey("the operation path must be /operations/<percent-encoded key>")
    try:
        key = unquote(encoded, errors="strict")
    except UnicodeDecodeError:
        key = ""  # not even UTF-8, so certainly not printable ASCII
    if not 0 < len(key) <= MAX_KEY_LENGTH or not all(" " <= ch <= "~" for ch in key):
        raise InvalidKey(f"a key is 1 to {MAX_KEY_LENGTH} printable ASCII characters")
    return key


async def lookup(request: web.Request) -> web.Response:
    key = key_from_path(request.rel_url.raw_path)
    caller = request.app[SCOPES].resolve(request.headers)
    operation = await request.app[STORE].get(caller.scope, key)
    if operation is None:
        raise UnknownKey(f"no operation with key {key!r} in this scope", key=key)
    document = operation_json(operation, now=time.time(), lookup_url=operation_url(key))
    return web.Response(
        body=json.dumps(document).encode(),
        content_type="application/json",
        headers={
            "ETag": operation.etag,
            "Cache-Control": "no-store",
            IDEMPOTENCY_KEY: key,
            IDEMPOTENCY_STATUS: operation.state.value,
        },
    )
