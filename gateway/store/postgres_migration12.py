"""Migration 12, online: `operations` and `operation_events` become partitioned by day.

Each step is its own transaction under the migration advisory lock (replicas that
start together take turns; whoever comes next redoes or skips a step):

1. prepare (a store with operations only): the events get their partition column
   (`op_created_at`, a constant default, so no rewrite), and both tables a CHECK
   constraint, `NOT VALID`, bounding their rows before an instant T0: the first
   UTC midnight at least `HORIZON` away. ACCESS EXCLUSIVE for a catalog change
   only (waits at most `LOCK_TIMEOUT`, then tries again).
2. validate: both constraints are validated, a scan under SHARE UPDATE EXCLUSIVE
   that lets reads and writes go on (replicas of the previous version keep serving).
3. switch: ACCESS EXCLUSIVE on both tables (again waiting at most
   `LOCK_TIMEOUT`), renamed `*_legacy`; partitioned parents made `LIKE` them;
   the old tables attached as the partitions of everything before T0 (the
   validated constraints spare ATTACH its scan); the key table, its functions,
   the claim function (the previous one dropped: its callers are the previous
   version); version 12. Catalog changes only: milliseconds, whatever the number
   of rows. The day partitions from T0's day on are made after the commit (the
   store makes them at open), unless T0 is the switch's own instant.
4. backfill (`backfill`, in the background, by any replica of this version, one
   batch at a time): every operation of the partition from before gets its key
   row. Until the flag `partitions_backfilled` is in `gateway_meta`, claims refuse
   a key found there too (its old unique index on (scope, key) is still there),
   and lookups look there too (`gateway.store.postgres_keys`).

A store without operations skips 1 and 2, and has no partition from before:
its old, empty tables are dropped (`gateway_legacy_before()` is `-infinity`);
one that a replica of the previous version wrote to meanwhile attaches them as
before, T0 being the switch's own instant (ATTACH then checks those few rows).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
from typing import TYPE_CHECKING, NamedTuple, TypeAlias

import asyncpg

from gateway.store.postgres_claims import KEYED_CLAIMS, PREVIOUS
from gateway.store.postgres_keys import (
    BACKFILLED,
    KEY_TABLE,
    LEGACY_BEFORE,
    LEGACY_FUNCTIONS,
    legacy_before_function,
)
from gateway.store.postgres_partitions import EVENTS, OPERATIONS, ensure_days, name_of
from gateway.store.postgres_schema import MIGRATION_LOCK

if TYPE_CHECKING:
    import asyncpg.pool

    Connection: TypeAlias = asyncpg.pool.PoolConnectionProxy[asyncpg.Record]

log = logging.getLogger("gateway.store.postgres")

VERSION = 12

BACKFILL_LOCK = 0x1DE4_6A81
"""Transaction advisory lock (try): one backfill batch at a time across replicas."""

LOCK_TIMEOUT = "1s"
"""How long a step waits for its ACCESS EXCLUSIVE lock; statements queue behind a waiting
ACCESS EXCLUSIVE request, so this bounds the stall a busy moment can cause."""

TRIES = 60
"""Attempts of the steps before the gateway gives up starting (it is started again)."""

HORIZON = dt.timedelta(hours=1)
"""T0 is the first UTC midnight at least this far ahead: time for step 2's scan."""

GUARD = dt.timedelta(minutes=5)
"""The switch gives up T0 (and step 1 picks a later one) if T0 is closer than this."""

LONG = 24 * 3600.0
"""The statement timeout of the steps that may take long (step 2's scan, a replica waiting
for another's step): the pool's `command_timeout` would cancel them."""

BACKFILL_BATCH = 2000
"""Key rows a backfill batch writes (one short transaction each)."""

_UNTIL = "partitions_backfill_until"
_AFTER = "partitions_backfill_after"

_CHECKS = (
    (OPERATIONS, "operations_before_partitions", "created_at"),
    (EVENTS, "operation_events_before_partitions", "op_created_at"),
)


class Plan(NamedTuple):
    """What step 1 left for the switch: T0, or None to take the switch's own instant."""

    instant: dt.datetime | None


async def migrate(connection: Connection) -> None:
    """Bring a version-11 schema to version 12 (steps 1-3; the backfill follows)."""
    for _ in range(TRIES):
        try:
            plan = await _prepare(connection)
            if plan is None:
                return
            if plan.instant is not None:
                await _validate(connection)
            if await _switch(connection, plan):
                return
        except asyncpg.LockNotAvailableError as exc:
            log.warning("schema migration 12 waits for a table lock: %s", exc)
            await asyncio.sleep(0.5)
    raise RuntimeError("schema migration 12 could not take its table locks; start again")


