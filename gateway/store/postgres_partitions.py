"""Day partitions of `operations` and `operation_events`: made ahead, dropped when forgotten.

Both tables are partitioned by RANGE on a day (UTC): operations by `created_at`,
events by their operation's `created_at` (`op_created_at`), so an operation's
events live and die with it. Partitions are named for operators:
`operations_p20261204` and `operation_events_p20261204`; the partition from
before partitioning (migration 12) is `operations_legacy` /
`operation_events_legacy`, up to `gateway_legacy_before()`.

Making one: a new empty table (`LIKE` the parent, its own indexes), then
`ATTACH PARTITION`, which takes SHARE UPDATE EXCLUSIVE on the parent: claims
and receipts go on (a `CREATE TABLE ... PARTITION OF` would take ACCESS
EXCLUSIVE). The store makes today's and the next `AHEAD_DAYS` at open and at
every maintenance pass.

Dropping one (the contract: a partition is dropped only when every row in it is
past `forgotten_at` and none is `in_flight` or `unknown`), in steps that each
hold only what they must:

1. one transaction locks every row of the partition (FOR SHARE: a writer
   already at work on one of them finishes first, a new one waits), checks the
   rule on the rows as they now are, and deletes the partition's rows of
   `operation_keys` and of the per-operation tables. Its keys are free from the
   commit; its rows can no longer be reached by key or by id, and none can take
   an outcome (outcome writes refuse a forgotten row, `NOT_FORGOTTEN`);
2. `DETACH PARTITION ... CONCURRENTLY`, operations then events: no lock that
   stops a claim;
3. the detached table is checked once more (nothing entered it, which a clock
   stepped back by a day could do) and dropped, or attached again.

A pass interrupted anywhere is finished by the next (`_finish_interrupted`).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import asyncpg
    import asyncpg.pool

log = logging.getLogger("gateway.store.postgres")

AHEAD_DAYS = 3
"""Partitions exist for today and this many days after (the database's clock, UTC)."""

RETIRE_MARGIN = 3600.0
"""A partition is considered for dropping this many seconds after its day ended: room for
the database's clock to be stepped back without a claim landing in a dropped day."""

CREATE_LOCK = 0x1DE4_6A7F
"""Transaction advisory lock: one replica at a time makes partitions."""

RETIRE_LOCK = 0x1DE4_6A80
"""Session advisory lock (try): one replica at a time drops partitions."""

LOCK_TIMEOUT = "2s"
"""How long a partition change waits for a table or row lock before it gives up (and the
next pass tries again): while it waits, statements queued behind it wait too."""

DETACH_TIMEOUT = 30.0
"""Seconds a `DETACH ... CONCURRENTLY` may wait for transactions that saw the partition."""

OPERATIONS = "operations"
EVENTS = "operation_events"
LEGACY = "legacy"

_NAME = re.compile(r"^(operations|operation_events)_(p(\d{8})|legacy)$")

LEGACY_BEFORE = "greatest(gateway_legacy_before(), '0001-01-01 00:00:00+00'::timestamptz)"
"""Where the partition from before ends, as Python can read it (asyncpg reads `-infinity`, a
store that had none, as a naive `datetime.min`)."""

NOT_FORGOTTEN = "(forgotten_at IS NULL OR forgotten_at > clock_timestamp())"
"""What an outcome write on a settled row requires (`complete_late`, `attach_receipt`): a
row past `forgotten_at` is gone for the store (a claim of its key starts over), and may be
in a partition being dropped, whose keys are already free."""

_OPERATION_INDEXES = (
    "ALTER TABLE {t} ADD CONSTRAINT {t}_pkey PRIMARY KEY (seq)",
    "CREATE UNIQUE INDEX {t}_id ON {t} (id)",
    "CREATE UNIQUE INDEX {t}_scope_key ON {t} (scope, key)",
    "CREATE INDEX {t}_by_state ON {t} (state, seq)",
    "CREATE INDEX {t}_by_forgotten_at ON {t} (forgotten_at)",
    "CREATE INDEX {t}_by_lease ON {t} (lease_expires_at) WHERE state = 'in_flight'",
    "CREATE INDEX {t}_by_body_expiry ON {t} (expires_at) WHERE response_body IS NOT NULL",
    "CREATE INDEX {t}_by_request_expiry ON {t} (expires_at) WHERE request_kept",
    "CREATE INDEX {t}_by_request ON {t} (fingerprint, scope, route, state, sent_at)",
    "CREATE INDEX {t}_by_kind ON {t} (route, request_kind, scope, created_at) "
    "WHERE request_kind IS NOT NULL",
)
"""A day partition's own indexes (the parent has none, so the partition from before
partitioning attaches with the indexes it has): the unique ones guard each day too;
uniqueness across days is `operation_keys`'."""

_EVENT_INDEXES = ("ALTER TABLE {t} ADD CONSTRAINT {t}_pkey PRIMARY KEY (operation_id, seq)",)

_PER_OPERATION = ("history_checkpoints", "history_keyed_since", "request_log", "request_counts")
"""Tables with rows per operation, outside the partitions: deleted before a day is dropped."""

_ELIGIBLE = (
    "SELECT NOT EXISTS (SELECT 1 FROM {t} WHERE state NOT IN ('completed', 'released') "
    "OR forgotten_at IS NULL OR forgotten_at > clock_timestamp())"
)
"""The contract's rule, on every row of partition {t}."""

_LIKELY = (
    "SELECT NOT EXISTS (SELECT 1 FROM {t} WHERE state IN ('in_flight', 'unknown')) "
    "AND NOT EXISTS (SELECT 1 FROM {t} WHERE forgotten_at > clock_timestamp())"
)
"""The rule's index-backed part, asked first: most passes stop here for most partitions."""


class Day(NamedTuple):
    """One day's pair of partitions: `day` None for the partition from before."""

    day: dt.date | None

    @property
    def operations(self) -> str:
        return name_of(OPERATIONS, self.day)

    @property
    def events(self) -> str:
        return name_of(EVENTS, self.day)


def name_of(table: str, day: dt.date | None) -> str:
    """The partition of `table` for `day` (None: the one from before partitioning).

    >>> name_of("operations", dt.date(2026, 12, 4))
    'operations_p20261204'
    """
    return f"{table}_{LEGACY}" if day is None else f"{table}_p{day:%Y%m%d}"


def day_of(name: str) -> tuple[str, Day] | None:
    """(parent table, day) of a partition name of ours, or None.

    >>> day_of("operation_events_p20261204")
    ('operation_events', Day(day=datetime.date(2026, 12, 4)))
    """
    match = _NAME.match(name)
    if match is None:
        return None
    digits = match.group(3)
    day = None if digits is None else dt.datetime.strptime(digits, "%Y%m%d").date()
    return match.group(1), Day(day)


def _literal(instant: dt.datetime) -> str:
    return f"'{instant.astimezone(dt.UTC).isoformat()}'"


def _aware(instant: dt.datetime) -> dt.datetime:
    """`instant` with a time zone: asyncpg reads `-infinity` as a naive `datetime.min`."""
    return instant if instant.tzinfo is not None else instant.replace(tzinfo=dt.UTC)


def _midnight(day: dt.date) -> dt.datetime:
    return dt.datetime(day.year, day.month, day.day, tzinfo=dt.UTC)


def bounds(day: Day, legacy_before: dt.datetime) -> tuple[str, str]:
    """The `FOR VALUES FROM (...) TO (...)` bounds of a day's partitions, as SQL.

    >>> before = dt.datetime(2026, 12, 4, 14, 30, tzinfo=dt.UTC)
    >>> bounds(Day(dt.date(2026, 12, 4)), before)
    ("'2026-12-04T14:30:00+00:00'", "'2026-12-05T00:00:00+00:00'")
    >>> bounds(Day(None), before)
    ('MINVALUE', "'2026-12-04T14:30:00+00:00'")
    """
    legacy_before = _aware(legacy_before)
    if day.day is None:
        return "MINVALUE", _literal(legacy_before)
    start = max(_midnight(day.day), legacy_before)
    return _literal(start), _literal(_midnight(day.day + dt.timedelta(days=1)))


def day_end(day: Day, legacy_before: dt.datetime) -> dt.datetime:
    """When a day's partition stops taking new operations."""
    if day.day is None:
        return _aware(legacy_before)
    return _midnight(day.day + dt.timedelta(days=1))


async def create_day(
    connection: asyncpg.Connection[asyncpg.Record]
    | asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    day: Day,
    legacy_before: dt.datetime,
) -> None:
    """Make and attach a day's two partitions (in the caller's transaction).

    `legacy_before` is where the partition from before ends (`LEGACY_BEFORE`): a day
    wholly before it is that partition's, and has none of its own.
    """
    if day_end(day, legacy_before) <= _aware(legacy_before):
        raise ValueError(f"{day.day} lies in {name_of(OPERATIONS, None)} (before {legacy_before})")
    low, high = bounds(day, legacy_before)
    for table, partition, indexes in (
        (OPERATIONS, day.operations, _OPERATION_INDEXES),
        (EVENTS, day.events, _EVENT_INDEXES),
    ):
        await connection.execute(
            f"CREATE TABLE {partition} (LIKE {table} INCLUDING DEFAULTS INCLUDING CONSTRAINTS)"
        )
        for statement in indexes:
            await connection.execute(statement.format(t=partition))
        await connection.execute(
            f"ALTER TABLE {table} ATTACH PARTITION {partition} FOR VALUES FROM ({low}) TO ({high})"
        )


async def ensure_days(
    connection: asyncpg.Connection[asyncpg.Record]
    | asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    *,
    ahead: int = AHEAD_DAYS,
) -> list[str]:
    """Make today's partitions and the next `ahead` days' where missing; their names.

    Cheap when nothing is missing (a catalog look-up, no lock): run at open and on every
    maintenance pass.
    """
    row = await connection.fetchrow(
        f"SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date, {LEGACY_BEFORE}"
    )
    assert row is not None
    today, legacy_before = row
    wanted = [Day(today + dt.timedelta(days=n)) for n in range(ahead + 1)]
    wanted = [day for day in wanted if day_end(day, legacy_before) > legacy_before]
    missing = await _missing(connection, wanted)
    if not missing:
        return []
    made: list[str] = []
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", CREATE_LOCK)
        await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        for day in await _missing(connection, missing):
            await create_day(connection, day, legacy_before)
            made.append(day.operations)
    if made:
        log.info("postgres partitions made: %s", ", ".join(made))
    return made


async def _missing(
    connection: asyncpg.Connection[asyncpg.Record]
    | asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    days: list[Day],
) -> list[Day]:
    present = await connection.fetch(
        "SELECT name FROM unnest($1::text[]) AS n(name) WHERE to_regclass(name) IS NOT NULL",
        [day.operations for day in days],
    )
    have = {row["name"] for row in present}
    return [day for day in days if day.operations not in have]


async def retire_days(
    connection: asyncpg.Connection[asyncpg.Record], *, margin: float = RETIRE_MARGIN
) -> list[str]:
    """Drop every day whose partitions the contract lets go (module docstring); the names
    of the operations partitions dropped. `connection` is the caller's own (not pooled):
    it holds a session lock and runs `DETACH ... CONCURRENTLY` outside any transaction."""
    if not await connection.fetchval("SELECT pg_try_advisory_lock($1)", RETIRE_LOCK):
        return []  # another replica is at it
    try:
        await _finish_interrupted(connection)
        dropped: list[str] = []
        for day in await _candidates(connection, margin):
            if await _retire(connection, day):
                dropped.append(day.operations)
        if dropped:
            log.info("postgres partitions dropped: %s", ", ".join(dropped))
        return dropped
    finally:
        await connection.execute("SELECT pg_advisory_unlock($1)", RETIRE_LOCK)


async def _attached(connection: asyncpg.Connection[asyncpg.Record], table: str) -> dict[str, bool]:
    """The partitions of `table` (ours only) and whether a detach of each is pending."""
    rows = await connection.fetch(
        "SELECT c.relname, i.inhdetachpending FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = to_regclass($1)",
        table,
    )
    return {row[0]: row[1] for row in rows if day_of(row[0]) is not None}


async def _candidates(connection: asyncpg.Connection[asyncpg.Record], margin: float) -> list[Day]:
    """Days over for `margin` seconds whose partitions may follow the rule (index checks)."""
    row = await connection.fetchrow(
        f"SELECT clock_timestamp(), {LEGACY_BEFORE}, gateway_legacy_until() IS NULL"
    )
    assert row is not None
    now, legacy_before, backfilled = row
    found: list[Day] = []
    for name in sorted(await _attached(connection, OPERATIONS)):
        named = day_of(name)
        assert named is not None
        day = named[1]
        if day.day is None and not backfilled:
            continue  # its operations may still lack their key rows
        if (now - day_end(day, legacy_before)).total_seconds() < margin:
            continue
        if await connection.fetchval(_LIKELY.format(t=name)):
            found.append(day)
    return found


async def _retire(connection: asyncpg.Connection[asyncpg.Record], day: Day) -> bool:
    """Steps 1-3 of the module docstring for one day; whether it was dropped."""
    async with connection.transaction():
        await connection.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        await connection.execute(
            f"SELECT count(*) FROM (SELECT 1 FROM {day.operations} FOR SHARE) s"
        )
        if not await connection.fetchval(_ELIGIBLE.format(t=day.operations)):
            return False
        ids = f"SELECT id FROM {day.operations}"
        for table in _PER_OPERATION:
            await connection.execute(f"DELETE FROM {table} WHERE operation_id IN ({ids})")
        await connection.execute(f"DELETE FROM operation_keys WHERE id IN ({ids})")
    await _detach(connection, OPERATIONS, day.operations)
    await _detach(connection, EVENTS, day.events)
    return await _drop_detached(connection, day)


async def _detach(
    connection: asyncpg.Connection[asyncpg.Record], table: str, partition: str
) -> None:
    await connection.execute(
        f"ALTER TABLE {table} DETACH PARTITION {partition} CONCURRENTLY", timeout=DETACH_TIMEOUT
    )


async def _drop_detached(connection: asyncpg.Connection[asyncpg.Record], day: Day) -> bool:
    """Step 3: drop a detached day if its rows still follow the rule and none has a key
    row; otherwise attach it again (whether it was dropped)."""
    async with connection.transaction():
        clean = await connection.fetchval(
            _ELIGIBLE.format(t=day.operations)
            + f" AND NOT EXISTS (SELECT 1 FROM {day.operations} o "
            "JOIN operation_keys k ON k.id = o.id)"
        )
        if clean:
            await connection.execute(f"DROP TABLE {day.operations}")
            await connection.execute(f"DROP TABLE IF EXISTS {day.events}")
            return True
    log.error(
        "postgres partition %s was detached to be dropped but holds an operation that is "
        "not forgotten (was the database's clock stepped back?): attached again",
        day.operations,
    )
    await _reattach(connection, day)
    return False


async def _reattach(connection: asyncpg.Connection[asyncpg.Record], day: Day) -> None:
    legacy_before = await connection.fetchval(f"SELECT {LEGACY_BEFORE}")
    low, high = bounds(day, legacy_before)
    async with connection.transaction():
        for table, partition in ((OPERATIONS, day.operations), (EVENTS, day.events)):
            if await connection.fetchval(
                "SELECT NOT c.relispartition FROM pg_class c WHERE c.oid = to_regclass($1)",
                partition,
            ):
                await connection.execute(
                    f"ALTER TABLE {table} ATTACH PARTITION {partition} "
                    f"FOR VALUES FROM ({low}) TO ({high})"
                )


async def _finish_interrupted(connection: asyncpg.Connection[asyncpg.Record]) -> None:
    """Finish what a pass that stopped half way left: a detach still pending, a detached
    table not dropped, an events partition whose operations partition is gone."""
    for table in (OPERATIONS, EVENTS):
        for name, pending in (await _attached(connection, table)).items():
            if pending:
                await connection.execute(
                    f"ALTER TABLE {table} DETACH PARTITION {name} FINALIZE",
                    timeout=DETACH_TIMEOUT,
                )
    for table, day in await _loose(connection):
        if table == OPERATIONS:
            if day.events in await _attached(connection, EVENTS):
                await _detach(connection, EVENTS, day.events)
            await _drop_detached(connection, day)
    operations = await _attached(connection, OPERATIONS)
    for name in await _attached(connection, EVENTS):
        named = day_of(name)
        if named is not None and named[1].operations not in operations:
            await _detach(connection, EVENTS, name)
    for _, day in await _loose(connection):  # events partitions only, by now
        if day.operations in operations:
            await _reattach(connection, day)
        else:
            await connection.execute(f"DROP TABLE {day.events}")


async def _loose(connection: asyncpg.Connection[asyncpg.Record]) -> list[tuple[str, Day]]:
    """Partitions of ours that are detached (tables of this schema, not partitions)."""
    rows = await connection.fetch(
        "SELECT c.relname FROM pg_class c WHERE c.relnamespace = current_schema()::regnamespace "
        "AND c.relkind = 'r' AND NOT c.relispartition AND c.relname ~ $1",
        _NAME.pattern,
    )
    return [named for row in rows if (named := day_of(row[0])) is not None]
