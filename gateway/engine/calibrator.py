"""Whether a probe's "not found" may release an operation: what it covers, and its calibration.

A "not found" releases a key only when three things hold, checked here in
this order (the window, that the tool can no longer apply the last send, is
`gateway.engine.settle`'s):

1. the probe is declared for the operation's request (`applies_to`): a
   tickets lookup says nothing about emails;
2. its kind has fewer than `MAX_KINDS` siblings with a calibration row;
3. the probe is calibrated for the kind (`gateway.engine.calibration`): it
   found a recent operation of that kind that the upstream completed, and
   did not find a forwarded key never used. A calibration older than an hour
   is run again first; a blind kind waits for a person (`trust`).

Everything else is evidence: the operation stays `unknown`, and its history
says why and what to do. The calibration sample comes from the operation's
own scope and completed no earlier than its last send minus the grace, so
the probe is shown to see that caller's effects of that time; the sample's
id is admin-only (`calibration` in the event's erasable payload).
"""

from __future__ import annotations

import logging
import secrets
from typing import TYPE_CHECKING, Literal, NamedTuple, Protocol

from gateway.config.applies_to import covers, http_kind, upstream_path
from gateway.engine.calibration import (
    MAX_KINDS,
    TRUST_TTL,
    Calibration,
    CalibrationChange,
    CalibrationState,
    decide,
)
from gateway.engine.ids import new_operation_id
from gateway.engine.probes import Applied, NotApplied
from gateway.engine.probes import Verdict as ProbeVerdict

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.forwarded_key import ForwardedKeys
    from gateway.engine.models import Operation
    from gateway.engine.probes import Prober
    from gateway.store.base import Store

__all__ = [
    "Admission",
    "CalibrationRun",
    "Calibrator",
    "SightObserver",
    "kind_of",
    "request_kind",
    "sight",
]

log = logging.getLogger("gateway.probes")

CALIBRATING = "calibration"
"""The actor of calibrations the gateway runs itself."""


class SightObserver(Protocol):
    """What the metrics layer shows of calibration (`GatewayMetrics`)."""

    def probe_blind(self, route: str, entry: str, blind: bool) -> None: ...


def kind_of(route: RouteSettings, operation: Operation) -> str:
    """The operation's request kind (`gateway.config.applies_to`): the tool on MCP routes."""
    return request_kind(route, operation.method, operation.path)


def request_kind(route: RouteSettings, method: str, path: str) -> str:
    """The kind of a request of `route` (gateway `path`; the tool on MCP routes)."""
    if route.kind == "mcp":
        return path
    return http_kind(method, upstream_path(route.prefix, path))


def sight(route: RouteSettings, method: str, path: str) -> str | None:
    """The `applies_to` entry that covers a request of the route (gateway `path`; the
    tool, on MCP routes), or None when the probe is not declared for it."""
    probe = route.probe
    if probe is None:
        return None
    if route.kind == "mcp":
        return path if path in probe.applies_to else None
    target = upstream_path(route.prefix, path)
    return next((entry.text for entry in route.applies_to() if covers(entry, method, target)), None)


Reason = Literal["not-declared", "too-many-kinds", "probe-blind", "not-calibrated"]


class Admission(NamedTuple):
    """Whether a "not found" may release an operation, and if not, why, in words."""

    kind: str
    entry: str | None
    refused: Reason | None = None
    detail: str = ""
    sample: str | None = None
    """The calibration's sample (admin-only)."""

    @property
    def admitted(self) -> bool:
        return self.refused is None


Verdict = Literal[
    "calibrated", "blind", "trusted", "no-sample", "error", "too-many-kinds", "not-declared"
]


class CalibrationRun(NamedTuple):
    """What one calibration of a kind found (and wrote, for `calibrated` and `blind`)."""

    kind: str
    verdict: Verdict
    detail: str
    sample: str | None = None
    calibration: Calibration | None = None


