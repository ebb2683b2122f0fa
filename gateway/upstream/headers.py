"""Which headers cross a hop: hop-by-hop, framing, and the forwarding trail.

Pure functions over header pairs, so the forwarder, the resolve body's
validation and the tests share one definition of "hop-by-hop". The headers
the idempotency protocol itself owns (`Idempotency-*`) and the pair type are
the engine's (`gateway.engine.headers`).
"""

from __future__ import annotations

from collections.abc import Iterable

from gateway.engine.headers import Pairs

HOP_BY_HOP: frozenset[str] = frozenset(
    {
        "connection",  # RFC 9110 7.6.1: describes this connection only
        "keep-alive",  # connection management, meaningless on the next hop
        "proxy-connection",  # non-standard twin of Connection sent by old clients
        "proxy-authenticate",  # addressed to the proxy, not the origin
        "proxy-authorization",  # the caller's credential for this proxy
        "te",  # transfer codings the sender accepts on this hop
        "trailer",  # announces trailers of this hop's chunked framing
        "transfer-encoding",  # framing is re-done by each hop
        "upgrade",  # protocol switches are per connection; the gateway never upgrades
    }
)
"""Headers that describe one connection and must not be forwarded (RFC 9110 7.6.1)."""

FRAMING: frozenset[str] = frozenset({"content-length"})
"""Recomputed by aiohttp from the body it sends; a stale copy would corrupt framing."""


def connection_tokens(pairs: Iterable[tuple[str, str]]) -> frozenset[str]:
    """Header names the sender listed in `Connection`: hop-by-hop for this message too."""
    tokens: set[str] = set()
    for name, value in pairs:
        if name.lower() == "connection":
            tokens.update(t.strip().lower() for t in value.split(",") if t.strip())
    return frozenset(tokens)


def end_to_end(pairs: Iterable[tuple[str, str]], *, drop: frozenset[str] = frozenset()) -> Pairs:
    """The pairs minus hop-by-hop, framing, `Connection`-listed and `drop` headers.

    >>> end_to_end([("Connection", "x-a"), ("X-A", "1"), ("X-B", "2"), ("TE", "gzip")])
    (('X-B', '2'),)
    """
    pairs = tuple(pairs)
    excluded = HOP_BY_HOP | FRAMING | connection_tokens(pairs) | drop
    return tuple((name, value) for name, value in pairs if name.lower() not in excluded)


def forwarded_for(existing: str | None, client_ip: str | None) -> str | None:
    """Append the caller's address to `X-Forwarded-For`, keeping earlier hops."""
    if not client_ip:
        return existing
    return f"{existing}, {client_ip}" if existing else client_ip


def _quoted(value: str) -> str:
    """An RFC 7230 quoted-string: the caller's `Host` may carry quotes meant to forge hops."""
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def forwarded(existing: str | None, client_ip: str | None, host: str | None, proto: str) -> str:
    r"""Append this hop to the RFC 7239 `Forwarded` header.

    >>> print(forwarded(None, "10.0.0.1", 'x", for=6.6.6.6', "http"))
    for=10.0.0.1;host="x\", for=6.6.6.6";proto=http
    """
    parts = []
    if client_ip:
        node = _quoted(f"[{client_ip}]") if ":" in client_ip else client_ip
        parts.append(f"for={node}")
    if host:
        parts.append(f"host={_quoted(host)}")
    parts.append(f"proto={proto}")
    element = ";".join(parts)
    return f"{existing}, {element}" if existing else element
