"""The tracing calls the engine and the forwarder make, and their do-nothing implementation.

Tracing is optional (the `otel` extra) and the miss path is counted in
microseconds, so code outside `gateway.telemetry` never imports OpenTelemetry
and never builds an attribute: it hands these methods the values it already
holds, and `gateway.telemetry.spans.OtelTracer` decides what a span records
(and what it never records). Off, every call returns one shared object at
once: a method call, an empty `with`, nothing allocated.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from gateway.config import RouteSettings
    from gateway.engine.exchange import LifecycleObserver, ProxyRequest
    from gateway.engine.models import Operation, State

Header = tuple[str, str]


class Span:
    """One step in progress, and what it learns before it ends; does nothing here.

    Also its own context manager, so the tracer that is off hands out one
    shared instance for every `with`.
    """

    __slots__ = ()

    def operation(self, operation: Operation) -> None:
        """The record as this step found or left it (its id, attempt and state)."""

    def state(self, state: State) -> None:
        """The record's state once this step's write is done."""

    def status(self, status: int) -> None:
        """The HTTP status the upstream answered with."""

    def __enter__(self) -> Span:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None


NO_SPAN: Final = Span()


class Tracer:
    """The spans of a protected request's steps, and the trace context sent upstream.

    This base class is tracing switched off; `gateway.telemetry.web.open_tracer`
    returns an `OtelTracer` instead when OpenTelemetry is installed and asked for.
    The request's own (server) span is the middleware's, not the engine's.
    """

    __slots__ = ()

    def claim(self, request: ProxyRequest) -> AbstractContextManager[Span]:
        """Around the store call that records the key before anything is sent."""
        return NO_SPAN

    def upstream(
        self, request: ProxyRequest, operation: Operation, method: str
    ) -> AbstractContextManager[Span]:
        """Around one attempt's call upstream, until its answer is complete (or fails)."""
        return NO_SPAN

    def record(
        self, request: ProxyRequest, operation: Operation, write: str
    ) -> AbstractContextManager[Span]:
        """Around the store write that records an attempt's outcome (`write` names it)."""
        return NO_SPAN

    def probe(self, route: RouteSettings, operation: Operation) -> AbstractContextManager[Span]:
        """Around asking the upstream about an `unknown` operation, and acting on its answer."""
        return NO_SPAN

    def inject(self, headers: list[Header]) -> list[Header]:
        """The headers to send upstream, carrying the current trace context.

        Off, they are returned as they are: a caller's `traceparent` passes
        through like any other end-to-end header, as it always has.
        """
        return headers

    def observing(self, observer: LifecycleObserver) -> LifecycleObserver:
        """The engine's observer: `observer` itself, or one that also notes events on spans."""
        return observer

    async def close(self) -> None:
        """Flush and stop what this tracer started (a provider it built); called at shutdown."""


NO_TRACER: Final = Tracer()
