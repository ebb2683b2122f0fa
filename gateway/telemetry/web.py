"""Tracing in the aiohttp app: the server-span middleware, and the tracer the engine gets.

`create_app` asks `tracing_middlewares()` once: with tracing off it gets an
empty list, so a request pays nothing at all for the server span. The app's
`cleanup_ctx` calls `open_tracer()` at start-up and `Tracer.close()` at
shutdown. OpenTelemetry is imported only when tracing may be on
(`_may_be_on`), and only if installed: without the `otel` extra, or without
an environment that asks for traces, tracing is off and costs no import.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
from typing import TYPE_CHECKING

from aiohttp import web

from gateway.telemetry import environment
from gateway.telemetry.tracer import NO_TRACER, Tracer

if TYPE_CHECKING:
    from aiohttp.typedefs import Middleware

log = logging.getLogger("gateway.telemetry")

TRACER = web.AppKey("tracer", Tracer)
"""The app's tracer, set at start-up (`NO_TRACER` when tracing is off)."""


def tracing_middlewares() -> list[Middleware]:
    """`[the server-span middleware]` when tracing is on, else `[]`."""
    if not _may_be_on(warn=False):
        return []
    from gateway.telemetry.provider import wanted

    if not wanted():
        return []
    from gateway.telemetry.server import server_span_middleware

    return [server_span_middleware]


def open_tracer() -> Tracer:
    """The tracer for this app's engine and forwarder: `NO_TRACER` unless tracing is on
    (docs/operations.md, "Tracing"); close it when the app stops."""
    if not _may_be_on(warn=True):
        return NO_TRACER
    from gateway.telemetry.provider import choose
    from gateway.telemetry.spans import OtelTracer

    choice = choose()
    if choice is None:
        return NO_TRACER
    return OtelTracer(choice.provider, shutdown=choice.shutdown)


def _may_be_on(*, warn: bool) -> bool:
    """Whether tracing can be on, decided without importing OpenTelemetry when it is off.

    A provider can only have been handed in (`use_tracer_provider`) or set
    globally by code that imported OpenTelemetry already; otherwise only the
    environment can ask for traces. `gateway.telemetry.provider` decides the rest.
    """
    if environment.sdk_disabled():
        return False
    if "opentelemetry.trace" in sys.modules:
        return True
    asks = environment.names_a_provider() or bool(environment.exporter_names(warn=False))
    if asks and not _otel_installed():
        if warn:
            log.warning(
                "OTEL_* variables ask for traces, but the otel extra is not installed "
                "(pip install 'idempotency-gateway[otel]'); tracing is off"
            )
        return False
    return asks


def _otel_installed() -> bool:
    try:
        return importlib.util.find_spec("opentelemetry.trace") is not None
    except ModuleNotFoundError:  # not even the `opentelemetry` namespace
        return False
