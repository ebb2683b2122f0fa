"""The tracer that records spans: the engine's steps, with the trace context sent upstream.

Each step is a child of whatever span is current: the request's server span
(`gateway.telemetry.server`) on the request path, since the engine's task
copies the handler's context; nothing for a background probe, which then
starts a trace of its own. What a span records is decided here and in
`gateway.telemetry.attributes`, never at the call sites.

Exceptions are not recorded as events (their text may name a host, their
stack is noise): a span that fails gets `error.type` (the problem type) and
an error status with the problem's `detail`, the same words the caller gets.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from opentelemetry import propagate
from opentelemetry import trace as otel_trace
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway import __version__
from gateway.engine.errors import GatewayError
from gateway.telemetry import attributes as attr
from gateway.telemetry.tracer import Header, Span, Tracer

if TYPE_CHECKING:
    from contextlib import AbstractContextManager

    from gateway.config import RouteSettings
    from gateway.engine.exchange import LifecycleObserver, ProxyRequest
    from gateway.engine.models import Operation, State

INSTRUMENTATION_SCOPE = "idempotency-gateway"


class OtelTracer(Tracer):
    """Spans on an OpenTelemetry `TracerProvider`; `shutdown` when this gateway built it."""

    __slots__ = ("_shutdown", "otel")

    def __init__(
        self,
        provider: otel_trace.TracerProvider,
        *,
        shutdown: Callable[[], object] | None = None,
    ) -> None:
        self.otel = provider.get_tracer(INSTRUMENTATION_SCOPE, __version__)
        """The OpenTelemetry tracer itself (the server-span middleware uses it)."""
        self._shutdown = shutdown

    def claim(self, request: ProxyRequest) -> AbstractContextManager[Span]:
        return self._step("idempotency.claim", SpanKind.INTERNAL, {attr.ROUTE: request.route.name})

    def upstream(
        self, request: ProxyRequest, operation: Operation, method: str
    ) -> AbstractContextManager[Span]:
        attributes: attr.Attributes = {
            **attr.method_attributes(method),
            **attr.upstream_url_attributes(request.upstream_url),
            **_operation_attributes(request.route.name, operation),
        }
        return self._step(method, SpanKind.CLIENT, attributes, client_errors=True)

    def record(
        self, request: ProxyRequest, operation: Operation, write: str
    ) -> AbstractContextManager[Span]:
        attributes = _operation_attributes(request.route.name, operation)
        attributes[attr.WRITE] = write
        return self._step("idempotency.record", SpanKind.INTERNAL, attributes)

    def probe(self, route: RouteSettings, operation: Operation) -> AbstractContextManager[Span]:
        probe = route.probe
        assert probe is not None  # only a route with a probe is probed
        attributes: attr.Attributes = {
            **attr.server_attributes(route.upstream),
            **_operation_attributes(route.name, operation),
        }
        if probe.tool is not None:  # an MCP route: a tools/call on a session of its own
            attributes |= attr.method_attributes("POST")
            attributes[attr.MCP_METHOD_NAME] = "tools/call"
            attributes[attr.GEN_AI_TOOL_NAME] = probe.tool
        else:
            attributes |= attr.method_attributes(probe.method)
            # The path as configured: the one it is sent to names the forwarded key.
            attributes[attr.URL_TEMPLATE] = probe.path or ""
        # A "not applied" status is an answer, not an error: the verdict says what it meant.
        return self._step("idempotency.probe", SpanKind.CLIENT, attributes)

    def inject(self, headers: list[Header]) -> list[Header]:
        """The current context in the global propagator's headers (W3C `traceparent` and
        `tracestate` by default), replacing the caller's copies, which name the caller's
        span rather than this hop's."""
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        if not carrier:
            return headers
        fields = {name.lower() for name in propagate.get_global_textmap().fields}
        kept = [(name, value) for name, value in headers if name.lower() not in fields]
        return [*kept, *carrier.items()]

    def observing(self, observer: LifecycleObserver) -> LifecycleObserver:
        return SpanNotes(observer)

    async def close(self) -> None:
        if self._shutdown is not None:
            # Blocks until the last batch is exported (or its timeout): not on the loop.
            await asyncio.to_thread(self._shutdown)

    @contextmanager
    def _step(
        self,
        name: str,
        kind: SpanKind,
        attributes: attr.Attributes,
        *,
        client_errors: bool = False,
    ) -> Iterator[Span]:
        with self.otel.start_as_current_span(
            name,
            kind=kind,
            attributes=attributes,
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield RecordingSpan(span, client_errors=client_errors)
            except BaseException as exc:
                failed(span, exc)
                raise


class RecordingSpan(Span):
    """What a step learns, set on its OpenTelemetry span."""

    __slots__ = ("_client_errors", "_span")

    def __init__(self, span: otel_trace.Span, *, client_errors: bool) -> None:
        self._span = span
        self._client_errors = client_errors

    def operation(self, operation: Operation) -> None:
        self._span.set_attributes(
            {
                attr.OPERATION_ID: operation.id,
                attr.ATTEMPT: operation.attempts,
                attr.STATE: operation.state.value,
            }
        )

    def state(self, state: State) -> None:
        self._span.set_attribute(attr.STATE, state.value)

    def status(self, status: int) -> None:
        self._span.set_attribute(attr.HTTP_RESPONSE_STATUS_CODE, status)
        # The conventions' rule for a client span: 4xx and 5xx answers are errors.
        if self._client_errors and status >= 400:
            self._span.set_attribute(attr.ERROR_TYPE, str(status))
            self._span.set_status(Status(StatusCode.ERROR))


def failed(span: otel_trace.Span, error: BaseException) -> None:
    """Mark a span failed by `error`, with what a problem response would say and no more."""
    if isinstance(error, GatewayError):
        span.set_attribute(attr.ERROR_TYPE, error.problem_type)
        span.set_status(Status(StatusCode.ERROR, error.detail))
    else:
        span.set_attribute(attr.ERROR_TYPE, f"{type(error).__module__}.{type(error).__qualname__}")
        span.set_status(Status(StatusCode.ERROR))


def _operation_attributes(route: str, operation: Operation) -> attr.Attributes:
    return {
        attr.ROUTE: route,
        attr.OPERATION_ID: operation.id,
        attr.ATTEMPT: operation.attempts,
    }


class SpanNotes:
    """The engine's observer with tracing on: every call goes to the metrics observer, and
    the few facts worth reading in a trace are also noted on the span they happen in."""

    __slots__ = ("_inner",)

    def __init__(self, inner: LifecycleObserver) -> None:
        self._inner = inner

    def store_call(self, operation: str, seconds: float) -> None:
        self._inner.store_call(operation, seconds)

    def store_error(self, operation: str) -> None:
        self._inner.store_error(operation)
        otel_trace.get_current_span().add_event(
            "store unavailable", {"idempotency.store.call": operation}
        )

    def upstream_call(self, route: str, seconds: float) -> None:
        self._inner.upstream_call(route, seconds)

    def stale_write(self, route: str) -> None:
        self._inner.stale_write(route)
        otel_trace.get_current_span().add_event("stale write refused")

    def became_unknown(self, route: str, reason: str) -> None:
        self._inner.became_unknown(route, reason)
        otel_trace.get_current_span().set_attribute(attr.UNKNOWN_REASON, reason)

    def lease_expired(self, count: int) -> None:
        self._inner.lease_expired(count)

    def probe_result(self, route: str, result: str) -> None:
        self._inner.probe_result(route, result)
        otel_trace.get_current_span().set_attribute(attr.PROBE_RESULT, result)

    def late_answer(self, route: str, outcome: str) -> None:
        self._inner.late_answer(route, outcome)
        otel_trace.get_current_span().add_event("late answer", {"outcome": outcome})

    def resolved(self, by: str, outcome: str) -> None:
        self._inner.resolved(by, outcome)
        otel_trace.get_current_span().set_attributes(
            {attr.RESOLVED_BY: by, attr.RESOLUTION_OUTCOME: outcome}
        )
