"""Fill a PostgreSQL store with a day of realistic operations, fast: `bench.prefill` for PostgreSQL.

The schema is the gateway's own: a `PostgresStore` is opened and closed on
the URL first (its migrations, its scope secret), then the rows of
`bench.fill_rows` go in with binary `COPY` (`copy_records_to_table`), which
routes rows into the day partitions of operations and events (made first for
the days the fill covers, as the store makes them: `create_day`); each key's
row in the unpartitioned key table (`operation_keys`) goes in beside its
operation. As for SQLite, the
secondary indexes are dropped while filling and made again afterwards from
their own definitions (`pg_indexes`), then the tables are analysed, as
autovacuum would have done on a store that grew row by row. Indexes that back
a constraint (primary keys, `UNIQUE`) stay throughout.
"""

from __future__ import annotations

import asyncio
import datetime
import time
from collections.abc import Sequence

import asyncpg

from bench.fill_rows import OPERATION_COLUMNS, SPAN, made_in_parallel
from bench.prefill import EXACT_ROWS, FillReport
from gateway.store.postgres_partitions import Day, create_day

__all__ = ["postgres_bytes", "prefill_postgres"]

_CHUNK = 50_000
_TIMES = frozenset(
    {"created_at", "updated_at", "lease_expires_at", "sent_at", "expires_at", "forgotten_at",
     "resolution_at"}
)  # fmt: skip
_BOOLEANS = frozenset({"body_retained", "request_kept"})
_EVENT_COLUMNS = (
    "operation_id", "seq", "type", "at_us", "actor", "version", "data", "payload", "storage",
    "prev", "hash", "op_created_at",
)  # fmt: skip
_KEY_COLUMNS = ("scope", "key", "id", "created_at")
_LOG_COLUMNS = (
    "operation_id",
    "seq",
    "at",
    "request_id",
    "status",
    "outcome",
    "replayed",
    "problem",
)
_COUNT_COLUMNS = ("operation_id", "total", "replays", "refusals")
_TABLES = ("operations", "operation_events", "request_log", "request_counts")


def prefill_postgres(
    url: str, rows: int, *, exact: int = EXACT_ROWS, now: float | None = None
) -> FillReport:
    """Fill the (empty) schema `url` names with `rows` operations of the day before `now`
    (the current time when it is None)."""
    return asyncio.run(_prefill(url, rows, exact, time.time() if now is None else now))


async def _prefill(url: str, rows: int, exact: int, now: float) -> FillReport:
    from gateway.store.postgres import PostgresStore

    started = time.perf_counter()
    store = PostgresStore(url, pool_size=1)
    await store.open()  # the gateway's first start: its schema and its scope secret
    await store.close()
    connection = await asyncpg.connect(url)
    try:
        await connection.execute("SET synchronous_commit = off")
        secret = bytes(
            await connection.fetchval("SELECT value FROM gateway_meta WHERE name = 'scope_secret'")
        )
        await _make_days(connection, now)
        indexes = await _drop_secondary_indexes(connection)
        operation_columns = [*OPERATION_COLUMNS]
        for operations, events, log, counts in made_in_parallel(
            rows, secret, exact=exact, chunk=_CHUNK, now=now
        ):
            typed = [_typed(row, operation_columns) for row in operations]
            created = {row[0]: row[11] for row in typed}  # id -> created_at
            async with connection.transaction():
                await connection.copy_records_to_table(
                    "operations", records=typed, columns=operation_columns
                )
                await connection.copy_records_to_table(
                    "operation_keys",
                    records=[(row[1], row[2], row[0], row[11]) for row in typed],
                    columns=_KEY_COLUMNS,
                )
                await connection.copy_records_to_table(
                    "operation_events",
                    records=[(*event, created[event[0]]) for event in events],
                    columns=_EVENT_COLUMNS,
                )
                await connection.copy_records_to_table(
                    "request_log",
                    records=[(*line[:2], _time(line[2]), *line[3:6], bool(line[6]), line[7])
                             for line in log],
                    columns=_LOG_COLUMNS,
                )  # fmt: skip
                await connection.copy_records_to_table(
                    "request_counts", records=counts, columns=_COUNT_COLUMNS
                )
        for statement in indexes:
            await connection.execute(statement)
        await connection.execute("ANALYZE")
        size = await postgres_bytes(connection)
    finally:
        await connection.close()
    return FillReport(
        rows=rows, exact=min(rows, exact), seconds=time.perf_counter() - started, file_bytes=size
    )


async def _make_days(connection: asyncpg.Connection, now: float) -> None:
    """The day partitions the fill's operations fall in (the day before `now`), where
    the store has not made them (it makes today's and the next days')."""
    first = datetime.datetime.fromtimestamp(now - SPAN - 60, datetime.UTC).date()
    last = datetime.datetime.fromtimestamp(now + 60, datetime.UTC).date()
    legacy_before = await connection.fetchval("SELECT gateway_legacy_before()")
    existing = {
        str(name)
        for name in await connection.fetch(
            "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
            "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'operations' "
            "AND p.relnamespace = current_schema()::regnamespace"
        )
        for name in name.values()
    }
    day = first
    while day <= last:
        if Day(day).operations not in existing:
            async with connection.transaction():
                await create_day(connection, Day(day), legacy_before)
        day += datetime.timedelta(days=1)


async def _drop_secondary_indexes(connection: asyncpg.Connection) -> list[str]:
    """Drop the indexes of the schema's tables that back no constraint and belong to no
    other index (a partition's own copy of its parent's); return their definitions."""
    made = await connection.fetch(
        "SELECT i.indexname, i.indexdef FROM pg_indexes i "
        "JOIN pg_class c ON c.relname = i.indexname "
        "JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = i.schemaname "
        "WHERE i.schemaname = current_schema() "
        "AND NOT EXISTS (SELECT 1 FROM pg_constraint k WHERE k.conindid = c.oid) "
        "AND NOT EXISTS (SELECT 1 FROM pg_inherits h WHERE h.inhrelid = c.oid)"
    )
    for record in made:
        await connection.execute(f'DROP INDEX "{record["indexname"]}"')
    return [str(record["indexdef"]) for record in made]


def _typed(row: Sequence[object], columns: Sequence[str]) -> tuple[object, ...]:
    return tuple(
        _time(value) if name in _TIMES else bool(value) if name in _BOOLEANS else value
        for name, value in zip(columns, row, strict=True)
    )


def _time(value: object) -> datetime.datetime | None:
    if value is None:
        return None
    return datetime.datetime.fromtimestamp(float(value), datetime.UTC)  # type: ignore[arg-type]


async def postgres_bytes(connection: asyncpg.Connection) -> int:
    """Bytes the schema's tables take, with their indexes, TOAST and partitions."""
    return int(
        await connection.fetchval(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind = 'r'"
        )
    )
