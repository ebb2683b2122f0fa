"""Who a request belongs to: the scope that keys live in.

Two keys in two scopes are two operations; one scope can never read, replay
or resolve another's. A scope is derived only from a credential the caller
must hold, never from anything it can choose freely:

- with `[[clients]]`, the gateway-issued bearer token names the client, and
  the scope is the client's name (stable across token rotation: a client may
  list several token digests);
- otherwise, an HMAC of the `scope_headers` values, keyed by a secret kept in
  the store, so the credential itself is never stored in clear. Rotating such
  a credential changes the scope; agents whose tokens rotate should use
  `[[clients]]`.

Both read a credential as the exact bytes the caller sent (`header_bytes`):
two different credentials never share a scope, whatever characters they hold,
and one that is not UTF-8 is just another credential, never a server error.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.engine.errors import MissingCredentials, Unauthorized

if TYPE_CHECKING:
    from gateway.config import ClientSettings

ANONYMOUS_SCOPE = "anonymous"
CLIENT_SCOPE_PREFIX = "client:"
"""A `[[clients]]` scope is this prefix and the client's name."""


class HeaderSource(Protocol):
    """The slice of a header mapping this module needs (the HTTP server's CIMultiDictProxy fits)."""

    def getall(self, key: str, default: list[str]) -> list[str]: ...


@dataclass(frozen=True, slots=True)
class CallerScope:
    """A request's scope, and whether its `Authorization` was ours to consume."""

    scope: str
    strips_authorization: bool

    @property
    def client(self) -> str | None:
        """The `[[clients]]` name, when the scope is a client's."""
        if self.scope.startswith(CLIENT_SCOPE_PREFIX):
            return self.scope.removeprefix(CLIENT_SCOPE_PREFIX)
        return None


def header_bytes(value: str) -> bytes:
    """The bytes a header value arrived as.

    The HTTP server decodes header bytes as UTF-8 with `surrogateescape`, so this is
    exact for every value, UTF-8 or not: no two different values give the
    same bytes (a lossy encoding such as `latin-1, replace` would merge them).

    >>> header_bytes("s3cr€T")
    b's3cr\\xe2\\x82\\xacT'

    (A byte 0xff that is not UTF-8 arrives as the lone surrogate U+DCFF and
    comes back as 0xff.)
    """
    return value.encode("utf-8", "surrogateescape")


AUTH_SCHEMES = frozenset({"bearer", "basic", "digest", "token", "negotiate", "apikey"})
"""Scheme names that, alone in an `Authorization` value, are a scheme with no credential."""


def is_credential(name: str, value: str) -> bool:
    """Whether a scope header's value holds a credential at all.

    An agent whose token variable is unset sends `Authorization:` (empty), blanks, or
    `Bearer ` with nothing after the scheme. Hashed as they come, all such agents
    would share one scope and read each other's receipts: they are no credential.

    >>> [is_credential("Authorization", v) for v in ("", "  ", "Bearer ", "Bearer t0k")]
    [False, False, False, True]
    >>> is_credential("X-Api-Key", "k1"), is_credential("X-Api-Key", " \t")
    (True, False)
    """
    text = value.strip(" \t")
    if not text:
        return False
    if name.lower() != "authorization":
        return True
    scheme, _, credential = text.partition(" ")
    if credential.strip(" \t"):
        return True
    return scheme.lower() not in AUTH_SCHEMES


@functools.lru_cache(maxsize=4096)
def scope_hash(scope: str) -> str:
    """A log-safe handle for a scope: never the client's token, never a raw header."""
    return hashlib.sha256(scope.encode()).hexdigest()[:12]


class ScopeResolver:
    """Derives scopes from request headers.

    >>> resolver = ScopeResolver(
    ...     clients=(), scope_headers=("Authorization",), secret=b"k" * 32, shared_scope=True
    ... )
    >>> resolver.resolve(_Headers({})).scope
    'anonymous'
    """

    def __init__(
        self,
        *,
        clients: Sequence[ClientSettings],
        scope_headers: Sequence[str],
        secret: bytes,
        shared_scope: bool = False,
    ) -> None:
        self._client_by_digest = {
            digest.lower(): client.name for client in clients for digest in client.token_sha256
        }
        self._uses_clients = bool(clients)
        self._scope_headers = tuple(scope_headers)
        self._shared_scope = shared_scope
        self._secret = secret

    def resolve(self, headers: HeaderSource) -> CallerScope:
        if self._uses_clients:
            return CallerScope(
                scope=CLIENT_SCOPE_PREFIX + self._client_name(headers), strips_authorization=True
            )
        return CallerScope(scope=self._header_scope(headers), strips_authorization=False)

    def _client_name(self, headers: HeaderSource) -> str:
        values = headers.getall("Authorization", [])
        if len(values) != 1:
            raise Unauthorized("send exactly one 'Authorization: Bearer <client token>' header")
        scheme, _, token = values[0].strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be 'Bearer <client token>'")
        digest = hashlib.sha256(header_bytes(token.strip())).hexdigest()
        name = self._client_by_digest.get(digest)
        if name is None:
            raise Unauthorized("unknown client token")
        return name

    def _header_scope(self, headers: HeaderSource) -> str:
        # `name:value` items joined by NUL: a field value can hold no NUL, so the
        # join is unambiguous, and an ASCII credential hashes exactly as before.
        material: list[bytes] = []
        for name in self._scope_headers:
            for value in headers.getall(name, []):
                if is_credential(name, value):
                    material.append(name.lower().encode("ascii") + b":" + header_bytes(value))
        if not material:
            if not self._shared_scope:
                names = ", ".join(self._scope_headers)
                raise MissingCredentials(
                    f"send a credential ({names}): without one, this gateway has no scope "
                    "to keep your keys in"
                )
            return ANONYMOUS_SCOPE
        mac = hmac.new(self._secret, b"\x00".join(material), hashlib.sha256)
        return "hmac:" + mac.hexdigest()


class _Headers:
    """A tiny header source for the doctest."""

    def __init__(self, values: dict[str, list[str]]) -> None:
        self._values = values

    def getall(self, key: str, default: list[str]) -> list[str]:
        return self._values.get(key, default)
