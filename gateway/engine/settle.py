"""Settling `unknown` operations: a resolution, or a probe's verdict, fenced by the attempt.

An `unknown` operation may or may not have had its effect; only evidence
settles it. An operator or the agent resolves it (`applied` completes it,
`not_applied` releases its key), or the route's probe asks the upstream and
its answer is taken as a verdict, about one attempt only: a verdict about an
attempt that is no longer current is kept as evidence and changes nothing.
"Not applied" counts only once the attempt surely cannot still land.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Literal, NamedTuple

from gateway.config.routes import RouteSettings
from gateway.engine.errors import NotResolvable, PreconditionFailed, TooEarly
from gateway.engine.history import NewEvent, iso_seconds
from gateway.engine.lifecycle_events import probe_event, released_event, resolved_event
from gateway.engine.models import Evidence, Operation, Resolution, ResolvedBy, State, StoredResponse
from gateway.engine.probes import Applied, NotApplied
from gateway.store.base import OperationFilter
from gateway.telemetry.tracer import NO_TRACER, Tracer

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings, ProbeSettings
    from gateway.engine.clock import Clock
    from gateway.engine.exchange import LifecycleObserver, StoreTimer
    from gateway.engine.forwarded_key import ForwardedKeys
    from gateway.engine.graces import GraceClock
    from gateway.engine.probes import Prober, Verdict
    from gateway.store.base import Store

log = logging.getLogger("gateway.lifecycle")

Outcome = Literal["applied", "not_applied"]


class _RouteDefaults(NamedTuple):
    timeout: float
    grace: float


_ROUTE_DEFAULTS = _RouteDefaults(
    timeout=RouteSettings.model_fields["timeout"].default,
    grace=RouteSettings.model_fields["not_applied_after"].default,
)


class ReleaseWindow(NamedTuple):
    """Until when the tool may still apply an attempt's last send (store clock)."""

    sent_at: float
    may_apply_until: float


def iso_time(seconds: float) -> str:
    return iso_seconds(seconds) or ""


