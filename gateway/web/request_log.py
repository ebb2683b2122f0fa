"""One structured log line per request, and the request id that ties lines together.

The line (`gateway.web.access_log`) carries route, method, path, outcome,
state, status, upstream and total latency, the key, a short hash of the scope
and the request id. It never carries a credential or a body: handlers only
ever put those facts into the request's `RequestTrace`.
"""

from __future__ import annotations

import secrets
import time

from aiohttp import web
from aiohttp.typedefs import Middleware

from gateway.engine.exchange import RequestTrace
from gateway.engine.request_lines import LOGGED_OUTCOMES, RequestLine
from gateway.web.access_log import AccessLog
from gateway.web.appkeys import METRICS, REQUESTS, TRACE
from gateway.web.problems import Handler

_QUIET = frozenset({"/healthz", "/readyz", "/metrics"})
REQUEST_ID = "X-Request-Id"
_MAX_REQUEST_ID = 128


def _request_id(request: web.Request) -> str:
    """The caller's `X-Request-Id` if sane, else 64 random bits in hex.

    Not a counter: two ids a caller sees would tell how many requests other
    callers made in between (security review, finding 7). A read of the
    kernel's generator is about a microsecond; a UUID object costs more."""
    offered = request.headers.get(REQUEST_ID, "")
    if 0 < len(offered) <= _MAX_REQUEST_ID and offered.isascii() and offered.isprintable():
        return offered
    return secrets.token_hex(8)


def request_logging(access: AccessLog | None) -> Middleware:
    """The middleware that gives every request its id and, with an access log (`info`
    and `debug`), its line (`gateway.web.access_log`)."""

    @web.middleware
    async def request_log_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        trace = RequestTrace(request_id=_request_id(request))
        request[TRACE] = trace
        status = 500
        try:
            response = await handler(request)
            status = response.status
            response.headers[REQUEST_ID] = trace.request_id
            return response
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            elapsed = time.monotonic() - started
            if trace.route is not None:
                request.app[METRICS].request_time(trace.route, elapsed)
                _note_keyed(request, trace, status)
            if access is not None and request.path not in _QUIET:
                access.request(trace, request.method, request.path, status, elapsed=elapsed)

    return request_log_middleware


_LOGGED = frozenset(LOGGED_OUTCOMES)


def _note_keyed(request: web.Request, trace: RequestTrace, status: int) -> None:
    """A request that carried a key, answered about its operation: a line of the key's
    request log (`gateway.engine.request_lines`), buffered, never waited on."""
    if trace.key is None or trace.operation_id is None or trace.outcome not in _LOGGED:
        return
    recorder = request.app.get(REQUESTS)
    if recorder is None:
        return
    line = RequestLine(
        at=time.time(),
        request_id=trace.request_id,
        status=trace.problem_status or status,
        outcome=trace.outcome,
        replayed=trace.outcome == "replayed",
        problem=trace.problem,
    )
    recorder.add(trace.operation_id, line)
