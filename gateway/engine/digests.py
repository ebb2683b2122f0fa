"""Keyed digests of what a caller sent, for the history: comparable, never a confirmation.

Each attempt of a key forwards the bytes it received, and with JSON compared as
JSON two attempts of one request may send different bytes (a model that wrote
its arguments afresh). The history says which bytes each attempt sent by a
digest of them. A plain SHA-256 would let anyone who reads the history (an
operator, a backup) confirm a guess of a redacted body; this one is an HMAC
keyed by the scope secret (kept in the store, never shown) and the scope, so
it tells two attempts' bodies apart and confirms nothing.

>>> digests = Digests(b"k" * 32)
>>> a = digests.body("scope-a", b'{"amount": 7}')
>>> a == digests.body("scope-a", b'{"amount": 7}'), a == digests.body("scope-b", b'{"amount": 7}')
(True, False)
>>> a.startswith("hmac-sha256:"), len(a)
(True, 44)
"""

from __future__ import annotations

import hashlib
import hmac

__all__ = ["Digests"]

_CONTEXT = b"idempotency-gateway body digest\x00"
_HEX = 32
"""Hex digits kept: 128 bits, enough to tell bodies apart, short in a history line."""


class Digests:
    """Computes keyed body digests with the scope secret."""

    def __init__(self, secret: bytes) -> None:
        self._secret = secret

    def body(self, scope: str, body: bytes) -> str:
        """The digest of `body` as sent by a caller of `scope`."""
        key = hmac.new(self._secret, _CONTEXT + scope.encode(), hashlib.sha256).digest()
        return "hmac-sha256:" + hmac.new(key, body, hashlib.sha256).hexdigest()[:_HEX]
