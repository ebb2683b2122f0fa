"""Ask an upstream whether an effect exists: the mechanics, and what an answer says.

What to do about an answer (settle `completed`, release, or keep `unknown`)
is `gateway.engine.settle`'s, and it is the same for every kind of route: a
verdict is about one attempt, and "not applied" counts only after the
route's grace. How to ask and how to read the answer differ by route kind,
so each kind has its `ProbeDialect`: an HTTP route's probe is a request
judged by its status (`HttpProbe`, here), an MCP route's is a tool call
judged by a value in its result (`gateway.mcp.probe.McpProbe`). Every
dialect answers one of three `Verdict`s: applied (with the receipt to
keep), not applied, or none (with the evidence that says why).

A probe is built from the route's config only (the route's
`upstream_headers` plus the probe's own `headers`; callers' credentials are
never stored, so never used) and sent through the same one-send forwarder.
`Prober` bounds how many probes run at once and backs off per operation, so
a retry storm cannot turn into a probe storm.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import TYPE_CHECKING, Any, Literal, Protocol
from urllib.parse import quote

from gateway.engine.clock import SYSTEM_CLOCK, Clock
from gateway.engine.errors import GatewayError
from gateway.engine.exchange import receipt_of
from gateway.engine.models import Operation, StoredResponse
from gateway.engine.recorded_request import redacted_target

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from gateway.config import ProbeSettings, RouteSettings
    from gateway.engine.exchange import Upstream

__all__ = [
    "INITIAL_BACKOFF",
    "MAX_BACKOFF",
    "Applied",
    "HttpProbe",
    "NoVerdict",
    "NotApplied",
    "ProbeDialect",
    "Prober",
    "Verdict",
    "probe_url",
]

INITIAL_BACKOFF = 1.0
MAX_BACKOFF = 300.0


@dataclass(frozen=True, slots=True)
class Applied:
    """The effect exists; `receipt` is what retries are answered with from now on."""

    receipt: StoredResponse
    said: str
    """What the upstream answered, in words for the log ("200", "find_ticket: /found = true")."""
    status: int | None = None
    asked: dict[str, Any] | None = None
    """The request the probe made, secrets redacted (`ProbeDialect.request_of`)."""
    result: Any = None
    """What the answer said beyond its status (an MCP tool's `structuredContent`)."""
    dated: float | None = None
    """When the upstream says the effect was made (POSIX seconds; HTTP `Last-Modified`)."""


@dataclass(frozen=True, slots=True)
class NotApplied:
    """The upstream has no such effect (it may still be applying a late send: the settler
    waits for the route's `not_applied_after` before it believes this)."""

    said: str
    """What the upstream answered, in words for the evidence ("404")."""
    status: int | None = None
    asked: dict[str, Any] | None = None
    result: Any = None


@dataclass(frozen=True, slots=True)
class NoVerdict:
    """The answer says neither: it is kept as evidence and the operation stays `unknown`.

    `result` is `error` when no answer came (a connection refused, a timeout),
    `inconclusive` when one came that says neither.
    """

    result: Literal["error", "inconclusive"]
    evidence: str
    status: int | None = None
    asked: dict[str, Any] | None = None
    answer: Any = None


Verdict = Applied | NotApplied | NoVerdict


class ProbeDialect(Protocol):
    """How one kind of route asks its upstream about an effect, and what the answer says."""

    async def ask(
        self,
        upstream: Upstream,
        route: RouteSettings,
        probe: ProbeSettings,
        operation: Operation,
        forwarded: str,
    ) -> Verdict:
        """Ask about the effect the upstream knows as `forwarded`; never raise a
        `GatewayError` (a failure is a `NoVerdict` that says what failed)."""

    def request_of(
        self, route: RouteSettings, probe: ProbeSettings, operation: Operation, forwarded: str
    ) -> dict[str, Any]:
        """The request `ask` makes, as the history shows it: method and path (HTTP) or tool
        and arguments (MCP), with the route's `redact_request` names redacted."""

    def may_sample(self, operation: Operation) -> bool:
        """Whether a completed operation (2xx from the upstream) may stand as a calibration
        sample: the effect it proves happened (an MCP result that is not an error)."""


def probe_url(
    route: RouteSettings, probe: ProbeSettings, operation: Operation, forwarded: str
) -> str:
    """The probe's URL, with `{forwarded_key}`, `{key}` and `{operation_id}` URL-encoded
    in place (the config admits `{key}` and `{operation_id}` only where they equal
    the forwarded key, the value the upstream saw).

    >>> # probe_url(route, probe, op, "op_01J...")
    >>> # -> 'http://127.0.0.1:9000/v1/issues?client_ref=op_01J...'
    """
    assert probe.path is not None  # the config requires it on an HTTP route
    path = probe.path.replace("{forwarded_key}", quote(forwarded, safe=""))
    path = path.replace("{key}", quote(operation.key, safe="")).replace(
        "{operation_id}", quote(operation.id, safe="")
    )
    return route.upstream + path


class HttpProbe:
    """An HTTP route's probe: `method path`, judged by the answer's status."""

    async def ask(
        self,
        upstream: Upstream,
        route: RouteSettings,
        probe: ProbeSettings,
        operation: Operation,
        forwarded: str,
    ) -> Verdict:
        try:
            reply = await upstream.send(
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
            return NoVerdict("error", f"probe failed: {exc.detail}")
        if body is None:
            return NoVerdict(
                "error", "probe failed: the probe's answer was larger than max_stored_response"
            )
        status = reply.status
        if status in probe.applied_statuses:
            dated = _last_modified(reply.headers)
            receipt = receipt_of(route, reply, body)
            return Applied(receipt, said=str(status), status=status, dated=dated)
        if status in probe.not_applied_statuses:
            return NotApplied(said=str(status), status=status)
        return NoVerdict(
            "inconclusive",
            f"probe answered {status}, neither applied nor not applied",
            status=status,
        )

    def may_sample(self, operation: Operation) -> bool:
        return True

    def request_of(
        self, route: RouteSettings, probe: ProbeSettings, operation: Operation, forwarded: str
    ) -> dict[str, Any]:
        target = probe_url(route, probe, operation, forwarded).removeprefix(route.upstream)
        return {"method": probe.method, "path": redacted_target(target, route.redact_request)}


def _last_modified(headers: Sequence[tuple[str, str]]) -> float | None:
    """The answer's `Last-Modified`, as POSIX seconds (None when absent or unreadable)."""
    for name, value in headers:
        if name.lower() == "last-modified":
            try:
                return parsedate_to_datetime(value).timestamp()
            except (TypeError, ValueError, IndexError):
                return None
    return None


class Prober:
    """Sends probes with bounded concurrency and per-operation backoff, in the dialect of
    each route's kind (`http` always; others as given, e.g. `{"mcp": McpProbe()}`)."""

    def __init__(
        self,
        forwarder: Upstream,
        *,
        dialects: Mapping[str, ProbeDialect] | None = None,
        concurrency: int = 8,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._clock = clock
        self._forwarder = forwarder
        self._dialects: dict[str, ProbeDialect] = {"http": HttpProbe(), **(dialects or {})}
        self._slots = asyncio.Semaphore(concurrency)
        self._next_allowed: dict[str, tuple[float, float]] = {}

    def due(self, operation_id: str, now: float | None = None) -> bool:
        """False while this operation is backing off from its last probe."""
        entry = self._next_allowed.get(operation_id)
        return entry is None or (now if now is not None else self._clock.monotonic()) >= entry[0]

    def forget(self, operation_id: str) -> None:
        self._next_allowed.pop(operation_id, None)

    def may_sample(self, route: RouteSettings, operation: Operation) -> bool:
        """Whether the route's dialect takes `operation` as a calibration sample."""
        dialect = self._dialects.get(route.kind)
        return dialect is not None and dialect.may_sample(operation)

    async def ask(self, route: RouteSettings, operation: Operation, forwarded: str) -> Verdict:
        """Ask the upstream about the effect it knows as `forwarded`."""
        probe = route.probe
        assert probe is not None
        dialect = self._dialects.get(route.kind)
        if dialect is None:  # a wiring mistake, not the upstream's answer
            return NoVerdict("error", f"probe failed: no probe dialect for {route.kind} routes")
        self._back_off(operation.id)
        async with self._slots:
            verdict = await dialect.ask(self._forwarder, route, probe, operation, forwarded)
        asked = dialect.request_of(route, probe, operation, forwarded)
        return dataclasses.replace(verdict, asked=asked)

    def _back_off(self, operation_id: str) -> None:
        _, delay = self._next_allowed.get(operation_id, (0.0, INITIAL_BACKOFF / 2))
        delay = min(delay * 2, MAX_BACKOFF)
        self._next_allowed[operation_id] = (self._clock.monotonic() + delay, delay)
