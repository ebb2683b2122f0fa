"""PostgreSQL's day partitions (schema version 12): one claim per key whatever the day,
lookups in one partition, retention by dropping days, and the online migration.

Days pass by stepping the database's notion of now: each test schema gets its own
`clock_timestamp()`, ahead of `pg_catalog`'s in the store's `search_path` (as
tests/test_clock_steps.py does), so the store's own statements, unchanged, see the
day move on. Stores of the previous version (11) are built with the migrations up to
11 (`migrate_unpartitioned`) and rows written by SQL, as that version wrote them.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pg
import pytest
import pytest_asyncio
from harness import GatewayProcess, settings_for, spawn, start_gateway, stop_gateway
from pg import claim_request, drop_schema, fresh_schema, require_postgres, url_for
from upstream import CountingUpstream

from gateway.engine.models import (
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    Resolution,
    StoredResponse,
)
from gateway.engine.request_lines import RequestBatch, RequestLine
from gateway.store.postgres import PostgresStore
from gateway.store.postgres_keys import by_id
from gateway.store.postgres_migration12 import BACKFILL_LOCK
from gateway.store.postgres_partitions import AHEAD_DAYS, LEGACY_BEFORE, Day, create_day, name_of
from gateway.store.postgres_schema import COLUMNS, migrate_unpartitioned
from gateway.store.postgres_statements import _SELECT_BY_KEY
from gateway.store.rows import encode_headers

pytestmark = pytest.mark.postgres

DAY = 86400.0
RESPONSE = StoredResponse(status=201, headers=(("Content-Type", "application/json"),), body=b"{}")


# --- the database's clock, stores, SQL ----------------------------------------------------


class DatabaseClock:
    """A test schema whose `clock_timestamp()` the test steps ahead."""

    def __init__(self, schema: str) -> None:
        self.schema = schema
        self.url = f"{url_for(schema)},pg_catalog"

    async def install(self) -> None:
        await sql(
            url_for(self.schema),
            "CREATE TABLE clock_offset (seconds float8 NOT NULL); "
            "INSERT INTO clock_offset VALUES (0); "
            f"CREATE FUNCTION {self.schema}.clock_timestamp() RETURNS timestamptz "
            "LANGUAGE sql VOLATILE AS 'SELECT pg_catalog.clock_timestamp() + "
            f"make_interval(secs => (SELECT seconds FROM {self.schema}.clock_offset))'",
        )

    async def step(self, seconds: float) -> None:
        await sql(self.url, f"UPDATE clock_offset SET seconds = seconds + {seconds}")


@pytest_asyncio.fixture
async def clock() -> AsyncIterator[DatabaseClock]:
    """A fresh schema with its own clock, dropped afterwards."""
    require_postgres()
    schema = await fresh_schema()
    stepped = DatabaseClock(schema)
    try:
        await stepped.install()
        yield stepped
    finally:
        await drop_schema(schema)


@pytest_asyncio.fixture(name="schema_url")
async def fresh_schema_url() -> AsyncIterator[str]:
    """A fresh schema (the server's own clock), dropped afterwards."""
    async with pg.schema_url() as url:
        yield url


@contextlib.asynccontextmanager
async def opened(url: str, *, pool_size: int = 3) -> AsyncIterator[PostgresStore]:
    store = PostgresStore(url, pool_size=pool_size)
    await store.open()
    try:
        yield store
    finally:
        await store.close()


async def sql(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    """Run one statement on its own connection (a script when there are no arguments)."""
    connection = await asyncpg.connect(url)
    try:
        if not args and ";" in query:
            await connection.execute(query)
            return []
        return list(await connection.fetch(query, *args))
    finally:
        await connection.close()


async def value(url: str, query: str, *args: Any) -> Any:
    rows = await sql(url, query, *args)
    return rows[0][0] if rows else None


async def partitions(url: str, table: str = "operations") -> set[str]:
    rows = await sql(
        url,
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = to_regclass($1)",
        table,
    )
    return {row[0] for row in rows}


async def partition_of(url: str, operation_id: str) -> str:
    """The partition holding an operation's row (its `tableoid`)."""
    return str(
        await value(
            url, "SELECT tableoid::regclass::text FROM operations WHERE id = $1", operation_id
        )
    )


async def today(url: str) -> dt.date:
    return await value(url, "SELECT (clock_timestamp() AT TIME ZONE 'UTC')::date")  # type: ignore[no-any-return]


async def completed(store: PostgresStore, key: str, *, tombstone: float) -> Operation:
    claimed = await store.claim(claim_request(key))
    assert isinstance(claimed, NewAttempt), claimed
    done = await store.complete(
        claimed.operation.id,
        claimed.operation.token,
        RESPONSE,
        body_retained=True,
        retention_seconds=min(60.0, tombstone),
        tombstone_seconds=tombstone,
        resolution=Resolution(by="upstream", at=0.0),
    )
    assert done is not None
    return done


# --- a new store --------------------------------------------------------------------------


async def test_a_new_store_has_a_key_table_and_the_days_ahead(clock: DatabaseClock) -> None:
    """Version 12: `operations` and `operation_events` partitioned by day, today's and the
    next days' partitions made (none from before: a tool may make earlier days), (scope,
    key) and id unique in the unpartitioned key table, and version 8's claim function gone
    (the previous version's replicas call it)."""
    async with opened(clock.url):
        day = await today(clock.url)
        days = {day + dt.timedelta(days=n) for n in range(AHEAD_DAYS + 1)}
        # A store created empty has no partition from before: every day is a day.
        assert await partitions(clock.url) == {name_of("operations", d) for d in days}
        assert await partitions(clock.url, "operation_events") == {
            name_of("operation_events", d) for d in days
        }
        assert await value(clock.url, "SELECT to_regclass('operations_legacy')") is None
        connection = await asyncpg.connect(clock.url)
        try:
            before = await connection.fetchval(f"SELECT {LEGACY_BEFORE}")
            async with connection.transaction():
                await create_day(connection, Day(day - dt.timedelta(days=1)), before)
        finally:
            await connection.close()
        assert name_of("operations", day - dt.timedelta(days=1)) in await partitions(clock.url)
        assert await value(clock.url, "SELECT version FROM gateway_schema_version") == 12
        unique = await sql(
            clock.url,
            "SELECT indexrelid::regclass::text FROM pg_index "
            "WHERE indrelid = 'operation_keys'::regclass AND indisunique ORDER BY 1",
        )
        assert [row[0] for row in unique] == ["operation_keys_by_id", "operation_keys_pkey"]
        assert await value(clock.url, "SELECT to_regproc('gateway_claims')") is None
        assert await value(
            clock.url, "SELECT 1 FROM gateway_meta WHERE name = 'partitions_backfilled'"
        )


# --- one claim per key, whatever the day -------------------------------------------------


async def test_a_key_held_in_an_older_day_is_answered_from_it_never_claimed_again(
    clock: DatabaseClock,
) -> None:
    """Two days on, a claim of a key whose operation lives in an older day's partition is
    answered from that operation (a replay; another request under it is the same
    operation, which the engine refuses); a released key starts its next attempt in its own
    row, in its own day. A new key lives in the new day."""
    async with opened(clock.url) as store:
        first_day = await today(clock.url)
        done = await completed(store, "k", tombstone=10 * DAY)
        claimed = await store.claim(claim_request("r"))
        assert isinstance(claimed, NewAttempt)
        released = await store.release(
            claimed.operation.id,
            claimed.operation.token,
            evidence_of("connect refused"),
            tombstone_seconds=10 * DAY,
        )
        assert released is not None

        await clock.step(2 * DAY)
        await store.partitions.maintain(force=True)
        again = await store.claim(claim_request("k"))
        assert isinstance(again, Existing)
        assert again.operation.id == done.id
        other = await store.claim(claim_request("k")._replace(fingerprint="another request"))
        assert isinstance(other, Existing)
        assert other.operation.id == done.id
        retried = await store.claim(claim_request("r"))
        assert isinstance(retried, NewAttempt)
        assert (retried.operation.id, retried.operation.attempts) == (claimed.operation.id, 2)
        fresh = await store.claim(claim_request("j"))
        assert isinstance(fresh, NewAttempt)

        old = name_of("operations", first_day)
        assert await partition_of(clock.url, done.id) == old
        assert await partition_of(clock.url, claimed.operation.id) == old
        new = name_of("operations", first_day + dt.timedelta(days=2))
        assert await partition_of(clock.url, fresh.operation.id) == new
        found = await store.get("s", "k")
        assert found is not None
        assert found.id == done.id
        assert (await store.get_by_id(done.id)) is not None
        history = (await store.history(claimed.operation.id)).events
        assert [(event.type, event.seq) for event in history] == [("claimed", 1), ("claimed", 2)]
        for key in ("k", "r", "j"):
            assert (
                await value(clock.url, "SELECT count(*) FROM operations WHERE key = $1", key) == 1
            )
            assert (
                await value(clock.url, "SELECT count(*) FROM operation_keys WHERE key = $1", key)
                == 1
            )


async def test_two_replicas_racing_on_keys_make_one_operation_each(schema_url: str) -> None:
    """Two stores (replicas) claiming the same new keys at once, each twice: one new
    operation per key; then, rounds of a forgotten key claimed again by both at once: one
    new operation each round."""
    async with opened(schema_url) as first, opened(schema_url) as second:
        keys = [f"race-{n}" for n in range(40)]
        results = await asyncio.gather(
            *(store.claim(claim_request(key)) for key in keys for store in (first, second) * 2)
        )
        won: dict[str, int] = {}
        for result in results:
            assert isinstance(result, NewAttempt | Existing), result
            if isinstance(result, NewAttempt):
                won[result.operation.key] = won.get(result.operation.key, 0) + 1
        assert won == dict.fromkeys(keys, 1)

        forgotten = await completed(first, "again", tombstone=0.0)
        for _ in range(8):
            both = await asyncio.gather(
                first.claim(claim_request("again")), second.claim(claim_request("again"))
            )
            new = [result.operation for result in both if isinstance(result, NewAttempt)]
            assert len(new) == 1, both
            assert new[0].id != forgotten.id
            done = await first.complete(
                new[0].id,
                new[0].token,
                RESPONSE,
                body_retained=True,
                retention_seconds=0.0,
                tombstone_seconds=0.0,
                resolution=Resolution(by="upstream", at=0.0),
            )
            assert done is not None
            forgotten = done
        assert await value(schema_url, "SELECT count(*) FROM operations") == len(keys) + 1
        assert await value(schema_url, "SELECT count(*) FROM operation_keys") == len(keys) + 1


async def test_a_key_row_left_without_its_operation_does_not_hold_the_key(
    schema_url: str,
) -> None:
    """An operation deleted by a writer that knows nothing of the key table (a replica of
    the previous version sweeping during a rolling upgrade) leaves its key row: the next
    claim of that key finds no operation, frees the key and claims it."""
    async with opened(schema_url) as store:
        done = await completed(store, "swept", tombstone=0.0)
        await sql(schema_url, "DELETE FROM operations WHERE id = $1", done.id)
        again = await store.claim(claim_request("swept"))
        assert isinstance(again, NewAttempt)
        assert again.operation.id != done.id
        assert await value(schema_url, "SELECT count(*) FROM operation_keys") == 1


async def test_a_claim_past_the_days_made_ahead_makes_its_day(clock: DatabaseClock) -> None:
    """The database's clock ten days on, past every partition made ahead (no sweep ran): a
    claim finds no partition for its day, makes it, and is claimed, once."""
    async with opened(clock.url) as store:
        await clock.step(10 * DAY)
        claimed = await store.claim(claim_request("late"))
        assert isinstance(claimed, NewAttempt)
        day = name_of("operations", await today(clock.url))
        assert await partition_of(clock.url, claimed.operation.id) == day
        again = await store.claim(claim_request("late"))
        assert isinstance(again, Existing)


# --- lookups in one partition -------------------------------------------------------------


async def test_lookups_by_key_and_by_id_read_one_partition(clock: DatabaseClock) -> None:
    """With operations in two days, a lookup by (scope, key) and one by id scan the one
    partition that holds the row: the others are pruned at run time, in the custom plans
    and in the generic plan a prepared statement keeps."""
    async with opened(clock.url) as store:
        old = await completed(store, "old", tombstone=10 * DAY)
        await clock.step(DAY)
        await store.partitions.maintain(force=True)
        await completed(store, "new", tombstone=10 * DAY)
    connection = await asyncpg.connect(clock.url)
    try:
        for mode in ("force_custom_plan", "force_generic_plan"):
            await connection.execute(f"SET plan_cache_mode = {mode}")
            for statement, args in (
                (_SELECT_BY_KEY, ("'s'", "'old'")),
                (f"SELECT {COLUMNS} FROM operations WHERE {by_id('$1')}", (f"'{old.id}'",)),
            ):
                await connection.execute(f"PREPARE lookup AS {statement}")
                plan = "\n".join(
                    row[0]
                    for row in await connection.fetch(
                        "EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF, SUMMARY OFF) "
                        f"EXECUTE lookup({', '.join(args)})"
                    )
                )
                await connection.execute("DEALLOCATE lookup")
                scanned = [
                    line
                    for line in plan.splitlines()
                    if " on operations_" in line and "never executed" not in line
                ]
                assert len(scanned) == 1, plan
                assert "operations_p" in scanned[0], plan
    finally:
        await connection.close()


# --- retention ----------------------------------------------------------------------------


@pytest.mark.parametrize("kept_by", [None, "unknown", "in_flight", "not yet forgotten"])
async def test_a_day_is_dropped_only_when_every_operation_in_it_is_forgotten(
    clock: DatabaseClock, kept_by: str | None
) -> None:
    """Two days on, the sweep drops a day whose operations are all past `forgotten_at`
    and settled: its partitions, its key rows (the keys are free: claimed again as new)
    and its request log go. An unknown or in-flight operation, or one not yet forgotten,
    keeps the whole day (its forgotten neighbours go row by row), and stays answerable."""
    async with opened(clock.url) as store:
        day = name_of("operations", await today(clock.url))
        gone = [await completed(store, f"gone-{n}", tombstone=600.0) for n in range(5)]
        line = RequestLine(time.time(), "req-1", 201, "replayed", True, None)
        batch = RequestBatch(gone[0].id)
        batch.add(line)
        await store.append_request_lines([batch])
        keeper: Operation | None = None
        if kept_by == "not yet forgotten":
            keeper = await completed(store, "keep", tombstone=5 * DAY)
        elif kept_by is not None:
            claimed = await store.claim(claim_request("keep"))
            assert isinstance(claimed, NewAttempt)
            keeper = claimed.operation
            if kept_by == "unknown":
                keeper = await store.mark_unknown(keeper.id, keeper.token, evidence_of("timeout"))
                assert keeper is not None

        await clock.step(2 * DAY)
        report = await store.sweep(batch=100)

        if keeper is None:
            assert day not in await partitions(clock.url)
            assert day.replace("operations", "operation_events") not in await partitions(
                clock.url, "operation_events"
            )
            assert await value(clock.url, "SELECT to_regclass($1)", day) is None
            assert await value(clock.url, "SELECT count(*) FROM operation_keys") == 0
            assert await value(clock.url, "SELECT count(*) FROM request_counts") == 0
            assert await value(clock.url, "SELECT count(*) FROM request_log") == 0
            assert report.forgotten == 0  # the day took them, not the row sweep
            again = await store.claim(claim_request("gone-0"))
            assert isinstance(again, NewAttempt)
            assert (again.operation.attempts, again.operation.id != gone[0].id) == (1, True)
            return
        assert day in await partitions(clock.url)
        assert report.forgotten == len(gone)  # the forgotten neighbours, row by row
        found = await store.get("s", "keep")
        assert found is not None
        assert found.id == keeper.id
        assert (await store.get_by_id(keeper.id)) is not None
        assert (await store.history(keeper.id)).events
        still = await store.claim(claim_request("keep"))
        assert not isinstance(still, NewAttempt)


async def test_a_day_is_dropped_once_its_last_operation_is_forgotten(clock: DatabaseClock) -> None:
    """A day kept by an operation not yet forgotten goes at the first sweep after it is."""
    async with opened(clock.url) as store:
        day = name_of("operations", await today(clock.url))
        await completed(store, "short", tombstone=600.0)
        await completed(store, "long", tombstone=3 * DAY)
        await clock.step(2 * DAY)
        await store.sweep(batch=100)
        assert day in await partitions(clock.url)
        await clock.step(2 * DAY)
        store.partitions.interval = 0.0
        await store.sweep(batch=100)
        assert day not in await partitions(clock.url)
        assert await store.get("s", "long") is None


# --- the migration from version 11 ---------------------------------------------------------


@dataclass(frozen=True)
class Template:
    """The columns every operation of a built version-11 store shares (a completed request)."""

    scope: str = "s"
    route: str = "r"
    method: str = "POST"
    path: str = "/r"
    fingerprint: str = "f"
    status: int = 201
    headers: str = field(default_factory=lambda: encode_headers(RESPONSE.headers))
    body: bytes = b"{}"
    kind: str | None = None


SECRET = bytes(range(32))

_OLD_OPERATIONS = """
INSERT INTO operations (id, scope, key, state, route, method, path, fingerprint, attempts,
    token, version, created_at, updated_at, sent_at, response_status, response_headers,
    response_body, body_retained, expires_at, forgotten_at, resolution_by, resolution_at,
    history_seq, history_head, request_kind, storage)
SELECT 'op_old' || lpad(g::text, 20, '0'), $1, 'old-' || g, 'completed', $2, $3, $4, $5, 1, 1,
    3, clock_timestamp() - interval '2 days' + g * interval '1 ms', clock_timestamp(),
    clock_timestamp(), $6, $7, $8, true, clock_timestamp() + interval '1 day',
    clock_timestamp() + interval '10 days', 'upstream', clock_timestamp(), 1, 'head-' || g, $9,
    'plain'
FROM generate_series(1, $10::int) g
"""

_OLD_EVENTS = """
INSERT INTO operation_events (operation_id, seq, type, at_us, actor, version, data, payload,
    storage, prev, hash)
SELECT id, 1, 'claimed', 0, 'gateway', 1, '{"attempt":1,"state":"in_flight","token":1}', NULL,
    'plain', '', history_head FROM operations
"""


async def build_previous_version(
    url: str, count: int, template: Template = Template(), secret: bytes = SECRET
) -> None:
    """A version-11 store holding `count` completed operations `old-1`.. (one event each)."""
    connection = await asyncpg.connect(url)
    try:
        await migrate_unpartitioned(connection)  # type: ignore[arg-type]
        await connection.execute(
            "INSERT INTO gateway_meta (name, value) VALUES ('scope_secret', $1)", secret
        )
        t = template
        await connection.execute(
            _OLD_OPERATIONS,
            t.scope,
            t.route,
            t.method,
            t.path,
            t.fingerprint,
            t.status,
            t.headers,
            t.body,
            t.kind,
            count,
        )
        await connection.execute(_OLD_EVENTS)
        await connection.execute("ANALYZE operations")
    finally:
        await connection.close()


def evidence_of(detail: str) -> Evidence:
    return Evidence(at=0.0, source="gateway", detail=detail)


async def test_until_the_backfill_is_done_keys_from_before_are_found_in_their_old_partition(
    schema_url: str,
) -> None:
    """Migrated from version 11 with the backfill held back: keys of operations from
    before are refused (a replay, never a new operation), even under another request,
    an unknown one stays unknown, a forgotten one is claimed again, and every one is read
    by key, by id and with its history through the partition from before. Once the
    backfill ran, each has its key row and all of that still holds."""
    await build_previous_version(schema_url, 3000)
    await sql(
        schema_url,
        "UPDATE operations SET state = 'unknown', response_status = NULL, "
        "response_headers = NULL, response_body = NULL, expires_at = NULL, forgotten_at = NULL, "
        "resolution_by = NULL, resolution_at = NULL WHERE key = 'old-1'; "
        "UPDATE operations SET state = 'released', response_status = NULL, "
        "response_headers = NULL, response_body = NULL, "
        "forgotten_at = clock_timestamp() - interval '1 hour' WHERE key = 'old-2'",
    )
    ids = {row[0]: row[1] for row in await sql(schema_url, "SELECT key, id FROM operations")}
    holder = await asyncpg.connect(schema_url)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", BACKFILL_LOCK)
        async with opened(schema_url) as store:
            assert await value(schema_url, "SELECT version FROM gateway_schema_version") == 12
            assert await partitions(schema_url) >= {"operations_legacy"}
            assert await value(schema_url, "SELECT count(*) FROM operation_keys") == 0

            async def check_before() -> None:
                replay = await store.claim(claim_request("old-7"))
                assert isinstance(replay, Existing)
                assert replay.operation.id == ids["old-7"]
                other = await store.claim(claim_request("old-8")._replace(fingerprint="g"))
                assert isinstance(other, Existing)
                assert other.operation.id == ids["old-8"]
                unknown = await store.claim(claim_request("old-1"))
                assert isinstance(unknown, Existing)
                assert unknown.operation.state.value == "unknown"
                many = await asyncio.gather(
                    *(store.claim(claim_request(f"old-{n}")) for n in range(100, 400))
                )
                assert all(isinstance(result, Existing) for result in many)
                for key in ("old-9", "old-2999"):
                    found = await store.get("s", key)
                    assert found is not None
                    assert found.id == ids[key]
                    by_id_found = await store.get_by_id(ids[key])
                    assert by_id_found is not None
                    assert [e.type for e in (await store.history(ids[key])).events] == ["claimed"]

            await check_before()
            reclaimed = await store.claim(claim_request("old-2"))
            assert isinstance(reclaimed, NewAttempt)
            assert reclaimed.operation.id != ids["old-2"]
            fresh = await store.claim(claim_request("new-1"))
            assert isinstance(fresh, NewAttempt)
            assert await value(schema_url, "SELECT count(*) FROM operation_keys") == 2
            assert not await value(
                schema_url, "SELECT 1 FROM gateway_meta WHERE name = 'partitions_backfilled'"
            )

            await holder.execute("SELECT pg_advisory_unlock($1)", BACKFILL_LOCK)
            await asyncio.wait_for(store.partitions.wait_backfilled(), 120)
            assert await value(
                schema_url, "SELECT 1 FROM gateway_meta WHERE name = 'partitions_backfilled'"
            )
            assert await value(schema_url, "SELECT count(*) FROM operation_keys") == await value(
                schema_url, "SELECT count(*) FROM operations"
            )
            await check_before()
            assert (
                await value(schema_url, "SELECT count(*) FROM operations WHERE key = 'old-2'") == 1
            )
    finally:
        await holder.close()


@pytest.mark.parametrize("unknown", [False, True])
async def test_the_partition_from_before_is_dropped_like_a_day(
    clock: DatabaseClock, unknown: bool
) -> None:
    """The operations from before the migration, once backfilled and all forgotten, go
    with their partition (their keys free again); one unknown operation among them keeps
    it, answerable."""
    await build_previous_version(clock.url, 500)
    if unknown:
        await sql(
            clock.url,
            "UPDATE operations SET state = 'unknown', response_status = NULL, "
            "response_headers = NULL, response_body = NULL, expires_at = NULL, "
            "forgotten_at = NULL WHERE key = 'old-1'",
        )
    async with opened(clock.url) as store:
        await asyncio.wait_for(store.partitions.wait_backfilled(), 60)
        assert "operations_legacy" in await partitions(clock.url)
        await clock.step(12 * DAY)  # past T0 (a day ahead at most), past forgotten_at
        await store.sweep(batch=1000)
        if not unknown:
            assert "operations_legacy" not in await partitions(clock.url)
            assert "operation_events_legacy" not in await partitions(clock.url, "operation_events")
            assert await value(clock.url, "SELECT count(*) FROM operation_keys") == 0
            again = await store.claim(claim_request("old-7"))
            assert isinstance(again, NewAttempt)
            return
        assert "operations_legacy" in await partitions(clock.url)
        kept = await store.get("s", "old-1")
        assert kept is not None
        assert kept.state.value == "unknown"
        assert await value(clock.url, "SELECT count(*) FROM operations") == 1  # row by row


_PREVIOUS_CLAIM = (
    "INSERT INTO operations (id, scope, key, state, route, method, path, fingerprint, attempts, "
    "token, version, created_at, updated_at, lease_owner, lease_expires_at, sent_at, "
    "request_kept, request_kind) VALUES ($1, 's', $2, 'in_flight', 'r', 'POST', '/r', 'f', 1, "
    "1, 1, clock_timestamp(), clock_timestamp(), 'o', clock_timestamp() + interval '30 s', "
    "clock_timestamp(), false, NULL) ON CONFLICT (scope, key) DO NOTHING RETURNING id"
)
"""A claim as the previous version's `_claim_existing` inserts it."""

_PREVIOUS_READ = "SELECT id, state FROM operations WHERE scope = 's' AND key = $1"


async def test_the_switch_lets_the_previous_version_read_and_refuses_its_claims(
    schema_url: str,
) -> None:
    """While a replica of this version migrates a store of 20,000 operations, a replica of
    the previous version goes on: its reads never fail (nor wait long), its claims succeed
    until the switch and are refused from then on, never made twice. Afterwards every
    operation it claimed is found, the backfill gave each its key row, and its batch claim
    function is gone."""
    await build_previous_version(schema_url, 20_000)
    stop = asyncio.Event()
    reads: list[float] = []
    claims: list[tuple[str, BaseException | None]] = []

    async def reader() -> None:
        connection = await asyncpg.connect(schema_url)
        try:
            while not stop.is_set():
                start = time.monotonic()
                row = await connection.fetchrow(_PREVIOUS_READ, f"old-{random.randint(1, 20_000)}")
                reads.append(time.monotonic() - start)
                assert row is not None
                await asyncio.sleep(0.001)
        finally:
            await connection.close()

    async def claimer() -> None:
        connection = await asyncpg.connect(schema_url)
        try:
            n = 0
            while not stop.is_set():
                n += 1
                key = f"v11-{id(connection)}-{n}"
                try:
                    await connection.fetchval(_PREVIOUS_CLAIM, f"op_v11_{key}", key)
                    claims.append((key, None))
                except asyncpg.PostgresError as exc:
                    claims.append((key, exc))
                await asyncio.sleep(0.002)
        finally:
            await connection.close()

    tasks = [asyncio.create_task(job()) for job in (reader, reader, claimer, claimer)]
    try:
        await asyncio.sleep(0.3)
        async with opened(schema_url) as store:
            await asyncio.sleep(0.3)
            stop.set()
            await asyncio.gather(*tasks)
            await asyncio.wait_for(store.partitions.wait_backfilled(), 120)
            made = [key for key, error in claims if error is None]
            refused = [error for _, error in claims if error is not None]
            assert made
            assert refused
            assert all(
                isinstance(error, asyncpg.InvalidColumnReferenceError) for error in refused
            ), refused[:3]
            for key in made:
                again = await store.claim(claim_request(key))
                assert isinstance(again, Existing), key
            assert await value(schema_url, "SELECT count(*) FROM operation_keys") == await value(
                schema_url, "SELECT count(*) FROM operations"
            )
            duplicates = await value(
                schema_url,
                "SELECT count(*) FROM (SELECT 1 FROM operations GROUP BY scope, key "
                "HAVING count(*) > 1) d",
            )
            assert duplicates == 0
    finally:
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
    assert max(reads) < 5.0, max(reads)
    with pytest.raises(asyncpg.UndefinedFunctionError):
        await sql(
            schema_url,
            "SELECT * FROM gateway_claims(NULL::text[], NULL, NULL, NULL, NULL, NULL, NULL, "
            "NULL, NULL::float8[], NULL::bool[], NULL, NULL, NULL::bytea[], NULL, NULL::bytea, "
            "NULL::bytea, NULL, NULL::float8[], NULL::bool[], NULL, NULL)",
        )
    # Its events name no partition (no `op_created_at`): refused too.
    with pytest.raises(asyncpg.CheckViolationError):
        await sql(
            schema_url,
            "INSERT INTO operation_events (operation_id, seq, type, at_us, actor, version, data, "
            "payload, storage, prev, hash) VALUES ('x', 1, 't', 0, 'a', 1, '{}', NULL, 'plain', "
            "'', 'h')",
        )


# --- the online migration, through real gateways --------------------------------------------

PATH = "/tickets/v1/issues"
OLD_BODY = json.dumps({"amount": 7315}).encode()
JSON = {"Content-Type": "application/json"}
ROUTE = {"forward_key": "key"}
ONE_SCOPE = {"scope_headers": []}
"""One caller fleet in one scope, its keys forwarded as they came (as tests/test_replicas.py
does): the upstream counts effects per key exactly."""


@dataclass
class Traffic:
    """What the callers sent and were answered while the migration ran."""

    answers: list[tuple[str, str, int, bool, float]] = field(default_factory=list)
    """(kind, key, status, replayed, when it was answered: `time.monotonic()`)"""
    new_keys: list[str] = field(default_factory=list)


async def _send(
    session: aiohttp.ClientSession, base: str, key: str, body: bytes
) -> tuple[int, bool]:
    async with session.post(
        base + PATH, data=body, headers={**JSON, "Idempotency-Key": key}
    ) as response:
        await response.read()
        return response.status, response.headers.get("Idempotent-Replayed") == "true"


async def _callers(
    gateways: list[GatewayProcess], old: int, traffic: Traffic, stop: asyncio.Event
) -> None:
    """Eight callers: new keys, retries of old keys (their answers replayed), another request
    under an old key (refused), lookups of old keys, through every gateway up."""
    counter = iter(range(1_000_000))

    async def caller(number: int) -> None:
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            while not stop.is_set():
                base = random.choice([g.url for g in gateways if g.url])
                kind = ("new", "retry", "retry", "other", "lookup")[next(counter) % 5]
                if kind == "new":
                    key = f"new-{number}-{next(counter)}"
                    traffic.new_keys.append(key)
                    status, replayed = await _send(
                        session, base, key, json.dumps({"n": key}).encode()
                    )
                elif kind in ("retry", "other"):
                    # From the end: the rows the backfill reaches last.
                    key = f"old-{old - random.randint(0, old // 3)}"
                    body = OLD_BODY if kind == "retry" else json.dumps({"amount": 1}).encode()
                    status, replayed = await _send(session, base, key, body)
                else:
                    key = f"old-{random.randint(1, old)}"
                    async with session.get(f"{base}/operations/{key}") as response:
                        document = await response.json(content_type=None)
                        status, replayed = response.status, False
                        assert status != 200 or document["state"] == "completed", document
                traffic.answers.append((kind, key, status, replayed, time.monotonic()))

    await asyncio.gather(*(caller(n) for n in range(8)))


async def _backfilled(url: str) -> bool:
    return bool(await value(url, "SELECT 1 FROM gateway_meta WHERE name = 'partitions_backfilled'"))


@pytest.mark.slow
async def test_gateways_serve_old_and_new_keys_while_the_migration_runs(
    postgres_url: str,
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
) -> None:
    """A version-11 store of 30,000 operations; a gateway of this version starts on it (the
    switch), and callers keep sending new keys, retries of old keys, another request under
    an old key, and lookups, through it while the backfill is held back, while a second
    gateway starts, and while the backfill runs to its end. No request fails: every new key
    reaches the upstream once, every retry is replayed, the other request is refused,
    every lookup finds its operation; afterwards no key has two operations, every old one
    is read by key and by id, and the flag says the backfill is done."""
    old = 30_000
    template = await _template(upstream, tmp_path)
    await build_previous_version(postgres_url, old, template)
    upstream.reset()

    holder = await asyncpg.connect(postgres_url)
    stop = asyncio.Event()
    traffic = Traffic()
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", BACKFILL_LOCK)
        first = await asyncio.to_thread(
            spawn,
            processes,
            tmp_path,
            upstream.url,
            name="a",
            store_url=postgres_url,
            route=ROUTE,
            idempotency=ONE_SCOPE,
        )
        gateways = [first]
        callers = asyncio.create_task(_callers(gateways, old, traffic, stop))
        await asyncio.sleep(2.0)
        second = await asyncio.to_thread(
            spawn,
            processes,
            tmp_path,
            upstream.url,
            name="b",
            store_url=postgres_url,
            route=ROUTE,
            idempotency=ONE_SCOPE,
        )
        gateways.append(second)
        await asyncio.sleep(1.0)
        assert not await _backfilled(postgres_url)
        await holder.execute("SELECT pg_advisory_unlock($1)", BACKFILL_LOCK)
        deadline = time.monotonic() + 120
        while not await _backfilled(postgres_url):
            assert time.monotonic() < deadline, "the backfill did not end"
            await asyncio.sleep(0.05)
        backfilled_at = time.monotonic()
        await asyncio.sleep(1.0)
        stop.set()
        await callers
    finally:
        stop.set()
        await holder.close()

    failed = [answer for answer in traffic.answers if answer[2] >= 500]
    assert not failed, failed[:5]
    before = [answer for answer in traffic.answers if answer[4] < backfilled_at]
    assert len(before) > 100, len(before)
    assert len(traffic.answers) > len(before)
    for kind, key, status, replayed, _ in traffic.answers:
        expected = {"new": (201, False), "retry": (201, True), "other": (422, False)}
        if kind == "lookup":
            assert status == 200, (kind, key, status)
        else:
            assert (status, replayed) == expected[kind], (kind, key, status, replayed)
    assert upstream.count == len(traffic.new_keys)
    assert all(upstream.count_for(key) == 1 for key in traffic.new_keys)

    for gateway in processes:
        gateway.stop()
    assert (
        await value(
            postgres_url,
            "SELECT count(*) FROM (SELECT 1 FROM operations GROUP BY scope, key "
            "HAVING count(*) > 1) d",
        )
        == 0
    )
    assert await value(postgres_url, "SELECT count(*) FROM operation_keys") == await value(
        postgres_url, "SELECT count(*) FROM operations"
    )
    # Every old operation reached through its key row, in its partition...
    assert (
        await value(
            postgres_url,
            "SELECT count(*) FROM operation_keys k WHERE k.key LIKE 'old-%' AND EXISTS "
            "(SELECT 1 FROM operations o WHERE o.id = k.id AND o.created_at = k.created_at "
            "AND o.scope = k.scope AND o.key = k.key)",
        )
        == old
    )
    # ...and through the store's own lookups, for a sample.
    rows = await sql(
        postgres_url,
        "SELECT key, id FROM operations WHERE key LIKE 'old-%' ORDER BY random() LIMIT 300",
    )
    async with opened(postgres_url) as store:
        for key, operation_id in rows:
            found = await store.get(template.scope, key)
            assert found is not None
            assert found.id == operation_id
            assert (await store.get_by_id(operation_id)) is not None


async def _template(upstream: CountingUpstream, tmp_path: Path) -> Template:
    """The columns of an old operation, from a real gateway on a scratch schema with the
    same scope secret: so that retries through today's gateway find them as their own."""
    schema = await fresh_schema()
    try:
        url = url_for(schema)
        connection = await asyncpg.connect(url)
        try:
            await migrate_unpartitioned(connection)  # type: ignore[arg-type]
            await connection.execute(
                "INSERT INTO gateway_meta (name, value) VALUES ('scope_secret', $1)", SECRET
            )
        finally:
            await connection.close()
        gateway = await start_gateway(
            settings_for(tmp_path, upstream.url, store_url=url, route=ROUTE, idempotency=ONE_SCOPE)
        )
        try:
            answer = await gateway.post(PATH, key="template", data=OLD_BODY, headers=JSON)
            assert answer.status == 201
        finally:
            await stop_gateway(gateway)
        row = (await sql(url, "SELECT * FROM operations WHERE key = 'template'"))[0]
        return Template(
            scope=row["scope"],
            route=row["route"],
            method=row["method"],
            path=row["path"],
            fingerprint=row["fingerprint"],
            status=row["response_status"],
            headers=row["response_headers"],
            body=bytes(row["response_body"]),
            kind=row["request_kind"],
        )
    finally:
        await drop_schema(schema)