SAMPLE_CANDIDATES = 20
"""Completed operations of a kind read to find a sample (an MCP one must not be an error)."""


class Calibrator:
    """Runs calibrations and decides, for a "not found", whether the probe can see."""

    def __init__(
        self,
        *,
        store: Store,
        prober: Prober,
        forwarded_keys: ForwardedKeys,
        observer: SightObserver | None = None,
    ) -> None:
        self._store = store
        self._prober = prober
        self._forwarded_keys = forwarded_keys
        self._observer = observer

    def sighted(self, route: RouteSettings, operation: Operation) -> Admission:
        """Whether the probe is declared for the operation's request at all (no store
        read): `not-declared`, or an admission still to be calibrated (`admit`)."""
        kind = kind_of(route, operation)
        entry = sight(route, operation.method, operation.path)
        if entry is not None:
            return Admission(kind, entry)
        what = operation.path
        if route.kind != "mcp":
            what = f"{operation.method} {upstream_path(route.prefix, operation.path)}"
        return Admission(
            kind,
            None,
            "not-declared",
            f"the probe is not declared for {what} (applies_to): it may not see such "
            "effects. Check the tool by hand and resolve the operation, or declare what "
            "the probe can see in the route's probe.applies_to",
        )

    async def admit(self, route: RouteSettings, operation: Operation) -> Admission:
        """May a "not found" about `operation` (read now: `observed_at`) release it?"""
        probe = route.probe
        assert probe is not None
        declared = self.sighted(route, operation)
        if declared.refused is not None:
            return declared
        kind, entry = declared.kind, declared.entry
        rows = {row.kind: row for row in await self._store.calibrations(route.name)}
        current = rows.get(kind)
        decision = decide(current, now=operation.observed_at)
        if decision == "release":
            assert current is not None
            return Admission(kind, entry, sample=current.sample)
        if decision == "blind":
            assert current is not None
            return Admission(kind, entry, "probe-blind", _blind_advice(current.detail, kind))
        if current is None and len(rows) >= MAX_KINDS:
            return Admission(kind, entry, "too-many-kinds", _too_many(route.name))
        sent = operation.sent_at or operation.created_at
        run = await self.calibrate(
            route,
            kind,
            scope=operation.scope,
            completed_since=sent - probe.not_applied_after,
        )
        if run.verdict == "calibrated":
            return Admission(kind, entry, sample=run.sample)
        if run.verdict == "blind":
            advice = _blind_advice(run.detail, kind)
            return Admission(kind, entry, "probe-blind", advice, run.sample)
        if run.verdict == "too-many-kinds":
            return Admission(kind, entry, "too-many-kinds", run.detail)
        return Admission(kind, entry, "not-calibrated", run.detail, run.sample)

    async def calibrate(
        self,
        route: RouteSettings,
        kind: str,
        *,
        scope: str | None,
        completed_since: float | None,
        actor: str = CALIBRATING,
        write: bool = True,
    ) -> CalibrationRun:
        """Ask the probe about the latest sample of `kind` (it must be found) and about a
        forwarded key never used (it must not be); write `calibrated` or `blind` unless
        `write` is false. No sample, or a probe that errs, changes nothing."""
        candidates = await self._store.calibration_samples(
            route=route.name,
            kind=kind,
            scope=scope,
            completed_since=completed_since,
            limit=SAMPLE_CANDIDATES,
        )
        sample = next((op for op in candidates if self._prober.may_sample(route, op)), None)
        if sample is None:
            where = "in this caller's scope " if scope is not None else ""
            since = "" if completed_since is None else " recently enough"
            return CalibrationRun(
                kind,
                "no-sample",
                f"no operation of kind {kind} {where}that the upstream completed with a 2xx "
                f'answer{since} to calibrate the probe against; a "not found" is evidence '
                "only until one exists (or a person trusts the probe for this kind)",
            )
        found = await self._ask(route, sample)
        if isinstance(found, NotApplied):
            detail = (
                f"the probe did not find operation {sample.id} ({kind}), which the upstream "
                f"completed with status {_status(sample)}: it cannot see this kind of effect"
            )
            blind = CalibrationState.BLIND
            return await self._record(route, kind, blind, detail, sample, actor, write)
        if not isinstance(found, Applied):
            return CalibrationRun(kind, "error", f"calibration probe failed: {found.evidence}")
        unused = sample._replace(id=new_operation_id(), key=f"never-used-{secrets.token_hex(8)}")
        seen = await self._ask(route, unused)
        if isinstance(seen, Applied):
            detail = (
                'the probe answered "found" for a forwarded key never used: its answers do '
                "not tell effects apart"
            )
            blind = CalibrationState.BLIND
            return await self._record(route, kind, blind, detail, sample, actor, write)
        if not isinstance(seen, NotApplied):
            return CalibrationRun(kind, "error", f"calibration probe failed: {seen.evidence}")
        detail = f"found operation {sample.id} and not a forwarded key never used"
        return await self._record(
            route, kind, CalibrationState.CALIBRATED, detail, sample, actor, write
        )

    async def check(self, route: RouteSettings) -> tuple[CalibrationRun, ...]:
        """`probes check`: calibrate every kind of the route now (with any scope's latest
        sample). A blind kind stays blind whatever this finds (only `trust` lifts it), and
        a trusted one stays trusted (the check says what it found beside it)."""
        rows = {row.kind: row for row in await self._store.calibrations(route.name)}
        kinds = dict.fromkeys((*rows, *await self._store.route_kinds(route.name, limit=MAX_KINDS)))
        results: list[CalibrationRun] = []
        for kind in kinds:
            if not self._declared(route, kind):
                results.append(
                    CalibrationRun(
                        kind,
                        "not-declared",
                        'not in the probe\'s applies_to: its "not found" never releases these',
                    )
                )
                continue
            current = rows.get(kind)
            # A person's word stands: a check never lifts a blind kind nor undoes a trust.
            kept = current is not None and current.state is not CalibrationState.CALIBRATED
            run = await self.calibrate(
                route, kind, scope=None, completed_since=None, actor="check", write=not kept
            )
            if current is not None and current.state is CalibrationState.BLIND:
                if run.verdict == "calibrated":
                    run = run._replace(
                        verdict="blind",
                        detail=f"passes now ({run.detail}); still blind until trusted "
                        "(probes trust)",
                    )
            elif current is not None and current.state is CalibrationState.TRUSTED:
                run = run._replace(
                    verdict="trusted",
                    detail=f"trusted by a person ({current.note}); the check found: "
                    f"{run.verdict}, {run.detail}",
                )
            results.append(run)
        return tuple(results)

    async def trust(
        self, route: RouteSettings, kind: str, *, note: str, actor: str
    ) -> CalibrationRun:
        """A person re-enables a probe for a kind: calibration runs again; if it still
        fails, the trust is an override (`trusted`) that ends after `TRUST_TTL`."""
        run = await self.calibrate(route, kind, scope=None, completed_since=None, write=False)
        if run.verdict == "calibrated":
            change = CalibrationChange(
                route.name, kind, CalibrationState.CALIBRATED, actor, run.detail, run.sample, note
            )
        else:
            change = CalibrationChange(
                route.name,
                kind,
                CalibrationState.TRUSTED,
                actor,
                f"trusted by a person although the calibration says: {run.detail}",
                run.sample,
                note,
                trust_seconds=TRUST_TTL,
            )
        saved = await self._store.save_calibration(change)
        if saved is None:
            return CalibrationRun(kind, "too-many-kinds", _too_many(route.name))
        self._show(route, saved)
        log.warning(
            "probe trusted for a kind",
            extra={"event": "probe_trusted", "route": route.name, "kind": kind,
                   "state": saved.state.value, "actor": actor},
        )  # fmt: skip
        verdict: Verdict = "calibrated"
        if saved.state is CalibrationState.TRUSTED:
            verdict = "trusted"
        return CalibrationRun(kind, verdict, saved.detail, run.sample, saved)

    async def refresh_metrics(self, routes: tuple[RouteSettings, ...]) -> None:
        """Set the blind gauge of every route's `applies_to` entries from the store's rows
        (every process shows what the shared rows say)."""
        for route in routes:
            if route.probe is None:
                continue
            rows = await self._store.calibrations(route.name)
            blind = {
                self.entry_of(route, row.kind)
                for row in rows
                if row.state is CalibrationState.BLIND
            }
            for entry in route.probe.applies_to:
                if self._observer is not None:
                    self._observer.probe_blind(route.name, entry, entry in blind)

    async def calibrations(self, route: RouteSettings) -> tuple[Calibration, ...]:
        """The route's calibration rows, by kind."""
        return await self._store.calibrations(route.name)

    async def _ask(self, route: RouteSettings, operation: Operation) -> ProbeVerdict:
        forwarded = self._forwarded_keys.of(route, operation)
        assert forwarded is not None  # the config refuses a probe that cannot name an effect
        try:
            return await self._prober.ask(route, operation, forwarded)
        finally:
            self._prober.forget(operation.id)

    async def _record(
        self,
        route: RouteSettings,
        kind: str,
        state: CalibrationState,
        detail: str,
        sample: Operation,
        actor: str,
        write: bool,
    ) -> CalibrationRun:
        verdict: Verdict = "calibrated" if state is CalibrationState.CALIBRATED else "blind"
        if not write:
            return CalibrationRun(kind, verdict, detail, sample.id)
        saved = await self._store.save_calibration(
            CalibrationChange(route.name, kind, state, actor, detail, sample.id)
        )
        if saved is None:
            return CalibrationRun(kind, "too-many-kinds", _too_many(route.name), sample.id)
        self._show(route, saved)
        if state is CalibrationState.BLIND:
            log.error(
                "probe blind for a kind of request: its \"not found\" releases nothing of it",
                extra={"event": "probe_blind", "route": route.name, "kind": kind,
                       "detail": detail},
            )  # fmt: skip
        return CalibrationRun(kind, verdict, detail, sample.id, saved)

    def _show(self, route: RouteSettings, row: Calibration) -> None:
        entry = self.entry_of(route, row.kind)
        if self._observer is not None and entry is not None:
            self._observer.probe_blind(route.name, entry, row.state is CalibrationState.BLIND)

    def _declared(self, route: RouteSettings, kind: str) -> bool:
        return self.entry_of(route, kind) is not None

    def entry_of(self, route: RouteSettings, kind: str) -> str | None:
        """The `applies_to` entry a kind falls under (the metric's label; never the kind)."""
        if route.kind == "mcp":
            return kind if route.probe is not None and kind in route.probe.applies_to else None
        method, _, path = kind.partition(" ")
        for entry in route.applies_to():
            if entry.method != method:
                continue
            shown = path.split("/")[1:]
            if len(shown) == len(entry.segments) and all(
                want == got or want == "*" or got == "*"
                for want, got in zip(entry.segments, shown, strict=True)
            ):
                return entry.text
        return None


def _path(route: RouteSettings, operation: Operation) -> str:
    return upstream_path(route.prefix, operation.path)


def _status(operation: Operation) -> str:
    return str(operation.response.status) if operation.response is not None else "2xx"


def _blind_advice(detail: str, kind: str) -> str:
    return (
        f"the probe is blind for {kind}: {detail}. Nothing of this kind is released by the "
        "probe until an operator checks it and re-enables it (probes trust); settle this "
        "operation by hand"
    )


def _too_many(route: str) -> str:
    return (
        f"route {route!r} has {MAX_KINDS} kinds of request calibrated already; a probe's "
        '"not found" releases no further kind. Settle this operation by hand'
    )
