"""The headers the idempotency protocol itself reads and writes, as plain pairs.

The engine adds the forwarded key to the request it sends, keeps a receipt's
headers minus the route's redactions, and every front end names the same
`Idempotency-*` headers on its answers: one definition here, free of any HTTP
library, so the engine and the front ends cannot drift apart. Which headers
may cross a hop at all is the upstream client's business
(`gateway.upstream.headers`).
"""

from __future__ import annotations

from collections.abc import Iterable

Pairs = tuple[tuple[str, str], ...]

IDEMPOTENCY_KEY = "Idempotency-Key"
IDEMPOTENCY_STATUS = "Idempotency-Status"
IDEMPOTENT_REPLAYED = "Idempotent-Replayed"
IDEMPOTENCY_RECEIPT_SOURCE = "Idempotency-Receipt-Source"
"""On a replay: `upstream`, `probe` or `operator` (`gateway.engine.models.RECEIPT_SOURCES`)."""
IDEMPOTENCY_SIMILAR = "Idempotency-Similar"
"""On a live answer: the lookup URL of a completed operation with the same request under
another key (`gateway.engine.twins`), so a client can warn."""

GATEWAY_OWNED: frozenset[str] = frozenset(
    {
        "idempotency-key",
        "idempotency-status",
        "idempotent-replayed",
        "idempotency-similar",
        "idempotency-distinct",
    }
)
"""Headers the gateway sets itself on answers that concern a key (and the caller's
distinct marker): an upstream's copies are dropped."""


def header_value(pairs: Iterable[tuple[str, str]], name: str) -> str | None:
    """The first value of header `name` (any case) among `pairs`; None without one.

    >>> header_value([("Content-Type", "text/event-stream")], "content-type")
    'text/event-stream'
    """
    lowered = name.lower()
    for key, value in pairs:
        if key.lower() == lowered:
            return str(value)
    return None


def without(pairs: Iterable[tuple[str, str]], names: frozenset[str]) -> Pairs:
    """The pairs minus the (lower-case) `names`: for headers already `end_to_end`.

    >>> without([("Set-Cookie", "a"), ("X-B", "2")], frozenset({"set-cookie"}))
    (('X-B', '2'),)
    """
    return tuple((name, value) for name, value in pairs if name.lower() not in names)
