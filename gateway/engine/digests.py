"""Keyed digests of what a caller sent: comparable, never a confirmation.

A plain SHA-256 of a request lets anyone who reads it (an operator, a
backup, the database file) confirm a guess: `"amount":"[redacted]"` next to
the fingerprint gave the amount back by brute force in 0.02 s. Everything
the store keeps or shows about a request's content is therefore an HMAC
keyed per scope: a key derived from the scope secret (kept in the store,
never shown) and the scope, so the same request from two callers gives two
values, and none of them confirms anything without the secret.

- `body`: the digest of the bytes an attempt sent (the history, the
  recorded request);
- `fingerprint`: the stored form of a fingerprint (`gateway.engine.fingerprint`
  computes the plain one, over what decides the effect);
- `derived_key`: the key of an MCP call that came without one.

A keyed fingerprint is the HMAC of the plain one, so a store that kept plain
fingerprints (before the upgrade) can key them in place without the requests:
`plain:  [v2:]sha256:<hex>`  ->  `keyed:  v2:hmac-sha256:<hex>` (or `v1:`),
the version naming the plain encoding inside.

>>> digests = Digests(b"k" * 32)
>>> a = digests.body("scope-a", b'{"amount": 7}')
>>> a == digests.body("scope-a", b'{"amount": 7}'), a == digests.body("scope-b", b'{"amount": 7}')
(True, False)
>>> a.startswith("hmac-sha256:"), len(a)
(True, 44)
>>> digests.fingerprint("scope-a", "v2:sha256:" + "0" * 64)[:15]
'v2:hmac-sha256:'
"""

from __future__ import annotations

import base64
import functools
import hmac

__all__ = [
    "KEYED_PREFIXES",
    "PLAIN_PREFIXES",
    "Digests",
    "is_keyed",
    "keyed_fingerprint",
]

_BODY_CONTEXT = b"idempotency-gateway body digest\x00"
_FINGERPRINT_CONTEXT = b"idempotency-gateway fingerprint\x00"
_DERIVED_KEY_CONTEXT = b"idempotency-gateway derived key\x00"
_HEX = 32
"""Hex digits a body digest keeps: 128 bits, enough to tell bodies apart, short in a
history line. Fingerprints keep all 64: they decide whether two requests are one."""

PLAIN_PREFIXES = {"v2:sha256:": "v2:hmac-sha256:", "sha256:": "v1:hmac-sha256:"}
"""Each plain fingerprint form, to the prefix of its keyed form."""

KEYED_PREFIXES = tuple(PLAIN_PREFIXES.values())

_SCOPE_KEYS = 4096
"""Scopes whose derived keys are kept: a bounded cache, however many scopes callers mint."""


def _scope_key(secret: bytes, context: bytes, scope: str) -> bytes:
    return hmac.digest(secret, context + scope.encode(), "sha256")


def keyed_fingerprint(secret: bytes, scope: str, plain: str) -> str:
    """The stored form of a plain fingerprint (`v2:sha256:…` or `sha256:…`) of `scope`.

    >>> keyed_fingerprint(b"k" * 32, "s", "sha256:ab")[:15]
    'v1:hmac-sha256:'
    >>> keyed_fingerprint(b"k" * 32, "s", "md5:ab")
    Traceback (most recent call last):
    ...
    ValueError: not a plain fingerprint: 'md5:ab'
    """
    return _keyed(_scope_key(secret, _FINGERPRINT_CONTEXT, scope), plain)


def _keyed(key: bytes | hmac.HMAC, plain: str) -> str:
    for plain_prefix, keyed_prefix in PLAIN_PREFIXES.items():
        if plain.startswith(plain_prefix):
            return keyed_prefix + _mac(key, plain.encode()).hexdigest()
    raise ValueError(f"not a plain fingerprint: {plain!r}")


def _mac(key: bytes | hmac.HMAC, message: bytes) -> hmac.HMAC:
    """HMAC-SHA-256 of `message`; `key` may be an HMAC already keyed (copied: a third of
    the cost of keying one afresh, which OpenSSL does on every `hmac.digest`)."""
    if isinstance(key, bytes):
        return hmac.new(key, message, "sha256")
    mac = key.copy()
    mac.update(message)
    return mac


def is_keyed(fingerprint: str) -> bool:
    """Whether a stored fingerprint is in a keyed form (else: plain, from before)."""
    return fingerprint.startswith(KEYED_PREFIXES)


class Digests:
    """Computes keyed digests, fingerprints and derived keys with the scope secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        self._key = functools.lru_cache(maxsize=_SCOPE_KEYS)(self._keyed_mac)

    def _keyed_mac(self, context: bytes, scope: str) -> hmac.HMAC:
        return hmac.new(_scope_key(self._secret, context, scope), digestmod="sha256")

    def body(self, scope: str, body: bytes) -> str:
        """The digest of `body` as sent by a caller of `scope`."""
        key = self._key(_BODY_CONTEXT, scope)
        return "hmac-sha256:" + _mac(key, body).hexdigest()[:_HEX]

    def fingerprint(self, scope: str, plain: str) -> str:
        """The stored form of `plain` (`gateway.engine.fingerprint`) for a caller of `scope`."""
        return _keyed(self._key(_FINGERPRINT_CONTEXT, scope), plain)

    def derived_key(self, scope: str, plain_key: str) -> str:
        """The keyed form of a plain derived key (`gateway.mcp.calls.derived_key`): `d:` +
        base64url(SHA-256(material)) becomes `d:` + base64url(HMAC(scope key, that
        digest)), of the same length, so no key limit moves.

        >>> plain = "d:" + "A" * 43
        >>> keyed = Digests(b"k" * 32).derived_key("s", plain)
        >>> keyed != plain, len(keyed) == len(plain), keyed.startswith("d:")
        (True, True, True)
        """
        digest = base64.urlsafe_b64decode(plain_key.removeprefix("d:") + "=")
        key = self._key(_DERIVED_KEY_CONTEXT, scope)
        mac = _mac(key, digest).digest()
        return "d:" + base64.urlsafe_b64encode(mac).rstrip(b"=").decode()