async def _begin(connection: Connection) -> int:
    """In a transaction: the migration lock (as long as another replica's step takes,
    step 2's scan included), then the schema's version."""
    await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK, timeout=LONG)
    return int(await connection.fetchval("SELECT version FROM gateway_schema_version"))


async def _set_meta(connection: Connection, name: str, value: str) -> None:
    await connection.execute(
        "INSERT INTO gateway_meta (name, value) VALUES ($1, $2) "
        "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
        name,
        value.encode(),
    )


async def _meta(connection: Connection, name: str) -> str | None:
    value = await connection.fetchval("SELECT value FROM gateway_meta WHERE name = $1", name)
    return None if value is None else bytes(value).decode()


def _literal(instant: dt.datetime) -> str:
    return f"'{instant.astimezone(dt.UTC).isoformat()}'"


async def _prepare(connection: Connection) -> Plan | None:
    """Step 1; None when there is nothing left to do."""
    async with connection.transaction():
        if await _begin(connection) >= VERSION:
            return None
        if await connection.fetchval(
            "SELECT EXISTS (SELECT 1 FROM pg_partitioned_table "
            "WHERE partrelid = to_regclass('operations'))"
        ):
            # Partitioned already (a store whose version number was set back by hand).
            await connection.execute("UPDATE gateway_schema_version SET version = $1", VERSION)
            return None
        prepared = await _meta(connection, LEGACY_BEFORE)
        if prepared is not None and await _checked(connection):
            return Plan(dt.datetime.fromisoformat(prepared))
        if not await connection.fetchval("SELECT EXISTS (SELECT 1 FROM operations)"):
            return Plan(None)
        await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        instant: dt.datetime = await connection.fetchval(
            "SELECT date_trunc('day', (clock_timestamp() + $1::interval) AT TIME ZONE 'UTC') "
            "AT TIME ZONE 'UTC' + interval '1 day'",
            HORIZON,
        )
        await connection.execute(
            "ALTER TABLE operation_events ADD COLUMN IF NOT EXISTS "
            "op_created_at timestamptz NOT NULL DEFAULT '-infinity'"
        )
        for table, constraint, column in _CHECKS:
            await connection.execute(f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {constraint}")
            await connection.execute(
                f"ALTER TABLE {table} ADD CONSTRAINT {constraint} "
                f"CHECK ({column} < {_literal(instant)}) NOT VALID"
            )
        await _set_meta(connection, LEGACY_BEFORE, instant.isoformat())
        log.info("schema migration 12: rows before %s become the partition from before", instant)
        return Plan(instant)


async def _checked(connection: Connection) -> bool:
    """Whether both of step 1's constraints are there."""
    count = await connection.fetchval(
        "SELECT count(*) FROM pg_constraint WHERE conname = ANY($1::text[]) "
        "AND conrelid IN (to_regclass('operations'), to_regclass('operation_events'))",
        [constraint for _, constraint, _ in _CHECKS],
    )
    return int(count) == len(_CHECKS)


async def _validate(connection: Connection) -> None:
    """Step 2: a scan of each table that blocks no reader or writer."""
    async with connection.transaction():
        if await _begin(connection) >= VERSION:
            return
        for table, constraint, _ in _CHECKS:
            await connection.execute(
                f"ALTER TABLE {table} VALIDATE CONSTRAINT {constraint}", timeout=LONG
            )


async def _switch(connection: Connection, plan: Plan) -> bool:
    """Step 3; False when T0 came too close (step 1 is then done again)."""
    async with connection.transaction():
        if await _begin(connection) >= VERSION:
            return True
        await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await connection.execute("LOCK TABLE operations, operation_events IN ACCESS EXCLUSIVE MODE")
        now: dt.datetime = await connection.fetchval("SELECT clock_timestamp()")
        if plan.instant is None:
            await connection.execute(
                "ALTER TABLE operation_events ADD COLUMN IF NOT EXISTS "
                "op_created_at timestamptz NOT NULL DEFAULT '-infinity'"
            )
            # Still empty under the lock: no partition from before at all. Rows a replica of
            # the previous version wrote since step 1: theirs, up to now (ATTACH scans them).
            empty = not await connection.fetchval("SELECT EXISTS (SELECT 1 FROM operations)")
            await _partition(connection, None if empty else now)
            return True
        if plan.instant - now < GUARD:
            for table, constraint, _ in _CHECKS:
                await connection.execute(f"ALTER TABLE {table} DROP CONSTRAINT {constraint}")
            await connection.execute("DELETE FROM gateway_meta WHERE name = $1", LEGACY_BEFORE)
            log.warning("schema migration 12: %s came too close, a later one is taken", now)
            return False
        await _partition(connection, plan.instant)
    return True


async def _partition(connection: Connection, instant: dt.datetime | None) -> None:
    """The switch's catalog changes (in its transaction, under its locks): the old tables
    become the partitions of everything before `instant`, or are dropped (None: empty)."""
    bound = "'-infinity'" if instant is None else _literal(instant)
    await connection.execute(PREVIOUS)
    sequence = await connection.fetchval("SELECT pg_get_serial_sequence('operations', 'seq')")
    for table, column in ((OPERATIONS, "created_at"), (EVENTS, "op_created_at")):
        legacy = name_of(table, None)
        await connection.execute(f"ALTER TABLE {table} RENAME TO {legacy}")
        await connection.execute(
            f"CREATE TABLE {table} (LIKE {legacy} INCLUDING DEFAULTS INCLUDING CONSTRAINTS) "
            f"PARTITION BY RANGE ({column})"
        )
        for constrained, constraint, _ in _CHECKS:
            if constrained == table:
                await connection.execute(
                    f"ALTER TABLE {table} DROP CONSTRAINT IF EXISTS {constraint}"
                )
        if instant is not None:
            await connection.execute(
                f"ALTER TABLE {table} ATTACH PARTITION {legacy} "
                f"FOR VALUES FROM (MINVALUE) TO ({bound})"
            )
    # Inserts through the parent must name their events' partition: no default there.
    await connection.execute("ALTER TABLE operation_events ALTER COLUMN op_created_at DROP DEFAULT")
    # The sequence outlives the partition from before (dropped some day by retention).
    await connection.execute(f"ALTER SEQUENCE {sequence} OWNED BY operations.seq")
    for statement in (*KEY_TABLE, legacy_before_function(bound), *LEGACY_FUNCTIONS, KEYED_CLAIMS):
        await connection.execute(statement)
    if instant is None:
        await connection.execute(f"DROP TABLE {name_of(OPERATIONS, None)}, {name_of(EVENTS, None)}")
        await _set_meta(connection, LEGACY_BEFORE, "-infinity")
        await _set_meta(connection, BACKFILLED, "nothing before")
    else:
        await _set_meta(connection, LEGACY_BEFORE, instant.isoformat())
        last = await connection.fetchval("SELECT coalesce(max(seq), 0) FROM operations_legacy")
        if last:
            await _set_meta(connection, _UNTIL, str(last))
        else:
            await _set_meta(connection, BACKFILLED, "nothing before")
    if instant is None or instant <= await connection.fetchval("SELECT clock_timestamp()"):
        # New operations start now: their partitions first. A T0 ahead leaves them to
        # `ensure_days` after the commit (the store does it at open), out of the lock.
        await ensure_days(connection)
    await connection.execute("UPDATE gateway_schema_version SET version = $1", VERSION)


async def backfilled(connection: Connection) -> bool:
    """Whether every operation from before partitioning has its key row."""
    return await _meta(connection, BACKFILLED) is not None


async def backfill(connection: Connection, *, batch: int = BACKFILL_BATCH) -> bool | None:
    """Step 4, one batch: True once done, False when more is left, None when another
    replica holds the batch lock.

    Rows are read in `seq` order up to the last one the switch saw (later ones were
    claimed through the key table), each locked FOR KEY SHARE: a row deleted meanwhile
    (a forgotten key claimed again, the sweep) is skipped, and one being deleted is
    waited for, so no key row is made for an operation that is gone.
    """
    async with connection.transaction():
        if not await connection.fetchval("SELECT pg_try_advisory_xact_lock($1)", BACKFILL_LOCK):
            return None
        if await _meta(connection, BACKFILLED) is not None:
            return True
        after = int(await _meta(connection, _AFTER) or 0)
        until = int(await _meta(connection, _UNTIL) or 0)
        row = await connection.fetchrow(
            "WITH source AS (SELECT scope, key, id, created_at, seq FROM operations_legacy "
            "WHERE seq > $1 AND seq <= $2 ORDER BY seq LIMIT $3 FOR KEY SHARE), "
            "added AS (INSERT INTO operation_keys (scope, key, id, created_at) "
            "SELECT scope, key, id, created_at FROM source ON CONFLICT DO NOTHING) "
            "SELECT count(*), max(seq) FROM source",
            after,
            until,
            batch,
        )
        assert row is not None
        count, last = row
        if count == 0:
            await _set_meta(connection, BACKFILLED, "done")
            await connection.execute(
                "DELETE FROM gateway_meta WHERE name = ANY($1::text[])", [_AFTER, _UNTIL]
            )
            log.info("schema migration 12: every operation from before has its key row")
            return True
        await _set_meta(connection, _AFTER, str(last))
        return False
