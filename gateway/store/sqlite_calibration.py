"""SQLite statements for probe calibration and for finding a call by its request.

Calibration (`gateway.engine.calibration`) needs three things of the store: a
recent operation of a request kind that the upstream itself completed (the
sample a probe must find), the calibration rows, and their writes; the
status tool needs the latest operation of a request, whatever its key.
Each function runs on a connection of the caller's (the writer thread's).
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from typing import Any

from gateway.engine.calibration import (
    MAX_KINDS,
    Calibration,
    CalibrationChange,
    CalibrationState,
    decide,
    next_calibration,
)
from gateway.engine.models import Operation
from gateway.store.sqlite_statements import _SELECT

Decode = Callable[[Any], Operation]

_CALIBRATION_COLUMNS = "route, kind, state, at, sample, detail, until, actor, note, events"

SAMPLE_STATES = "state = 'completed' AND resolution_by = 'upstream' "
"""A calibration sample: an effect the upstream itself answered, with a 2xx receipt."""


def samples(
    c: sqlite3.Connection,
    decode: Decode,
    *,
    route: str,
    kind: str,
    scope: str | None,
    completed_since: float | None,
    now: float,
    limit: int,
) -> tuple[Operation, ...]:
    """The latest operations of `kind` on `route` (in `scope`, when given) completed by
    the upstream with a 2xx receipt (at `completed_since` or later), not forgotten."""
    clauses = [
        "route = ? AND request_kind = ?",
        SAMPLE_STATES,
        "response_status BETWEEN 200 AND 299",
        "(forgotten_at IS NULL OR forgotten_at > ?)",
    ]
    params: list[object] = [route, kind, now]
    if scope is not None:
        clauses.append("scope = ?")
        params.append(scope)
    if completed_since is not None:
        clauses.append("updated_at >= ?")
        params.append(completed_since)
    rows = c.execute(
        f"{_SELECT} INDEXED BY operations_by_kind WHERE {' AND '.join(clauses)} "
        "ORDER BY created_at DESC LIMIT ?",
        (*params, limit),
    ).fetchall()
    return tuple(decode(row) for row in rows)


def calibrations(c: sqlite3.Connection, route: str) -> tuple[Calibration, ...]:
    rows = c.execute(
        f"SELECT {_CALIBRATION_COLUMNS} FROM probe_calibrations WHERE route = ? ORDER BY kind",
        (route,),
    ).fetchall()
    return tuple(_calibration(row) for row in rows)


def save(c: sqlite3.Connection, change: CalibrationChange, now: float) -> Calibration | None:
    """Write a calibration's outcome; None when the route already has `MAX_KINDS` other
    kinds (a kind past them is never calibrated, so never released by a probe)."""
    row = c.execute(
        f"SELECT {_CALIBRATION_COLUMNS} FROM probe_calibrations WHERE route = ? AND kind = ?",
        (change.route, change.kind),
    ).fetchone()
    previous = None if row is None else _calibration(row)
    if previous is None:
        (count,) = c.execute(
            "SELECT count(*) FROM probe_calibrations WHERE route = ?", (change.route,)
        ).fetchone()
        if count >= MAX_KINDS:
            return None
    after = next_calibration(previous, change, now=now)
    c.execute(
        f"INSERT INTO probe_calibrations ({_CALIBRATION_COLUMNS}) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (route, kind) DO UPDATE SET "
        "state = excluded.state, at = excluded.at, sample = excluded.sample, "
        "detail = excluded.detail, until = excluded.until, actor = excluded.actor, "
        "note = excluded.note, events = excluded.events",
        after.row(),
    )
    return after


def admits_release(c: sqlite3.Connection, route: str, kind: str, now: float) -> bool:
    """The release transaction's own reading of the calibration row (`decide`)."""
    row = c.execute(
        f"SELECT {_CALIBRATION_COLUMNS} FROM probe_calibrations WHERE route = ? AND kind = ?",
        (route, kind),
    ).fetchone()
    return decide(None if row is None else _calibration(row), now=now) == "release"


def route_kinds(c: sqlite3.Connection, route: str, limit: int) -> tuple[str, ...]:
    """The distinct request kinds of the route's operations, a seek each (a loose scan of
    `operations_by_kind`: its rows per kind are never read)."""
    kinds: list[str] = []
    after = ""
    for _ in range(limit):
        row = c.execute(
            "SELECT min(request_kind) FROM operations INDEXED BY operations_by_kind "
            "WHERE route = ? AND request_kind > ?",
            (route, after),
        ).fetchone()
        if row is None or row[0] is None:
            break
        after = row[0]
        kinds.append(after)
    return tuple(kinds)


def latest_of_request(
    c: sqlite3.Connection,
    decode: Decode,
    *,
    scope: str,
    route: str,
    fingerprints: tuple[str, ...],
    now: float,
) -> Operation | None:
    """The latest operation (any state, any key) of a request in a scope, by fingerprint."""
    marks = ", ".join("?" for _ in fingerprints)
    row = c.execute(
        f"{_SELECT} WHERE fingerprint IN ({marks}) AND scope = ? AND route = ? "
        "AND (forgotten_at IS NULL OR forgotten_at > ?) ORDER BY sent_at DESC LIMIT 1",
        (*fingerprints, scope, route, now),
    ).fetchone()
    return None if row is None else decode(row)


def _calibration(row: Any) -> Calibration:
    route, kind, state, at, sample_id, detail, until, actor, note, events = row
    return Calibration(
        route=route,
        kind=kind,
        state=CalibrationState(state),
        at=at,
        sample=sample_id,
        detail=detail,
        until=until,
        actor=actor,
        note=note,
        events=tuple(json.loads(events)),
    )
