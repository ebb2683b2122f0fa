"""The request's own span: a SERVER span that continues the caller's trace.

Installed only when tracing is on (`gateway.telemetry.web.tracing_middlewares`),
between the request log and the problem middleware: the request log's
`RequestTrace` is there to read, and every error has become a response with
its status by the time the span ends. The caller's context comes from the
globally configured propagator (W3C `traceparent` and `tracestate`, and
`baggage`, by default). Health checks and scrapes get no span.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from aiohttp import web
from opentelemetry import context as otel_context
from opentelemetry import propagate
from opentelemetry.trace import SpanKind, Status, StatusCode

from gateway.engine.scopes import scope_hash
from gateway.telemetry import attributes as attr
from gateway.telemetry.spans import OtelTracer
from gateway.telemetry.web import TRACER
from gateway.web.appkeys import ROUTES, TRACE

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler
    from opentelemetry.trace import Span as OtelSpan

_QUIET = frozenset({"/healthz", "/readyz", "/metrics"})


@web.middleware
async def server_span_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    tracer = request.app[TRACER]
    if not isinstance(tracer, OtelTracer) or request.path in _QUIET:
        return await handler(request)
    method = attr.method_attributes(request.method)
    token = otel_context.attach(propagate.extract(request.headers))
    try:
        with tracer.otel.start_as_current_span(
            _name(request.method),
            kind=SpanKind.SERVER,
            attributes={**method, **_request_attributes(request)},
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            status = 500
            try:
                response = await handler(request)
                status = response.status
                return response
            except web.HTTPException as exc:
                status = exc.status
                raise
            finally:
                _finish(span, request, status)
    finally:
        otel_context.detach(token)


def _name(method: str, route: str | None = None) -> str:
    """`{method} {http.route}` as the conventions name a server span (`HTTP` for a
    method they do not know)."""
    name = method if method in attr.KNOWN_METHODS else "HTTP"
    return name if route is None else f"{name} {route}"


def _request_attributes(request: web.Request) -> attr.Attributes:
    version = request.version
    attributes: attr.Attributes = {
        attr.URL_PATH: request.path,
        attr.URL_SCHEME: request.scheme,
        attr.NETWORK_PROTOCOL_VERSION: f"{version.major}.{version.minor}",
    }
    url = request.url
    if url.host:
        attributes[attr.SERVER_ADDRESS] = url.host
    if url.port is not None:
        attributes[attr.SERVER_PORT] = url.port
    return attributes


def _finish(span: OtelSpan, request: web.Request, status: int) -> None:
    """What the request came to: its status, and what its `RequestTrace` learned."""
    attributes: attr.Attributes = {attr.HTTP_RESPONSE_STATUS_CODE: status}
    if status >= 500:  # a server span's 4xx is the caller's error, not this span's
        attributes[attr.ERROR_TYPE] = str(status)
        span.set_status(Status(StatusCode.ERROR))
    trace = request.get(TRACE)
    if trace is not None:
        if trace.route is not None:
            attributes[attr.ROUTE] = trace.route
            route = request.app[ROUTES].by_name.get(trace.route)
            if route is not None:
                attributes[attr.HTTP_ROUTE] = route.prefix
                span.update_name(_name(request.method, route.prefix))
        for name, value in (
            (attr.OUTCOME, trace.outcome),
            (attr.STATE, trace.state),
            (attr.OPERATION_ID, trace.operation_id),
            (attr.ATTEMPT, trace.attempt),
            (attr.KEY, trace.key),
            (attr.REQUEST_ID, trace.request_id),
        ):
            if value is not None:
                attributes[name] = value
        if trace.scope:
            attributes[attr.SCOPE] = scope_hash(trace.scope)
    span.set_attributes(attributes)
