"""The forwarded key: the one value that tells the upstream which effect a request is.

Computed here and nowhere else, because two places use it and they must
agree: the request sent upstream carries it (as `Idempotency-Key`) and a
probe asks for it (`{forwarded_key}` in the probe path). A probe that asked
for any other value would hear "not applied" about an effect that exists,
and the key would be sent again.

It is stable for the operation's whole life (every attempt of one key
carries the same value) and, in every mode but `"key"`, different for every
scope: two tenants who both use the key `order-7` must never look like one
effect to an upstream that dedupes, records a client reference, or is
probed. The config admits `"key"` only where one scope can reach the route.

The modes (route `forward_key`):

- `"operation_id"`: the operation's id, unique across scopes by construction;
- `"scoped"`: `<label>:<key>`, readable in the upstream's logs. The label is
  the client's name with `[[clients]]` (names cannot hold `:`), otherwise 22
  base64url characters of an HMAC of the scope (the credential's digest is
  never shown to the upstream). A key that would make the value longer than
  255 characters is replaced by `~` + base64url(SHA-256(key));
- `"key"`: the caller's normalized key as it came;
- `false`: nothing (`None`).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
from typing import TYPE_CHECKING

from gateway.engine.scopes import ANONYMOUS_SCOPE, CLIENT_SCOPE_PREFIX

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.models import Operation

__all__ = ["MAX_FORWARDED_KEY", "ForwardedKeys"]

MAX_FORWARDED_KEY = 255
"""The longest forwarded key: the longest key a caller may send."""

_LABEL_CONTEXT = b"idempotency-gateway forwarded-key label\x00"
_LABEL_LENGTH = 22  # base64url characters: 132 bits of the HMAC
LABEL_CACHE = 4096
"""Scopes whose labels are kept: a bounded cache, however many scopes callers mint."""


class ForwardedKeys:
    """Computes forwarded keys; holds the scope secret that keys the HMAC labels.

    >>> from types import SimpleNamespace as Fake
    >>> keys = ForwardedKeys(b"k" * 32)
    >>> op = Fake(id="op_01", key="order-7", scope="client:agent-a")
    >>> keys.of(Fake(forward_key="scoped"), op), keys.of(Fake(forward_key="operation_id"), op)
    ('agent-a:order-7', 'op_01')
    >>> len(keys.of(Fake(forward_key="scoped"), Fake(key="order-7", scope="hmac:ab12")))
    30
    """

    def __init__(self, secret: bytes) -> None:
        self._secret = secret
        # A request asks for its forwarded key when it sends and again when it records
        # the `sent` event, and an operator's listing for every row: one HMAC per scope.
        self._label = functools.lru_cache(maxsize=LABEL_CACHE)(self._compute_label)

    def of(self, route: RouteSettings, operation: Operation) -> str | None:
        """The value the route forwards for this operation; `None` with `forward_key = false`."""
        mode = route.forward_key
        if mode == "operation_id":
            return operation.id
        if mode == "scoped":
            return self._scoped(operation.scope, operation.key)
        if mode == "key":
            return operation.key
        return None

    def _scoped(self, scope: str, key: str) -> str:
        label = self._label(scope)
        if len(label) + 1 + len(key) > MAX_FORWARDED_KEY:
            digest = hashlib.sha256(key.encode()).digest()
            key = "~" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        return f"{label}:{key}"

    def _compute_label(self, scope: str) -> str:
        if scope.startswith(CLIENT_SCOPE_PREFIX):
            return scope.removeprefix(CLIENT_SCOPE_PREFIX)
        if scope == ANONYMOUS_SCOPE:
            return scope
        mac = hmac.new(self._secret, _LABEL_CONTEXT + scope.encode(), hashlib.sha256)
        return base64.urlsafe_b64encode(mac.digest()).decode()[:_LABEL_LENGTH]
