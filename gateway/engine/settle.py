"""Settling `unknown` operations: a resolution, or a probe's verdict, fenced by the attempt.

An `unknown` operation may or may not have had its effect; only evidence
settles it. An operator or the agent resolves it (`applied` completes it,
`not_applied` releases its key), or the route's probe asks the upstream and
its answer is taken as a verdict, about one attempt only: a verdict about an
attempt that is no longer current is kept as evidence and changes nothing.
"Not applied" counts only once the attempt surely cannot still land.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import TYPE_CHECKING, Any, Literal, NamedTuple

from gateway.config.routes import RouteSettings
from gateway.engine.errors import NotResolvable, PreconditionFailed, TooEarly
from gateway.engine.history import OPERATOR, NewEvent, iso_seconds
from gateway.engine.lifecycle_events import (
    probe_blind_event,
    probe_event,
    receipt_attached_event,
    released_event,
    resolved_event,
)
from gateway.engine.models import Evidence, Operation, Resolution, ResolvedBy, State, StoredResponse
from gateway.engine.probes import Applied, NotApplied
from gateway.store.base import OperationFilter
from gateway.telemetry.tracer import NO_TRACER, Tracer

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings
    from gateway.engine.calibrator import Admission, Calibrator
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
    max_call: float
    grace: float


_ROUTE_DEFAULTS = _RouteDefaults(
    timeout=RouteSettings.model_fields["timeout"].default,
    max_call=RouteSettings.model_fields["max_call"].default,
    grace=RouteSettings.model_fields["not_applied_after"].default,
)


def whole_call_limit(route: RouteSettings | None, operation: Operation) -> float:
    """The longest one attempt's exchange may last: how long after its send the tool may
    still be applying it. HTTP: `timeout`, a total deadline. MCP: `max_call` (its
    `timeout` is only a silence limit between bytes). A route no longer configured is
    judged by its kind's defaults."""
    if route is None:
        mcp = operation.method == "tools/call"
        return _ROUTE_DEFAULTS.max_call if mcp else _ROUTE_DEFAULTS.timeout
    return route.max_call if route.kind == "mcp" else route.timeout


class ProbeNotCalibrated(Exception):
    """A probe's release refused by the store: the kind's calibration row no longer admits
    it as the releasing transaction read it (another worker found the probe blind)."""


_SCHEDULE_SLACK = 0.05
"""Seconds past the instant a release becomes allowed at which the scheduled probe runs."""


