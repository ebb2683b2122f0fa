"""Whether a probe can see a kind of request: calibration, a small stored state machine.

A probe's "not found" releases a key, and a released key is sent again. So a
"not found" counts only from a probe that has shown it can see that kind of
effect: before it releases an operation of a kind, the probe is asked about a
recent operation of the same kind that the upstream itself completed (it must
answer "found"), and about a forwarded key never used (it must answer "not
found"). A probe that fails either is *blind* for that kind: nothing of that
kind is released by it until a person says otherwise.

    (no row) --calibration passed--> calibrated --older than an hour--> (calibrate again)
    (no row) --sample not found, or an unused key found--> blind
    blind --trust: calibration passed--> calibrated
    blind --trust: calibration still fails--> trusted (an override, for 24 h)
    trusted --expired--> (calibrate again: passed, calibrated; failed, blind)
    no sample, or the probe errs: no change, and no release

The state is one store row per (route, kind), read by the transaction that
releases (`Store.resolve(..., calibrated=...)`), so every worker and replica
obeys the same verdict. Its transitions are kept in the row (`events`), the
latest `MAX_EVENTS`.

>>> decide(None, now=100.0)
'calibrate'
>>> row = Calibration("r", "POST /*/issues", CalibrationState.CALIBRATED, at=50.0)
>>> decide(row, now=100.0), decide(row, now=50.0 + CALIBRATION_TTL)
('release', 'calibrate')
"""

from __future__ import annotations

import enum
import json
from typing import Any, Literal, NamedTuple

__all__ = [
    "CALIBRATION_TTL",
    "MAX_EVENTS",
    "MAX_KINDS",
    "TRUST_TTL",
    "Calibration",
    "CalibrationChange",
    "CalibrationState",
    "decide",
    "next_calibration",
]

CALIBRATION_TTL = 3600.0
"""A passed calibration vouches for its kind this long (store clock); then it is run again."""
TRUST_TTL = 86400.0
"""How long a person's trust in a probe that still fails its calibration lasts."""
MAX_KINDS = 64
"""Kinds with a calibration row per route: a kind past these is never released by a probe
(the rows, and the operator's table, stay bounded whatever paths callers send)."""
MAX_EVENTS = 50
"""Transitions a row keeps, the latest."""


class CalibrationState(enum.StrEnum):
    CALIBRATED = "calibrated"
    """The probe found a completed operation of the kind and did not find an unused key."""
    BLIND = "blind"
    """It failed: its "not found" for this kind releases nothing until a person trusts it."""
    TRUSTED = "trusted"
    """A person overrode a failing calibration, with a note, until `until`."""


class Calibration(NamedTuple):
    """One (route, kind)'s calibration row, as the store keeps it (times: store clock)."""

    route: str
    kind: str
    state: CalibrationState
    at: float
    """When the state was last set or confirmed."""
    sample: str | None = None
    """The operation the probe was asked about (admin-only: never in an owner's view)."""
    detail: str = ""
    until: float | None = None
    """`trusted`: when the override ends."""
    actor: str | None = None
    note: str | None = None
    events: tuple[dict[str, Any], ...] = ()
    """Its transitions, oldest first: `{at, state, actor, detail, note?, sample?}`."""

    def row(self) -> tuple[object, ...]:
        """The stored columns, in this order: route, kind, state, at, sample, detail,
        until, actor, note and the events as JSON (both stores write them so)."""
        return (
            self.route,
            self.kind,
            self.state.value,
            self.at,
            self.sample,
            self.detail,
            self.until,
            self.actor,
            self.note,
            json.dumps(self.events),
        )


Decision = Literal["release", "blind", "calibrate"]


def decide(calibration: Calibration | None, *, now: float) -> Decision:
    """What a probe's "not found" may do for the row's kind at store time `now`: release,
    nothing (`blind`), or nothing until the probe is calibrated again."""
    if calibration is None:
        return "calibrate"
    if calibration.state is CalibrationState.BLIND:
        return "blind"
    if calibration.state is CalibrationState.TRUSTED:
        return (
            "release" if calibration.until is not None and now < calibration.until else "calibrate"
        )
    return "release" if now - calibration.at < CALIBRATION_TTL else "calibrate"


def transition_event(
    *,
    at: float,
    state: CalibrationState,
    actor: str,
    detail: str,
    note: str | None = None,
    sample: str | None = None,
) -> dict[str, Any]:
    """One transition as the row keeps it."""
    event: dict[str, Any] = {"at": at, "state": state.value, "actor": actor, "detail": detail}
    if note is not None:
        event["note"] = note
    if sample is not None:
        event["sample"] = sample
    return event


class CalibrationChange(NamedTuple):
    """A calibration's outcome (or a person's trust), for the store to write at its clock."""

    route: str
    kind: str
    state: CalibrationState
    actor: str
    detail: str
    sample: str | None = None
    note: str | None = None
    trust_seconds: float | None = None
    """`trusted`: how long the override lasts from the write."""


def next_calibration(
    previous: Calibration | None, change: CalibrationChange, *, now: float
) -> Calibration:
    """The row after `change`, written at store time `now`. A transition is kept in
    `events` when the state changes or a person acted (a note); a calibration that only
    confirms the state refreshes `at`, `sample` and `detail`."""
    events = () if previous is None else previous.events
    if previous is None or previous.state is not change.state or change.note is not None:
        event = transition_event(
            at=now,
            state=change.state,
            actor=change.actor,
            detail=change.detail,
            note=change.note,
            sample=change.sample,
        )
        events = (*events, event)[-MAX_EVENTS:]
    trusted = change.state is CalibrationState.TRUSTED and change.trust_seconds is not None
    return Calibration(
        route=change.route,
        kind=change.kind,
        state=change.state,
        at=now,
        sample=change.sample,
        detail=change.detail,
        until=now + change.trust_seconds if trusted and change.trust_seconds else None,
        actor=change.actor,
        note=change.note if change.note is not None else (previous.note if previous else None),
        events=events,
    )
