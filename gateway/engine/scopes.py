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
What is not the credential is normalised: an `Authorization` scheme is
case-blind (`bEaRer t` is `Bearer t`) and blanks around a value are ignored,
so one credential is one scope however it is spelled (and one tenant's
quotas cannot be multiplied by respelling it). A placeholder an agent sends
when its token variable is unset (`undefined`, `null`, `None`, `nil`) is no
credential: such agents would otherwise share one scope.

Stores that kept operations before credentials were normalised
(`Store.scopes_normalised_since`) are looked up under the scope of the
exact bytes too, for one `retention` (`legacy_until`), by `settled_scope`:
no caller loses a receipt to the change.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable, Sequence
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
    legacy: str | None = None
    """The scope of the exact bytes, where it differs, while stores may still hold keys
    under it (`settled_scope`)."""

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
        return text.lower() not in PLACEHOLDERS
    scheme, credential = _split_scheme(text)
    if credential:
        return credential.lower() not in PLACEHOLDERS
    return scheme.lower() not in AUTH_SCHEMES and scheme.lower() not in PLACEHOLDERS


def _split_scheme(text: str) -> tuple[str, str]:
    """An `Authorization` value (blanks around it dropped) as its scheme and the rest, split
    at the first run of blanks; the rest is empty for a value of one word."""
    for index, char in enumerate(text):
        if char in " \t":
            return text[:index], text[index:].strip(" \t")
    return text, ""


PLACEHOLDERS = frozenset({"undefined", "null", "none", "nil"})
"""What an unset variable turns into in JavaScript, JSON, Python and Go/Ruby: no credential."""


def normalised(name: str, value: str) -> bytes:
    """A scope header's value as its scope reads it: blanks around it dropped and, for
    `Authorization`, the scheme lowercased; the credential's bytes as received.

    >>> normalised("Authorization", "  bEaRer  t0k ")
    b'bearer t0k'
    """
    text = value.strip(" \t")
    if name.lower() == "authorization":
        scheme, credential = _split_scheme(text)
        if credential:
            text = scheme.lower() + " " + credential
    return header_bytes(text)


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
        legacy_until: float = 0.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._client_by_digest = {
            digest.lower(): client.name for client in clients for digest in client.token_sha256
        }
        self._uses_clients = bool(clients)
        self._scope_headers = tuple(scope_headers)
        self._shared_scope = shared_scope
        self._secret = secret
        self._legacy_until = legacy_until
        self._clock = clock

    def resolve(self, headers: HeaderSource) -> CallerScope:
        if self._uses_clients:
            return CallerScope(
                scope=CLIENT_SCOPE_PREFIX + self._client_name(headers), strips_authorization=True
            )
        scope, legacy = self._header_scopes(headers)
        return CallerScope(scope=scope, strips_authorization=False, legacy=legacy)

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

    def _header_scopes(self, headers: HeaderSource) -> tuple[str, str | None]:
        """The scope, and the scope of the exact bytes while it may still hold keys and
        differs."""
        # `name:value` items joined by NUL: a field value can hold no NUL, so the
        # join is unambiguous.
        material: list[bytes] = []
        exact: list[bytes] = []
        for name in self._scope_headers:
            for value in headers.getall(name, []):
                if is_credential(name, value):
                    label = name.lower().encode("ascii") + b":"
                    material.append(label + normalised(name, value))
                    exact.append(label + header_bytes(value))
        if not material:
            if not self._shared_scope:
                names = ", ".join(self._scope_headers)
                raise MissingCredentials(
                    f"send a credential ({names}): without one, this gateway has no scope "
                    "to keep your keys in"
                )
            return ANONYMOUS_SCOPE, None
        scope = self._mac(material)
        if exact == material or self._clock() >= self._legacy_until:
            return scope, None
        return scope, self._mac(exact)

    def _mac(self, material: list[bytes]) -> str:
        return "hmac:" + hmac.new(self._secret, b"\x00".join(material), hashlib.sha256).hexdigest()


async def settled_scope(
    caller: CallerScope, key: str, find: Callable[[str, str], Awaitable[object | None]]
) -> CallerScope:
    """The caller's scope for `key`: the scope of the exact bytes when the key is there and
    not under the normalised scope (a key made before the upgrade, within its retention),
    else the normalised one. `find(scope, key)` is the store's `get`."""
    if caller.legacy is None or await find(caller.scope, key) is not None:
        return caller
    if await find(caller.legacy, key) is None:
        return caller
    return CallerScope(scope=caller.legacy, strips_authorization=caller.strips_authorization)


class _Headers:
    """A tiny header source for the doctest."""

    def __init__(self, values: dict[str, list[str]]) -> None:
        self._values = values

    def getall(self, key: str, default: list[str]) -> list[str]:
        return self._values.get(key, default)
