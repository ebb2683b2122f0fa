"""PostgreSQL statements for probe calibration and for finding a call by its request.

The same verbs as `gateway.store.sqlite_calibration`, on the database's clock:
the calibration sample, the calibration rows and their writes (one row per
(route, kind), written under its row lock so replicas take turns), the
condition a probe's release statement carries, and the latest operation of
a request.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gateway.engine.calibration import (
    CALIBRATION_TTL,
    MAX_KINDS,
    Calibration,
    CalibrationChange,
    CalibrationState,
    next_calibration,
)
from gateway.engine.models import Operation
from gateway.store.postgres_schema import COLUMNS

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool

Decode = Callable[[Any], Operation]

NOW = "clock_timestamp()"

_COLUMNS = (
    "route, kind, state, extract(epoch from at)::float8 AS at, sample, detail, "
    "extract(epoch from until)::float8 AS until, actor, note, events::text AS events"
)

ADMITS_RELEASE = (
    "EXISTS (SELECT 1 FROM probe_calibrations pc WHERE pc.route = {0} AND pc.kind = {1} "
    f"AND ((pc.state = 'calibrated' AND pc.at > {NOW} - make_interval(secs => "
    f"{CALIBRATION_TTL})) OR (pc.state = 'trusted' AND pc.until > {NOW})))"
)
"""A release statement's condition (format it with the route's and the kind's parameters):
the calibration row, as the statement reads it, admits a probe's release (`decide`)."""

SAMPLE = (
    f"SELECT {COLUMNS} FROM operations WHERE route = $1 AND request_kind = $2 "
    "AND ($3::text IS NULL OR scope = $3) "
    "AND state = 'completed' AND resolution_by = 'upstream' "
    "AND response_status BETWEEN 200 AND 299 "
    "AND ($4::float8 IS NULL OR updated_at >= to_timestamp($4)) "
    f"AND (forgotten_at IS NULL OR forgotten_at > {NOW}) "
    "ORDER BY created_at DESC LIMIT $5"
)
"""The latest operations of a kind the upstream completed with a 2xx (`operations_by_kind`)."""

LATEST_OF_REQUEST = (
    f"SELECT {COLUMNS} FROM operations WHERE fingerprint = ANY($1::text[]) "
    f"AND scope = $2 AND route = $3 AND (forgotten_at IS NULL OR forgotten_at > {NOW}) "
    "ORDER BY sent_at DESC LIMIT 1"
)

ROUTE_KINDS = (
    "WITH RECURSIVE kinds(kind, n) AS ("
    "SELECT min(request_kind), 1 FROM operations WHERE route = $1 AND request_kind IS NOT NULL "
    "UNION ALL SELECT (SELECT min(request_kind) FROM operations o WHERE o.route = $1 "
    "AND o.request_kind > kinds.kind), n + 1 FROM kinds WHERE kinds.kind IS NOT NULL AND n < $2) "
    "SELECT kind FROM kinds WHERE kind IS NOT NULL"
)
"""The route's distinct kinds, a seek each on `operations_by_kind` (a loose index scan)."""


async def calibrations(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record], route: str
) -> tuple[Calibration, ...]:
    rows = await connection.fetch(
        f"SELECT {_COLUMNS} FROM probe_calibrations WHERE route = $1 ORDER BY kind", route
    )
    return tuple(_calibration(row) for row in rows)


async def save(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record], change: CalibrationChange
) -> Calibration | None:
    """Write a calibration's outcome (in the caller's transaction); None past `MAX_KINDS`.

    The route's rows are locked first (a transaction advisory lock on the route), so two
    replicas calibrating at once take turns and the cap holds.
    """
    await connection.execute(
        "SELECT pg_advisory_xact_lock(hashtext('calibration:' || $1))", change.route
    )
    row = await connection.fetchrow(
        f"SELECT {_COLUMNS} FROM probe_calibrations WHERE route = $1 AND kind = $2",
        change.route,
        change.kind,
    )
    previous = None if row is None else _calibration(row)
    if previous is None:
        count = await connection.fetchval(
            "SELECT count(*) FROM probe_calibrations WHERE route = $1", change.route
        )
        if count >= MAX_KINDS:
            return None
    now = await connection.fetchval(f"SELECT extract(epoch from {NOW})::float8")
    after = next_calibration(previous, change, now=now)
    await connection.execute(
        "INSERT INTO probe_calibrations (route, kind, state, at, sample, detail, until, actor, "
        "note, events) VALUES ($1, $2, $3, to_timestamp($4), $5, $6, to_timestamp($7), $8, $9, "
        "$10::jsonb) ON CONFLICT (route, kind) DO UPDATE SET state = excluded.state, "
        "at = excluded.at, sample = excluded.sample, detail = excluded.detail, "
        "until = excluded.until, actor = excluded.actor, note = excluded.note, "
        "events = excluded.events",
        *after.row(),
    )
    return after


def _calibration(row: Any) -> Calibration:
    return Calibration(
        route=row["route"],
        kind=row["kind"],
        state=CalibrationState(row["state"]),
        at=row["at"],
        sample=row["sample"],
        detail=row["detail"],
        until=row["until"],
        actor=row["actor"],
        note=row["note"],
        events=tuple(json.loads(row["events"])),
    )
