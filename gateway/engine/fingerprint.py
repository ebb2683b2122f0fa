"""The fingerprint that binds an idempotency key to one request.

A key promises "this is the same request again". The gateway checks that
promise before it replays a receipt: a retry whose fingerprint differs from
the first attempt's gets 422 `key-mismatch` instead of someone else's stored
response (a reused key in an agent is a bug that must surface, not be papered
over). The fingerprint therefore covers exactly what decides the effect:

- the method: `POST` and `PATCH` on the same URL are different effects;
- the route name: the same path on two routes reaches two upstreams;
- the path and the raw query string, as received: they name the resource and
  often carry parameters of the effect; honest retries send the same bytes;
- the content type, normalized: it says how the body is read, but
  `application/json; charset=UTF-8` and `application/json;charset=utf-8` are
  the same, and a client library may format it either way between retries;
- the body bytes: the effect itself.

Headers such as `Authorization`, `Date`, `User-Agent`, `Traceparent` or
`Content-Length` are left out on purpose: they legitimately change between two
honest retries of one call (a refreshed token, a new timestamp, a new trace
id, a new library version), and who may see a key is already decided by its
scope. Including them would turn every such retry into a 422.

Each part is length-prefixed, so no two different requests encode to the same
bytes: (`/a`, `b`) and (`/ab`, ``) as path and query hash differently.
"""

from __future__ import annotations

import hashlib

__all__ = ["FINGERPRINT_VERSION", "fingerprint_request", "normalize_content_type"]

FINGERPRINT_VERSION = b"idempotency-gateway/fingerprint/v1"
"""Hashed first, so that a future encoding can never collide with this one."""


def fingerprint_request(
    *,
    method: str,
    route: str,
    path: str,
    query: str,
    content_type: str | None,
    body: bytes,
) -> str:
    """Return `sha256:<hex>` over the parts of a request that decide its effect.

    >>> a = fingerprint_request(method="post", route="tickets", path="/tickets/v1/issues",
    ...                         query="", content_type="application/json", body=b"{}")
    >>> b = fingerprint_request(method="POST", route="tickets", path="/tickets/v1/issues",
    ...                         query="", content_type="Application/JSON", body=b"{}")
    >>> a == b, a.startswith("sha256:"), len(a)
    (True, True, 71)
    """
    digest = hashlib.sha256()
    parts = (
        FINGERPRINT_VERSION,
        _encode(method.upper()),
        _encode(route),
        _encode(path),
        _encode(query),
        _encode(normalize_content_type(content_type)),
        bytes(body),
    )
    for part in parts:
        digest.update(len(part).to_bytes(8, "big"))
        digest.update(part)
    return "sha256:" + digest.hexdigest()


def normalize_content_type(content_type: str | None) -> str:
    """Return a canonical spelling of a Content-Type value ("" when there is none).

    The media type and parameter names are lower-cased (case-insensitive by
    RFC 9110), as is the `charset` value; other parameter values keep their
    case (a multipart `boundary` is case-sensitive). Whitespace around `;` and
    `=` goes, and a quoted value that needs no quotes loses them.

    >>> normalize_content_type('Text/Plain ; Charset = "UTF-8"')
    'text/plain;charset=utf-8'
    >>> normalize_content_type(None), normalize_content_type("")
    ('', '')
    """
    if not content_type:
        return ""
    media_type, _, rest = content_type.partition(";")
    parts = [media_type.strip(" \t").lower()]
    for name, value in _parameters(rest):
        if name == "charset":
            value = value.lower()
        parts.append(f"{name}={_quote_if_needed(value)}")
    return ";".join(parts)


_TCHARS = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _encode(text: str) -> bytes:
    # surrogateescape keeps undecodable request bytes distinct instead of failing.
    return text.encode("utf-8", "surrogateescape")


def _parameters(text: str) -> list[tuple[str, str]]:
    """Split `; a=b; c="d;e"` into (lower-cased name, unquoted value) pairs."""
    params: list[tuple[str, str]] = []
    i, n = 0, len(text)
    while i < n:
        end = i
        while end < n and text[end] not in "=;":
            end += 1
        name = text[i:end].strip(" \t").lower()
        value = ""
        i = end
        if i < n and text[i] == "=":
            i += 1
            while i < n and text[i] in " \t":
                i += 1
            if i < n and text[i] == '"':
                chars: list[str] = []
                i += 1
                while i < n and text[i] != '"':
                    if text[i] == "\\" and i + 1 < n:
                        i += 1
                    chars.append(text[i])
                    i += 1
                value = "".join(chars)
                i += 1
                while i < n and text[i] != ";":
                    i += 1
            else:
                end = i
                while end < n and text[end] != ";":
                    end += 1
                value = text[i:end].strip(" \t")
                i = end
        if name or value:
            params.append((name, value))
        i += 1
    return params


def _quote_if_needed(value: str) -> str:
    if value and all(char in _TCHARS for char in value):
        return value
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'
