"""What the OTEL_* environment variables ask of tracing, read without importing OpenTelemetry.

Kept apart from `gateway.telemetry.provider` so a gateway whose environment
asks for nothing decides "off" without paying for the OpenTelemetry import
(about 50 ms at start-up).
"""

from __future__ import annotations

import logging
import os
from typing import Final

log = logging.getLogger("gateway.telemetry")

EXPORTERS: Final = ("otlp", "console")
"""`OTEL_TRACES_EXPORTER` values built in (`none`, alone, turns tracing off)."""

_ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


def sdk_disabled() -> bool:
    """`OTEL_SDK_DISABLED=true` (any case): no tracing at all, whoever set up a provider."""
    return os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def names_a_provider() -> bool:
    """`OTEL_PYTHON_TRACER_PROVIDER`: OpenTelemetry loads that global provider itself."""
    return bool(os.environ.get("OTEL_PYTHON_TRACER_PROVIDER"))


def exporter_names(*, warn: bool) -> list[str]:
    """The exporters the environment asks for: `OTEL_TRACES_EXPORTER` (comma-separated),
    else `otlp` when an OTLP endpoint is set. Unknown names are ignored with a warning,
    as the OpenTelemetry specification asks of an unknown enum value."""
    names = [
        name.strip().lower()
        for name in os.environ.get("OTEL_TRACES_EXPORTER", "").split(",")
        if name.strip()
    ]
    if not names:
        return ["otlp"] if any(os.environ.get(name) for name in _ENDPOINTS) else []
    if warn:
        for name in names:
            if name not in (*EXPORTERS, "none"):
                log.warning(
                    "OTEL_TRACES_EXPORTER: %r is not built in (only %s); ignored",
                    name,
                    ", ".join((*EXPORTERS, "none")),
                )
    return [name for name in names if name in EXPORTERS]