class ReleaseWindow(NamedTuple):
    """Until when the tool may still apply an attempt's last send (store clock)."""

    sent_at: float
    may_apply_until: float

    @property
    def length(self) -> float:
        """Seconds from the attempt's start to the end of the window."""
        return self.may_apply_until - self.sent_at


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
        calibrator: Calibrator,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self._store = store
        self._graces = graces
        self._calibrator = calibrator
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[None]] = set()
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
        calibrated: tuple[str, str] | None = None,
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
            # Owners read this detail: an admin is "an operator" there, never a name.
            who = OPERATOR if by == "admin" else by
            events.append(released_event(f"resolved not applied by {who}"))
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
                calibrated=calibrated,
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
            if calibrated is not None:
                raise ProbeNotCalibrated(operation.id)
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

    async def attach(
        self,
        operation: Operation,
        response: StoredResponse,
        *,
        note: str,
        actor: str,
        expected_version: int | None = None,
        share_with_owner: bool = False,
    ) -> Operation:
        """Attach the receipt an owner's or operator's `applied` went without: retries got
        `409 receipt-not-retained`, and get this response from now on. Once: a
        settlement is otherwise final, and a receipt is never replaced."""
        event = receipt_attached_event(
            actor=actor, status=response.status, note=note, share_with_owner=share_with_owner
        )
        attached = await self._timed(
            "attach_receipt",
            self._store.attach_receipt(
                operation.id,
                response,
                expected_version=expected_version,
                body_retained=True,
                retention_seconds=self._settings.retention,
                tombstone_seconds=self._settings.tombstone_retention,
                events=(event,),
            ),
        )
        if attached is None:
            # The store alone decides what may take a receipt (`rows.ATTACHABLE`): refused,
            # say why from the row as it is now.
            current = await self._store.get_by_id(operation.id) or operation
            if expected_version is not None and current.version != expected_version:
                raise PreconditionFailed(
                    "the operation changed since it was read (If-Match did not match)",
                    key=operation.key,
                    state=current.state.value,
                    operation_id=operation.id,
                )
            raise NotResolvable(_NOT_ATTACHABLE, key=operation.key,
                                state=current.state.value, operation_id=operation.id)  # fmt: skip
        log.info(
            "receipt attached",
            extra={"event": "receipt_attached", "operation_id": operation.id,
                   "key": operation.key, "actor": actor, "status": response.status},
        )  # fmt: skip
        return attached

    def release_window(
        self, operation: Operation, *, grace: float | None = None
    ) -> ReleaseWindow | None:
        """Until when the tool may still apply the current attempt's last send, as the
        record says (store clock); None for an operation that is not in flight or unknown.

        A send may still land until the whole-call limit (`whole_call_limit`) has
        passed since it. The store knows when the attempt was claimed
        (`sent_at`), not when its first byte was handed over; the holder sends
        only within the lease the claim granted, so that lease's expiry is the
        latest moment of the send: (a) is that plus the whole-call limit. A
        holder paused past its lease (a VM pause, a stall) may still be reading
        the answer: (b) is the attempt's last lease expiry, the latest moment it
        held the key. The window closes `grace` (the route's
        `not_applied_after`, or a probe's own) after the later of the two.
        """
        if operation.state not in (State.UNKNOWN, State.IN_FLIGHT):
            return None
        route = self._routes.get(operation.route)
        if grace is None:
            grace = route.not_applied_after if route is not None else _ROUTE_DEFAULTS.grace
        sent = operation.sent_at or operation.created_at
        handed_over_by = sent + self._settings.lease
        last_lease = operation.lease_expires_at or handed_over_by
        until = max(handed_over_by + whole_call_limit(route, operation), last_lease) + grace
        return ReleaseWindow(sent_at=sent, may_apply_until=until)

    async def _refuse_early_release(self, operation: Operation) -> None:
        """Raise `TooEarly` unless the window closed, counted so that a step of the
        store's clock cannot shorten it (`GraceClock`)."""
        before = self._clock.monotonic()
        current = await self._store.get_by_id(operation.id) or operation
        window = self.release_window(current)
        if window is None:
            return
        waited = self._waited(window, current, before)
        if waited >= window.length:
            return
        left = window.length - waited
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

    def _waited(self, window: ReleaseWindow, current: Operation, before: float) -> float:
        """Seconds that surely passed since the attempt began, as read at `current` (whose
        read began at monotonic `before`): a witness of the store's clock (`GraceClock`)."""
        return self._graces.elapsed_since(
            window.sent_at,
            store_now=current.observed_at,
            before=before,
            after=self._clock.monotonic(),
        )

    async def probe(self, operation: Operation, *, now: bool = False) -> Operation | None:
        """Ask the route's probe about an unknown operation and act on the answer.

        A verdict is about one attempt: the one current when the probe was
        sent, read afresh from the store (never from a snapshot a caller held).
        It settles the operation only while that attempt is still current (the
        resolution is fenced by its token); otherwise it is kept as evidence.
        "Not applied" releases only an operation the probe is declared for and
        calibrated to see (`gateway.engine.calibrator`), and only once the tool
        can no longer apply the attempt's last send (`release_window`, counted so
        that a step of the store's clock cannot shorten it: `GraceClock`).
        """
        route = self._routes.get(operation.route)
        probe = route.probe if route is not None else None
        if route is None or probe is None or not (now or self._prober.due(operation.id)):
            return operation
        before = self._clock.monotonic()
        asked = await self._store.get_by_id(operation.id)
        if asked is None or asked.state is not State.UNKNOWN:
            return asked  # settled meanwhile, or forgotten (None)
        window = self.release_window(asked, grace=probe.not_applied_after)
        assert window is not None  # unknown
        left = window.length - self._waited(window, asked, before)
        forwarded = self._forwarded_keys.of(route, asked)
        if forwarded is None:  # the config refuses a probe on such a route
            return asked
        with self._tracer.probe(route, asked) as span:
            verdict = await self._prober.ask(route, asked, forwarded)
            if verdict.status is not None:
                span.status(verdict.status)
            probed = await self._verdict(route, asked, verdict, forwarded, window, left)
            if probed is not None:
                span.operation(probed)
            return probed

    async def _verdict(
        self,
        route: RouteSettings,
        asked: Operation,
        verdict: Verdict,
        forwarded: str,
        window: ReleaseWindow,
        left: float,
    ) -> Operation | None:
        """Act on a probe's verdict about the attempt `asked` was read at, `left` seconds
        before the tool surely cannot apply its last send any more. The dialect said
        what the answer means; when it counts is decided here, the same for every
        kind of route."""
        seen = _seen(verdict)
        if isinstance(verdict, Applied):
            if forwarded != asked.id and not _dated_after_claim(verdict, asked):
                return await self._probe_evidence(
                    route,
                    asked,
                    "found_not_proof",
                    f"probe answered {verdict.said} (found) for {forwarded!r}, but this route "
                    "forwards a key that may also name an earlier effect, and the answer is not "
                    "dated after this operation's claim (Last-Modified): kept unknown. Check the "
                    'effect by hand; forward_key = "operation_id" makes a probe\'s "found" proof',
                    verdict=verdict,
                )
            return await self._probe_settles(
                route, asked, "applied", verdict.receipt, verdict=verdict, seen=seen
            )
        if not isinstance(verdict, NotApplied):
            return await self._probe_evidence(
                route, asked, verdict.result, verdict.evidence, verdict=verdict
            )
        if route.command is not None and not route.shared_state:
            # Stdio children keep what they know to themselves: the child asked now may not
            # be the one that took the call (it was restarted, or serves another worker).
            return await self._probe_evidence(
                route,
                asked,
                "not-shared",
                f"probe answered {verdict.said} (not applied), but this stdio route's servers "
                "do not share their state (shared_state = false): a child other than the one "
                "that took the call cannot vouch it did not happen. Kept unknown: check the "
                "tool by hand, or set shared_state = true if its children share one store",
                verdict=verdict,
            )
        admission = self._calibrator.sighted(route, asked)
        if admission.refused is None and left > 0:
            self._schedule(asked.id, left)
            return await self._probe_evidence(
                route,
                asked,
                "not_applied_too_soon",
                f"probe answered {verdict.said} (not applied), but a probe releases only "
                f"after {iso_time(window.may_apply_until)}, when attempt "
                f"{asked.attempts}'s send can no longer land by the probe's own window (the "
                f"call's whole limit, {_limit_name(route)}, after its send, then the probe's "
                "not_applied_after; an operator's release counts the route's): kept unknown; "
                "the probe asks again then",
                verdict=verdict,
            )
        if admission.refused is None:
            admission = await self._calibrator.admit(route, asked)
        if admission.refused is not None:
            return await self._probe_refused(route, asked, verdict, admission)
        return await self._probe_settles(
            route, asked, "not_applied", None, verdict=verdict, seen=seen, admission=admission
        )

    async def _probe_settles(
        self,
        route: RouteSettings,
        asked: Operation,
        outcome: Outcome,
        response: StoredResponse | None,
        *,
        verdict: Applied | NotApplied,
        seen: dict[str, Any],
        admission: Admission | None = None,
    ) -> Operation | None:
        calibrated = None if admission is None else (route.name, admission.kind)
        event = probe_event(
            outcome, status=verdict.status, detail="the probe settled it", seen=seen
        )
        try:
            settled = await self.resolve(
                asked,
                outcome=outcome,
                by="probe",
                response=response,
                note=None,  # a note is a person's own words; `by` and `actor` say who
                actor="probe",
                probe_event=event,
                calibrated=calibrated,
            )
        except (NotResolvable, PreconditionFailed) as exc:
            return await self._probe_evidence(
                route,
                asked,
                "superseded",
                f"probe said {outcome} about attempt {asked.attempts}, which is no longer "
                f"current ({exc.detail}); kept as evidence only",
                verdict=verdict,
            )
        except ProbeNotCalibrated:
            assert admission is not None
            return await self._probe_evidence(
                route,
                asked,
                "not_applied",
                f"probe answered {verdict.said} (not applied), but the calibration of "
                f"{admission.kind} changed before the release was written: kept unknown",
                verdict=verdict,
            )
        self._observer.probe_result(route.name, outcome)
        return settled

    async def _probe_refused(
        self, route: RouteSettings, asked: Operation, verdict: NotApplied, admission: Admission
    ) -> Operation | None:
        """A "not found" the probe cannot vouch for: evidence that says why and what to do;
        for a blind probe also a `probe-blind` event (its calibration admin-only)."""
        detail = f"probe answered {verdict.said} (not applied), but {admission.detail}"
        extra: tuple[NewEvent, ...] = ()
        if admission.refused == "probe-blind":
            extra = (probe_blind_event(admission),)
        return await self._probe_evidence(
            route, asked, admission.refused or "not_applied", detail, verdict=verdict, extra=extra
        )

    async def _probe_evidence(
        self,
        route: RouteSettings,
        operation: Operation,
        result: str,
        detail: str,
        *,
        verdict: Verdict,
        extra: tuple[NewEvent, ...] = (),
    ) -> Operation | None:
        status = verdict.status
        self._observer.probe_result(route.name, result)
        log.info(
            "probe",
            extra={"event": "probe", "operation_id": operation.id, "key": operation.key,
                   "route": route.name, "result": result, "status": status},
        )  # fmt: skip
        evidence = Evidence(at=self._clock.time(), source="probe", detail=detail, status=status)
        event = probe_event(result, status=status, detail=detail, seen=_seen(verdict))
        await self._store.add_evidence(operation.id, evidence, (event, *extra))
        return await self._store.get_by_id(operation.id)

    def _schedule(self, operation_id: str, delay: float) -> None:
        """Probe the operation again at the instant its release becomes allowed (a longer
        window deferred it), within the prober's concurrency; the usual backoff goes on
        beside it (a "found" meanwhile settles it sooner)."""
        previous = self._timers.pop(operation_id, None)
        if previous is not None:
            previous.cancel()
        loop = asyncio.get_running_loop()
        self._timers[operation_id] = loop.call_later(
            delay + _SCHEDULE_SLACK, self._probe_later, operation_id
        )

    def _probe_later(self, operation_id: str) -> None:
        self._timers.pop(operation_id, None)

        async def run() -> None:
            try:
                operation = await self._store.get_by_id(operation_id)
                if operation is not None and operation.state is State.UNKNOWN:
                    await self.probe(operation, now=True)
            except Exception:  # a store outage: the sweep probes it again later
                log.warning("scheduled probe of %s failed", operation_id, exc_info=True)

        task = asyncio.create_task(run(), name=f"probe-{operation_id}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        """Cancel the scheduled probes (the sweep finds their operations again)."""
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

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


_NOT_ATTACHABLE = (
    "only an operation settled applied without a receipt can get one attached, once; "
    "this one has a receipt, or was not settled by an owner or an operator"
)


def _limit_name(route: RouteSettings) -> str:
    return "max_call" if route.kind == "mcp" else "timeout"


def _seen(verdict: Verdict) -> dict[str, Any]:
    """What the history keeps of a probe's exchange: the request it made (secrets
    redacted) and what it read (the status, an MCP result's structured content)."""
    answer: dict[str, Any] = {"status": verdict.status}
    if isinstance(verdict, Applied | NotApplied):
        answer["said"] = verdict.said
        if verdict.result is not None:
            answer["result"] = verdict.result
    else:
        answer["said"] = verdict.evidence
    return {"request": verdict.asked, "answer": answer}


def _dated_after_claim(verdict: Applied, operation: Operation) -> bool:
    """Whether a "found" is dated (HTTP `Last-Modified`, whole seconds) no earlier than the
    operation's first claim: only then can a key that is not unique for ever (`scoped`,
    `key`) not name an older effect."""
    return verdict.dated is not None and verdict.dated >= math.floor(operation.created_at)
