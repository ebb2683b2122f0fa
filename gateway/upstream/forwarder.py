"""Send one request upstream, exactly once, and say honestly what is known.

The forwarder is where "was it sent?" is decided, so it is strict:

- it never resends by itself: aiohttp's client silently retries idempotent
  methods once when a pooled connection turns out dead, which for a proxy
  would be a second effect nobody asked for; that is switched off here and
  pinned by a test;
- it never follows redirects and never decompresses: a 3xx and a gzip body
  are answers like any other, replayed byte for byte;
- only a failure to connect (refused, DNS, TLS handshake, connect timeout)
  proves "not sent" (`UpstreamUnreachable`); anything after a connection was
  obtained is ambiguous (`UpstreamTimeout`, `UpstreamConnectionLost`);
- pooled connections are dropped after the route's `keepalive` (default 4s),
  shorter than common server idle timeouts, so a connection the server is
  about to close is not reused and does not turn into a spurious `unknown`;
- with tracing on, every request it sends (forwarded, passed through or a
  probe) carries the current trace context (`traceparent`), naming this
  hop's span rather than the caller's.

aiohttp client exceptions become the gateway's own here and nowhere else.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

import aiohttp
from yarl import URL

from gateway.engine.errors import (
    UpstreamConnectionLost,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.engine.fairness import Hold, Lane, RouteSlots
from gateway.engine.headers import GATEWAY_OWNED, Pairs
from gateway.telemetry.tracer import NO_TRACER, Tracer
from gateway.upstream.headers import end_to_end

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.exchange import UpstreamAnswer


class StdioExchange(Protocol):
    """A stdio MCP route's upstream (`gateway.mcp.stdio_upstream.StdioUpstream`)."""

    async def exchange(
        self, method: str, headers: Sequence[tuple[str, str]], body: bytes
    ) -> UpstreamAnswer: ...


_NOT_SENT = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
"""The only client errors raised before any byte of the request was written."""

_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")
"""Headers aiohttp would invent; the caller's own copies are forwarded instead."""

_READ_CHUNK = 64 * 1024


class UpstreamReply:
    """An upstream answer whose status and headers have arrived; the body is read on demand."""

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        self._response = response
        self.status = response.status
        # The gateway's own headers are the gateway's on every answer: an upstream's
        # copies never reach a caller or a receipt, so it cannot forge a replay.
        self.headers: Pairs = end_to_end(
            (
                (name.decode("latin-1"), value.decode("latin-1"))
                for name, value in response.raw_headers
            ),
            drop=GATEWAY_OWNED,
        )
        self._prefix = b""

    async def read(self, limit: int) -> bytes | None:
        """The whole body, or `None` when it exceeds `limit` (what was read is kept)."""
        chunks: list[bytes] = []
        size = 0
        content = self._response.content
        try:
            while True:
                chunk = await content.readany()
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                size += len(chunk)
                if size > limit:
                    self._prefix = b"".join(chunks)
                    return None
        except BaseException as exc:
            raise _ambiguous(exc) from exc

    async def rest(self) -> AsyncIterator[bytes]:
        """After `read` returned `None`: the bytes already read, then the remainder."""
        if self._prefix:
            yield self._prefix
            self._prefix = b""
        content = self._response.content
        while True:
            try:
                chunk = await content.readany()
            except BaseException as exc:
                raise _ambiguous(exc) from exc
            if not chunk:
                return
            yield chunk

    def close(self) -> None:
        self._response.release()


