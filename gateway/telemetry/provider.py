"""Which TracerProvider the gateway traces with, and the one it builds from OTEL_* variables.

In order: nothing when `OTEL_SDK_DISABLED=true`; a provider handed to
`use_tracer_provider` (an application embedding several gateways, the tests);
OpenTelemetry's global provider once anything set one (an embedding
application, `opentelemetry-instrument`); else one built from the
environment, but only when the environment asks for traces:
`OTEL_TRACES_EXPORTER`, or an OTLP endpoint. The SDK's own default (export to
localhost:4318 when nothing is set) would have every gateway without a
collector log failed exports, and forward `traceparent` headers naming spans
nobody will ever see.

A provider handed in or set globally belongs to whoever made it: used, never
shut down here. The one built here is the gateway's: shut down, its last
spans flushed, when the app stops.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from opentelemetry import trace as otel_trace

from gateway import __version__
from gateway.telemetry import attributes as attr
from gateway.telemetry.environment import exporter_names, sdk_disabled

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace.export import SpanExporter

log = logging.getLogger("gateway.telemetry")

_OTLP_PROTOCOL = "http/protobuf"

_handed_in: otel_trace.TracerProvider | None = None


def use_tracer_provider(provider: otel_trace.TracerProvider | None) -> None:
    """Trace the gateways created from now on with `provider` rather than the global one
    or the environment's; `None` goes back to those. The caller owns `provider`."""
    global _handed_in
    _handed_in = provider


@dataclass(frozen=True, slots=True)
class Choice:
    """The provider to trace with, and how to stop it when this gateway built it."""

    provider: otel_trace.TracerProvider
    shutdown: Callable[[], object] | None = None


def wanted() -> bool:
    """Whether tracing is on, building nothing: `create_app` asks it to choose its middleware."""
    if sdk_disabled():
        return False
    if _handed_in is not None or _global_provider() is not None:
        return True
    return bool(exporter_names(warn=False)) and _sdk_installed()


def choose() -> Choice | None:
    """The provider to trace with, built from the environment if need be; `None`: off."""
    if sdk_disabled():
        return None
    if _handed_in is not None:
        return Choice(_handed_in)
    provider = _global_provider()
    if provider is not None:
        return Choice(provider)
    names = exporter_names(warn=True)
    if not names:
        return None
    if not _sdk_installed():
        log.warning("OTEL_* variables ask for traces, but opentelemetry-sdk is not installed")
        return None
    return _from_environment(names)


def _sdk_installed() -> bool:
    return importlib.util.find_spec("opentelemetry.sdk") is not None


def _global_provider() -> otel_trace.TracerProvider | None:
    """OpenTelemetry's global provider, unless nobody set one (then it is a proxy that
    would only ever hand out no-op tracers)."""
    current = otel_trace.get_tracer_provider()
    return None if isinstance(current, otel_trace.ProxyTracerProvider) else current


def _from_environment(names: list[str]) -> Choice:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    # The sampler (OTEL_TRACES_SAMPLER), span limits (OTEL_SPAN_*) and batching
    # (OTEL_BSP_*) are read from the environment by the SDK's own constructors.
    provider = TracerProvider(resource=_resource(), shutdown_on_exit=False)
    for name in names:
        exporter = _exporter(name)
        if exporter is not None:
            provider.add_span_processor(BatchSpanProcessor(exporter))
    log.info(
        "tracing on: service %s, exporting with %s",
        provider.resource.attributes.get("service.name"),
        ", ".join(names),
    )
    return Choice(provider, provider.shutdown)


def _resource() -> Resource:
    """The SDK's resource (OTEL_RESOURCE_ATTRIBUTES, OTEL_SERVICE_NAME, the SDK's own
    attributes), with this gateway's name and version where the environment names none."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    from_environment = OTELResourceDetector().detect().attributes
    return Resource.create(
        {"service.name": attr.SERVICE_NAME, "service.version": __version__, **from_environment}
    )


def _exporter(name: str) -> SpanExporter | None:
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = os.environ.get(variable)
        if protocol:
            if protocol.strip() != _OTLP_PROTOCOL:
                log.warning(
                    "%s=%s: only %s is built in; exporting with it",
                    variable,
                    protocol,
                    _OTLP_PROTOCOL,
                )
            break
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    except ModuleNotFoundError:
        log.warning(
            "OTLP traces asked for, but opentelemetry-exporter-otlp-proto-http is not installed"
        )
        return None
    # Endpoint, headers, timeout, compression and certificates: OTEL_EXPORTER_OTLP_*.
    return OTLPSpanExporter()