class Settler:
    """Settles unknown operations by resolution or by probe, and reconciles them in bulk."""

    def __init__(
        self,
        *,
        store: Store,
        prober: Prober,
        forwarded_keys: ForwardedKeys,
        settings: IdempotencySettings,
        routes: tuple[RouteSettings, ...],
        observer: LifecycleObserver,
        timed: StoreTimer,
        clock: Clock,
        graces: GraceClock,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self._store = store
        self._graces = graces
        self._prober = prober
        self._tracer = tracer
        self._forwarded_keys = forwarded_keys
        self._settings = settings
        self._routes = {route.name: route for route in routes}
        self._observer = observer
        self._timed = timed
        self._clock = clock

    async def resolve(
        self,
        operation: Operation,
        *,
        outcome: Outcome,
        by: ResolvedBy,
        response: StoredResponse | None = None,
        note: str | None = None,
        expected_version: int | None = None,
        actor: str | None = None,
        force: bool = False,
        share_with_owner: bool = False,
        probe_event: NewEvent | None = None,
    ) -> Operation:
        """Settle an `unknown` operation: `applied` completes it, `not_applied` releases it.

        The verdict is about the attempt `operation` was read at (its token): if
        a newer attempt was sent meanwhile, or someone settled it first, nothing
        changes and `NotResolvable` (or `PreconditionFailed` for a stale
        `expected_version`) says what the record is now. An `in_flight`
        operation whose lease has run out is first recorded `unknown`
        (`lease-expired`), then judged as one.

        A person's `not_applied` is refused (`TooEarly`) while the tool may still
        be applying the last send (`release_window`), unless `force` (admins
        only: the caller checks), which the history records.
        """
        if operation.lease_expired():
            await self._store.expire_orphans(owner=None)
            operation = await self._store.get_by_id(operation.id) or operation
            if expected_version is not None and operation.state is State.UNKNOWN:
                expected_version = operation.version  # the expiry is not the operator's race
        if operation.state is not State.UNKNOWN:
            raise NotResolvable(
                f"the operation is {operation.state.value}; only an unknown one can be resolved",
                key=operation.key,
                state=operation.state.value,
                operation_id=operation.id,
            )
        if expected_version is not None and operation.version != expected_version:
            raise PreconditionFailed(  # a stale view is answered first, whatever else applies
                "the operation changed since it was read (If-Match did not match)",
                key=operation.key,
                state=operation.state.value,
                operation_id=operation.id,
            )
        if outcome == "not_applied" and by in ("owner", "admin") and not force:
            await self._refuse_early_release(operation)
        events: list[NewEvent] = [] if probe_event is None else [probe_event]
        events.append(
            resolved_event(
                outcome=outcome,
                by=by,
                actor=actor or by,
                note=note,
                force=force,
                share_with_owner=share_with_owner,
            )
        )
        if outcome == "not_applied":
            events.append(released_event(f"resolved not applied by {actor or by}"))
        resolved = await self._timed(
            "resolve",
            self._store.resolve(
                operation.id,
                token=operation.token,
                expected_version=expected_version,
                state=State.COMPLETED if outcome == "applied" else State.RELEASED,
                response=response,
                resolution=Resolution(by=by, at=self._clock.time(), note=note),
                retention_seconds=self._settings.retention,
                tombstone_seconds=self._settings.tombstone_retention,
                events=events,
            ),
        )
        if resolved is None:
            current = await self._store.get_by_id(operation.id)
            if current is None or current.state is not State.UNKNOWN:
                state = current.state.value if current else "forgotten"
                raise NotResolvable(
                    f"the operation is {state} now; only an unknown one can be resolved",
                    key=operation.key,
                    state=state,
                    operation_id=operation.id,
                )
            if current.token != operation.token:
                raise NotResolvable(
                    f"the operation was retried (attempt {current.attempts}) since it was read; "
                    "look it up again before resolving",
                    key=operation.key,
                    state=current.state.value,
                    operation_id=operation.id,
                )
            raise PreconditionFailed(
                "the operation changed since it was read (If-Match did not match)",
                key=operation.key,
                state=current.state.value,
                operation_id=operation.id,
            )
        self._prober.forget(operation.id)
        self._observer.resolved(by, outcome)
        log.info(
            "resolved",
            extra={"event": "resolution", "operation_id": operation.id, "key": operation.key,
                   "by": by, "actor": actor or by, "outcome": outcome, "force": force,
                   "state": resolved.state.value},
        )  # fmt: skip
        return resolved

    def release_window(self, operation: Operation) -> ReleaseWindow | None:
        """When the tool may stop applying the current attempt's last send, as the record
        says (store clock); None for an operation that is not in flight or unknown.

        The tool may still apply a send until the route's `timeout` has passed
        since it, and until `not_applied_after` has passed since the grace anchor
        (the attempt's last lease expiry: the latest moment its holder could have
        sent or received a byte); the later of the two."""
        if operation.state not in (State.UNKNOWN, State.IN_FLIGHT):
            return None
        route = self._routes.get(operation.route)
        # A route no longer configured is judged by a route's defaults.
        timeout = route.timeout if route is not None else _ROUTE_DEFAULTS.timeout
        grace = route.not_applied_after if route is not None else _ROUTE_DEFAULTS.grace
        sent = operation.sent_at or operation.created_at
        until = max(self._last_send_bound(operation) + grace, sent + timeout + grace)
        return ReleaseWindow(sent_at=sent, may_apply_until=until)

    async def _refuse_early_release(self, operation: Operation) -> None:
        """Raise `TooEarly` unless the window closed, counted so that a step of the
        store's clock cannot shorten it (`GraceClock`)."""
        before = self._clock.monotonic()
        current = await self._store.get_by_id(operation.id) or operation
        window = self.release_window(current)
        if window is None:
            return
        waited = self._graces.elapsed_since(
            window.sent_at,
            store_now=current.observed_at,
            before=before,
            after=self._clock.monotonic(),
        )
        needed = window.may_apply_until - window.sent_at
        if waited >= needed:
            return
        left = needed - waited
        stepped = waited < current.observed_at - window.sent_at
        # Without a clock step the instant is the record's own, the same in every process.
        allowed_at = current.observed_at + left if stepped else window.may_apply_until
        error = TooEarly(
            f"attempt {current.attempts} was last sent {current.observed_at - window.sent_at:.0f} "
            f"s ago, and the tool may still be applying it until {iso_time(allowed_at)}: "
            "releasing it now could let a retry make a second effect. Check the tool again "
            "after that time",
            key=current.key,
            state=current.state.value,
            operation_id=current.id,
            retry_after=left,
        )
        error.extensions = {
            "allowed_at": iso_time(allowed_at),
            "last_send_age": round(current.observed_at - window.sent_at, 3),
        }
        raise error

    async def probe(self, operation: Operation, *, now: bool = False) -> Operation | None:
        """Ask the route's probe about an unknown operation and act on the answer.

        A verdict is about one attempt: the one current when the probe was
        sent, read afresh from the store (never from a snapshot a caller held).
        It settles the operation only while that attempt is still current (the
        resolution is fenced by its token); otherwise it is kept as evidence.
        "Not applied" counts only once `not_applied_after` passed since the
        attempt's last lease expiry, on the store's clock and, so that a step
        of that clock cannot shorten it, in this process (`GraceClock`): the
        upstream may still be applying a request it received late.
        """
        route = self._routes.get(operation.route)
        probe = route.probe if route is not None else None
        if route is None or probe is None or not (now or self._prober.due(operation.id)):
            return operation
        before = self._clock.monotonic()
        asked = await self._store.get_by_id(operation.id)
        if asked is None or asked.state is not State.UNKNOWN:
            return asked  # settled meanwhile, or forgotten (None)
        waited = self._graces.elapsed_since(
            self._last_send_bound(asked),
            store_now=asked.observed_at,
            before=before,
            after=self._clock.monotonic(),
        )
        forwarded = self._forwarded_keys.of(route, asked)
        if forwarded is None:  # the config refuses a probe on such a route
            return asked
        with self._tracer.probe(route, asked) as span:
            verdict = await self._prober.ask(route, asked, forwarded)
            if verdict.status is not None:
                span.status(verdict.status)
            probed = await self._verdict(route, probe, asked, verdict, waited)
            if probed is not None:
                span.operation(probed)
            return probed

    async def _verdict(
        self,
        route: RouteSettings,
        probe: ProbeSettings,
        asked: Operation,
        verdict: Verdict,
        waited: float,
    ) -> Operation | None:
        """Act on a probe's verdict about the attempt `asked` was read at, `waited` seconds
        after that attempt's last possible send (as `GraceClock` counts them). The
        dialect said what the answer means; when it counts is decided here, the same
        for every kind of route."""
        if isinstance(verdict, Applied):
            return await self._probe_settles(
                route, asked, "applied", verdict.receipt, status=verdict.status
            )
        if isinstance(verdict, NotApplied):
            if waited >= probe.not_applied_after:
                return await self._probe_settles(
                    route, asked, "not_applied", None, status=verdict.status
                )
            return await self._probe_evidence(
                route,
                asked,
                "not_applied_too_soon",
                f"probe answered {verdict.said} (not applied), but attempt {asked.attempts} "
                "may have been sent less than not_applied_after before; kept unknown",
                status=verdict.status,
            )
        return await self._probe_evidence(
            route, asked, verdict.result, verdict.evidence, status=verdict.status
        )

    def _last_send_bound(self, operation: Operation) -> float:
        """The latest moment, on the store's clock, the attempt's holder could have sent."""
        if operation.lease_expires_at is not None:
            return operation.lease_expires_at
        return (operation.sent_at or operation.created_at) + self._settings.lease

    async def _probe_settles(
        self,
        route: RouteSettings,
        asked: Operation,
        outcome: Outcome,
        response: StoredResponse | None,
        *,
        status: int | None,
    ) -> Operation | None:
        try:
            settled = await self.resolve(
                asked,
                outcome=outcome,
                by="probe",
                response=response,
                note=None,  # a note is a person's own words; `by` and `actor` say who
                actor="probe",
                probe_event=probe_event(outcome, status=status, detail="the probe settled it"),
            )
        except (NotResolvable, PreconditionFailed) as exc:
            return await self._probe_evidence(
                route,
                asked,
                "superseded",
                f"probe said {outcome} about attempt {asked.attempts}, which is no longer "
                f"current ({exc.detail}); kept as evidence only",
                status=status,
            )
        self._observer.probe_result(route.name, outcome)
        return settled

    async def _probe_evidence(
        self,
        route: RouteSettings,
        operation: Operation,
        result: str,
        detail: str,
        *,
        status: int | None = None,
    ) -> Operation | None:
        self._observer.probe_result(route.name, result)
        log.info(
            "probe",
            extra={"event": "probe", "operation_id": operation.id, "key": operation.key,
                   "route": route.name, "result": result, "status": status},
        )  # fmt: skip
        evidence = Evidence(at=self._clock.time(), source="probe", detail=detail, status=status)
        event = probe_event(result, status=status, detail=detail)
        await self._store.add_evidence(operation.id, evidence, (event,))
        return await self._store.get_by_id(operation.id)

    async def reconcile_unknown(self, *, batch: int = 100) -> int:
        """Probe every due unknown operation once (background sweep); count the settled."""
        settled = 0
        cursor: str | None = None
        while True:
            page = await self._store.list_operations(
                OperationFilter(state=State.UNKNOWN), limit=batch, cursor=cursor
            )
            for operation in page.items:
                route = self._routes.get(operation.route)
                if route is None or route.probe is None or not self._prober.due(operation.id):
                    continue
                probed = await self.probe(operation)
                if probed is not None and probed.state is not State.UNKNOWN:
                    settled += 1
            if page.next_cursor is None:
                return settled
            cursor = page.next_cursor
