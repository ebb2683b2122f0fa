"""Ask an upstream whether an effect exists: the mechanics, not the verdict.

The verdict (settle `completed`, release, or keep `unknown`) is
`gateway.engine.settle`'s. This module builds the probe request from the route's
config only (the route's `upstream_headers` plus the probe's own `headers`;
callers' credentials are never stored, so never used), sends it through the
same one-send forwarder, bounds how many probes run at once, and backs off per
operation so a retry storm cannot turn into a probe storm.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import quote

from gateway.engine.clock import SYSTEM_CLOCK, Clock
from gateway.engine.errors import GatewayError
from gateway.engine.exchange import receipt_of
from gateway.engine.models import Operation, StoredResponse

if TYPE_CHECKING:
    from gateway.config import ProbeSettings, RouteSettings
    from gateway.engine.exchange import Upstream

INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 300.0


@dataclass(frozen=True, slots=True)
class ProbeAnswer:
    """What the upstream said (`response`), or why it could not say (`error`)."""

    response: StoredResponse | None = None
    error: str | None = None


def probe_url(
    route: RouteSettings, probe: ProbeSettings, operation: Operation, forwarded: str
) -> str:
    """The probe's URL, with `{forwarded_key}`, `{key}` and `{operation_id}` URL-encoded
    in place (the config admits `{key}` and `{operation_id}` only where they equal
    the forwarded key, the value the upstream saw).

    >>> # probe_url(route, probe, op, "op_01J...")
    >>> # -> 'http://127.0.0.1:9000/v1/issues?client_ref=op_01J...'
    """
    path = probe.path.replace("{forwarded_key}", quote(forwarded, safe=""))
    path = path.replace("{key}", quote(operation.key, safe="")).replace(
        "{operation_id}", quote(operation.id, safe="")
    )
    return route.upstream + path


class Prober:
    """Sends probes with bounded concurrency and per-operation backoff."""

    def __init__(
        self, forwarder: Upstream, *, concurrency: int = 8, clock: Clock = SYSTEM_CLOCK
    ) -> None:
        self._clock = clock
        self._forwarder = forwarder
        self._slots = asyncio.Semaphore(concurrency)
        self._next_allowed: dict[str, tuple[float, float]] = {}

    def due(self, operation_id: str, now: float | None = None) -> bool:
        """False while this operation is backing off from its last probe."""
        entry = self._next_allowed.get(operation_id)
        return entry is None or (now if now is not None else self._clock.monotonic()) >= entry[0]

    def forget(self, operation_id: str) -> None:
        self._next_allowed.pop(operation_id, None)

    async def ask(self, route: RouteSettings, operation: Operation, forwarded: str) -> ProbeAnswer:
        """Ask the upstream about the effect it knows as `forwarded`."""
        probe = route.probe
        assert probe is not None
        self._back_off(operation.id)
        async with self._slots:
            try:
                reply = await self._forwarder.send(
                    route,
                    probe.method,
                    probe_url(route, probe, operation, forwarded),
                    tuple(probe.headers.items()),
                    b"",
                )
                try:
                    body = await reply.read(route.max_stored_response)
                finally:
                    reply.close()
            except GatewayError as exc:
                return ProbeAnswer(error=exc.detail)
        if body is None:
            return ProbeAnswer(error="the probe's answer was larger than max_stored_response")
        return ProbeAnswer(response=receipt_of(route, reply, body))

    def _back_off(self, operation_id: str) -> None:
        _, delay = self._next_allowed.get(operation_id, (0.0, INITIAL_BACKOFF / 2))
        delay = min(delay * 2, MAX_BACKOFF)
        self._next_allowed[operation_id] = (self._clock.monotonic() + delay, delay)
