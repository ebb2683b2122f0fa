"""OpenTelemetry tracing, optional: spans for a protected request's steps, W3C trace context.

Only this package imports OpenTelemetry, and only once tracing is asked for
(docs/operations.md, "Tracing"): the rest of the gateway calls the small
`Tracer` interface, which does nothing when tracing is off or the `otel`
extra is not installed.

- `tracer`: the interface and its do-nothing implementation (no OTel import);
- `attributes`: attribute names, and what may be recorded (no OTel import);
- `web`: the aiohttp wiring: whether tracing is on, the tracer at start-up;
- `provider`: which TracerProvider: one handed in, OTel's global one, or OTEL_*;
- `spans`: the tracer that records spans and propagates context;
- `server`: the request's server span (a middleware).
"""

from __future__ import annotations

from gateway.telemetry.tracer import NO_SPAN, NO_TRACER, Span, Tracer

__all__ = ["NO_SPAN", "NO_TRACER", "Span", "Tracer"]