class Forwarder:
    """One client session per route (its own pool, keep-alive limit and TLS), shared by all
    requests of that route.

    >>> # forwarder = Forwarder(settings.routes); await forwarder.start()
    >>> # reply = await forwarder.send(route, "POST", url, headers, body)
    """

    def __init__(
        self,
        routes: Sequence[RouteSettings],
        *,
        tracer: Tracer = NO_TRACER,
        tenant_routes: Collection[str] = (),
        stdio: Mapping[str, StdioExchange] | None = None,
    ) -> None:
        self._tracer = tracer
        self._routes = {route.name: route for route in routes}
        self._stdio = dict(stdio or {})
        """Stdio MCP routes' upstreams by route name: their requests go there, in process."""
        self._sessions: dict[str, aiohttp.ClientSession] = {}
        self._slots = {
            route.name: RouteSlots(
                route.name, route.max_concurrency, tenants=route.name in tenant_routes
            )
            for route in routes
        }

    def gate(self, route: RouteSettings, scope: str, lane: Lane = Lane.CALLS) -> Hold:
        """A slot of the route for one upstream exchange of `scope`
        (`gateway.engine.fairness`): `with forwarder.gate(route, scope) as slot:` around
        everything the exchange needs, and `slot.keep()` for an answer streamed past it."""
        return self._slots[route.name].hold(scope, lane)

    async def start(self) -> None:
        for route in self._routes.values():
            if route.name in self._stdio:
                continue
            connector = aiohttp.TCPConnector(
                # The gate refuses past the slots, so no exchange ever waits here for a
                # connection that another holds: calls, and an MCP route's streams besides.
                limit=route.max_concurrency * (2 if route.kind == "mcp" else 1),
                keepalive_timeout=route.keepalive,
                ssl=_ssl_context(route),
            )
            session = aiohttp.ClientSession(
                connector=connector,
                auto_decompress=False,
                cookie_jar=aiohttp.DummyCookieJar(),
                skip_auto_headers=_AUTO_HEADERS,
                timeout=_timeout(route),
            )
            # aiohttp resends idempotent methods once on a dead pooled connection and
            # offers no public switch (aio-libs/aiohttp#10790); a resend is a second
            # effect. tests/test_concurrency.py::test_dropped_pooled_connection_is_never_resent
            # fails if this attribute stops working.
            session._retry_connection = False
            self._sessions[route.name] = session

    async def close(self) -> None:
        sessions, self._sessions = self._sessions, {}
        for session in sessions.values():
            await session.close()

    async def send(
        self,
        route: RouteSettings,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
        *,
        may_idle: bool = False,
    ) -> UpstreamAnswer:
        """Send the request once; raise `UpstreamUnreachable` only when nothing was sent.

        `may_idle`: the answer is a server's stream, silent for as long as the server has
        nothing to say, so the route's silence limit does not apply to it (the caller
        bounds it, with `max_stream`)."""
        stdio = self._stdio.get(route.name)
        if stdio is not None:
            return await stdio.exchange(method, headers, body)
        session = self._sessions[route.name]
        try:
            response = await session.request(
                method,
                # Exactly the bytes gateway.proxy.routing judged: no re-encoding of the path.
                URL(url, encoded=True),
                headers=self._tracer.inject(_with_route_headers(headers, route.upstream_headers)),
                data=body if body or method not in ("GET", "HEAD") else None,
                allow_redirects=False,
                compress=None,
                timeout=_idle_stream(route) if may_idle else session.timeout,
            )
        except _NOT_SENT as exc:
            raise UpstreamUnreachable(
                f"could not connect to the upstream of route {route.name!r}; nothing was sent",
                internal=str(exc),
            ) from exc
        except BaseException as exc:
            raise _ambiguous(exc) from exc
        return UpstreamReply(response)


def _timeout(route: RouteSettings) -> aiohttp.ClientTimeout:
    """HTTP routes: `timeout` bounds the whole exchange. MCP routes: it bounds the
    silence between bytes (servers send `: ping` on long calls, and a server
    stream lives as long as its session); a protected call's total is `max_call`,
    enforced by the engine."""
    if route.kind == "mcp":
        return aiohttp.ClientTimeout(total=None, connect=route.timeout, sock_read=route.timeout)
    return aiohttp.ClientTimeout(total=route.timeout)


def _idle_stream(route: RouteSettings) -> aiohttp.ClientTimeout:
    """A server stream: connecting is bounded, silence is not."""
    return aiohttp.ClientTimeout(total=None, connect=route.timeout, sock_read=None)


def _with_route_headers(
    headers: Sequence[tuple[str, str]], route_headers: Mapping[str, str]
) -> list[tuple[str, str]]:
    if not route_headers:
        return list(headers)
    overridden = {name.lower() for name in route_headers}
    merged = [(name, value) for name, value in headers if name.lower() not in overridden]
    merged.extend(route_headers.items())
    return merged


def _ambiguous(exc: BaseException) -> BaseException:
    """Translate a failure after the connection was obtained: the effect may exist."""
    if isinstance(exc, asyncio.CancelledError):
        return exc
    if isinstance(exc, asyncio.TimeoutError):
        return UpstreamTimeout("the upstream did not answer completely in time")
    if isinstance(exc, aiohttp.ClientError | OSError):
        return UpstreamConnectionLost(
            "the upstream connection failed before a complete answer", internal=str(exc)
        )
    return exc


def _ssl_context(route: RouteSettings) -> ssl.SSLContext | bool:
    if route.tls_ca is None and route.tls_client_cert is None:
        return True
    context = ssl.create_default_context(cafile=str(route.tls_ca) if route.tls_ca else None)
    if route.tls_client_cert is not None:
        context.load_cert_chain(
            str(route.tls_client_cert),
            str(route.tls_client_key) if route.tls_client_key else None,
        )
    return context
