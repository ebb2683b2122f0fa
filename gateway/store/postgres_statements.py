"""The statements of the PostgreSQL store's hot path, and the claim under a row lock.

Claims and receipts made at the same time by one replica share one statement
(`_CLAIMS`, `_COMPLETES`, batched by `gateway.store.postgres_batch`); a claim
that must change an existing record is decided under that row's lock
(`_claim_existing`). The SQL fragments every write shares (the database's
clock, the outcome fence and its notification) are here too, so the store
module keeps only what each verb does.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import asyncpg

from gateway.engine.errors import StoreUnavailable
from gateway.engine.history import EventRow, NewEvent, canonical
from gateway.engine.ids import new_operation_id
from gateway.engine.lifecycle_events import (
    LEASE_EXPIRED,
    claimed_event,
    distinct_twin_event,
    lease_expired_event,
)
from gateway.engine.models import (
    ClaimRequest,
    ClaimResult,
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    Resolution,
    Similar,
    State,
    StoredResponse,
)
from gateway.engine.twins import distinct_of, is_twin, noted_twin, refusing_twin
from gateway.store.crypto import BodyCipher
from gateway.store.history_rows import EVENT_COLUMNS, HistorySeal, as_written, chained_rows
from gateway.store.postgres_keys import by_id, by_key, events_of, ids_span
from gateway.store.postgres_schema import (
    COLUMNS,
    NOTIFY_CHANNEL,
    REQUEST_LOCK_CLASS,
    REQUEST_LOCK_KEY,
    columns_of,
)
from gateway.store.rows import OPERATION_TABLES, is_forgotten

NOW = "clock_timestamp()"
NOW_ONCE = "(SELECT clock_timestamp())"
"""The database's clock read once for the statement (an init plan): a bound an index scan
can start or stop at. `NOW` itself is volatile, so a condition on it is a filter, tested on
every row read: a batch that walks an index in time order for its first rows due read the
whole index when fewer were due than its limit (every sweep of a store with nothing due)."""
SECONDS = "make_interval(secs => {})"

_OUTCOME_WRITABLE = "state IN ('in_flight', 'unknown')"
"""Where an outcome write (`complete`, `mark_unknown`, `release`) may land, under its
token: a holder whose lease lapsed (its record turned `unknown`, token unchanged)
still records what it learned; a resolution or a new attempt bumps the token."""

_OUTCOME_RETURNING = (
    f"RETURNING {COLUMNS}, "
    f"CASE WHEN watched THEN pg_notify('{NOTIFY_CHANNEL}', id) END IS NULL AS _notified"
)
"""Outcome writes return the row and notify waiting replicas in the same statement.

`watched` is read from the row as this statement updates it: a `watch` that
committed first is seen (the update waits for its row lock, then re-reads),
and one that commits after is followed by the waiter's own re-read.
"""


KEY_IN_ANY_SCOPE = (
    "key = {0} AND scope = ANY(ARRAY("
    "WITH RECURSIVE scopes(scope) AS ("
    "SELECT min(scope) FROM operations "
    "UNION ALL SELECT (SELECT min(o.scope) FROM operations o WHERE o.scope > scopes.scope) "
    "FROM scopes WHERE scopes.scope IS NOT NULL) "
    "SELECT scope FROM scopes WHERE scope IS NOT NULL))"
)
"""A `WHERE` condition (format it with the key's placeholder): the key in any scope.

A key is unique per scope only, and its one index is `(scope, key)`: a
plain `key = $n` would read every row. So the distinct scopes are walked
through that index (one `min(scope) > previous` seek each, a loose index
scan), and the key is looked up in each."""

_SELECT_BY_KEY = f"SELECT {COLUMNS} FROM operations WHERE {by_key('$1', '$2')}"
"""A key's row (and the database clock, `observed_at`), read without a lock, in the one
partition its key row names (`gateway.store.postgres_keys`)."""

_INSERT_CLAIM = (
    "WITH won AS (INSERT INTO operation_keys (scope, key, id, created_at) "
    f"VALUES ($2, $3, $1, {NOW}) ON CONFLICT DO NOTHING RETURNING created_at) "
    "INSERT INTO operations (id, scope, key, state, route, method, path, fingerprint, "
    "attempts, token, version, created_at, updated_at, lease_owner, lease_expires_at, "
    "sent_at, request_kept, request_kind) SELECT $1, $2, $3, 'in_flight', $4, $5, $6, $7, "
    f"1, 1, 1, won.created_at, won.created_at, $8, won.created_at + {SECONDS.format('$9')}, "
    f"won.created_at, $10, $11 FROM won RETURNING {COLUMNS}"
)
"""One claim's insert, under the row lock of `_claim_existing`: the key first (a key
another transaction holds is lost to it: no row), then the operation, in the partition
of the key row's `created_at`."""

_ORPHAN_KEY = (
    "DELETE FROM operation_keys k WHERE k.scope = $1 AND k.key = $2 AND NOT EXISTS "
    "(SELECT 1 FROM operations o WHERE o.id = k.id AND o.created_at = k.created_at)"
)
"""A key row whose operation is gone no longer holds its key: deleted by a claim that finds
no operation. Only a writer that knows nothing of the key table leaves one (a replica of
the version before, deleting a forgotten operation during a rolling upgrade); the store's
own deletes take the key row with the operation."""

_CLAIMS = (
    f"SELECT {columns_of('(r.op)')}, r.kind AS _kind, r.for_id AS _for "
    "FROM gateway_keyed_claims($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], "
    "$6::text[], $7::text[], $8::text[], $9::float8[], $10::bool[], $11::text[], $12::text[], "
    "$13::bytea[], $14::text[], $15::bytea, $16::bytea, $17::text[], $18::float8[], "
    "$19::bool[], $20::text[], $21::text[]) AS r"
)
"""Claims of a batch in one round trip (`gateway_keyed_claims`, schema version 12,
`gateway.store.postgres_claims`; version 8's `gateway_claims` before it): the rows it
inserted (`inserted`, found by their new ids) with a completed twin each (`twin`), the
twin that refused a new key (`similar`, `_for` its claim's id), and the existing rows
of the other keys as its snapshot sees them (`existing`).

The function first takes, in order, the advisory lock of every guarded request
(scope, route, fingerprint), then runs one statement, whose snapshot is taken
after the locks: so a claim sees every earlier claim of its request, committed,
and of two racing new keys for one request at most one is inserted. A request
that appears twice in a batch is decided alone afterwards (`None`), after the
first one's commit. Each inserted row's `claimed` event is written by the same
statement, its digest computed by the database from the statement's one clock
reading, so a new key costs one round trip and one commit, as before the history.

A key inserted by a concurrent statement that committed after this one began,
or twice in one batch, is in neither: its claim is decided under the row's
lock. A data-modifying WITH is invisible to the rest of its statement, so the
`existing` branch never returns a row the statement inserted.

Each key is looked up by a `LATERAL` subquery that `OFFSET 0` keeps from being
flattened into a join: planned on its own, a lookup by the unique (scope, key)
is an index probe. As a join, planned while the table was small (a prepared
statement keeps its plan), it became a hash join over the whole table: 7 ms a
claim at 20k rows, measured, until an ANALYZE replaced the plan.
"""

_COMPLETES = (
    "UPDATE operations o SET state = 'completed', response_status = v.status, "
    "response_headers = v.headers, response_body = v.body, storage = v.storage, "
    "body_retained = v.retained, "
    f"expires_at = {NOW} + {SECONDS.format('v.retention')}, "
    f"forgotten_at = {NOW} + {SECONDS.format('v.tombstone')}, "
    f"resolution_by = v.resolved_by, resolution_at = {NOW}, resolution_note = v.note, "
    f"lease_owner = NULL, updated_at = {NOW}, "
    "version = o.version + 1 "
    "FROM unnest($1::text[], $2::int8[], $3::int4[], $4::text[], $5::bytea[], $6::bool[], "
    "$7::float8[], $8::float8[], $9::text[], $10::text[], $11::text[]) "
    "AS v(id, token, status, headers, body, retained, retention, tombstone, resolved_by, note, "
    "storage) "
    "WHERE o.id = ANY($1::text[]) AND o.id = v.id AND o.token = v.token "
    f"AND o.state IN ('in_flight', 'unknown') AND {ids_span('$1::text[]', 'o')} "
    f"RETURNING {columns_of('o')}, "
    f"CASE WHEN o.watched THEN pg_notify('{NOTIFY_CHANNEL}', o.id) END IS NULL AS _notified"
)
"""Receipts of a batch in one statement, each fenced by its own token and state;
a write that is refused (stale) returns no row, as `complete` alone would."""


def _event_hash(t: str, *, data: str, prev: str, n: int, type: str) -> str:
    """The SQL digest of event `n` of a receipt, from the columns of CTE `t`."""
    return (
        f"gateway_event_hash({t}.actor, {t}.at_us, {t}.{data}, {t}.{prev}, {t}.s0 + {n}, "
        f"'{type}', {t}.version, $15, $16)"
    )


_COMPLETES_CHAINED = (
    "WITH v AS (SELECT * FROM unnest($1::text[], $2::int8[], $3::int4[], $4::text[], "
    "$5::bytea[], $6::bool[], $7::float8[], $8::float8[], $9::text[], $10::text[], "
    "$11::text[], $12::text[], $13::text[], $14::text[]) "
    "AS v(id, token, status, headers, body, retained, retention, tombstone, resolved_by, note, "
    f"storage, actor, data1, data2)), clock AS (SELECT {NOW} AS now), "
    # The rows this batch may write, locked: their chain heads are read under the lock.
    "cur AS (SELECT o.id, o.token, o.state, o.history_head, o.history_seq, o.version, "
    "o.created_at FROM operations o WHERE o.id = ANY($1::text[]) "
    f"AND {ids_span('$1::text[]', 'o')} FOR UPDATE), "
    "e AS (SELECT cur.id, cur.history_head AS h0, cur.history_seq AS s0, "
    "gateway_event_key(cur.created_at) AS filed, "
    "cur.version + 1 AS version, "
    "(extract(epoch from clock.now) * 1000000)::bigint AS at_us, v.actor, v.data1, v.data2 "
    "FROM cur JOIN v ON v.id = cur.id AND v.token = cur.token "
    "AND cur.state IN ('in_flight', 'unknown') CROSS JOIN clock), "
    f"e1 AS (SELECT e.*, {_event_hash('e', data='data1', prev='h0', n=1, type='sent')} "
    "AS h1 FROM e), "
    f"e2 AS (SELECT e1.*, {_event_hash('e1', data='data2', prev='h1', n=2, type='answered')} "
    "AS h2 FROM e1), "
    "events AS (INSERT INTO operation_events (operation_id, seq, type, at_us, actor, version, "
    "data, payload, storage, prev, hash, op_created_at) "
    "SELECT id, s0 + 1, 'sent', at_us, actor, version, data1, NULL::bytea, 'plain', h0, h1, "
    "filed FROM e2 "
    "UNION ALL SELECT id, s0 + 2, 'answered', at_us, actor, version, data2, NULL::bytea, 'plain', "
    "h1, h2, filed FROM e2) "
    "UPDATE operations o SET state = 'completed', response_status = v.status, "
    "response_headers = v.headers, response_body = v.body, storage = v.storage, "
    "body_retained = v.retained, "
    f"expires_at = clock.now + {SECONDS.format('v.retention')}, "
    f"forgotten_at = clock.now + {SECONDS.format('v.tombstone')}, "
    "resolution_by = v.resolved_by, resolution_at = clock.now, resolution_note = v.note, "
    "lease_owner = NULL, updated_at = clock.now, version = e2.version, "
    "history_head = e2.h2, history_seq = e2.s0 + 2 "
    "FROM v, e2, clock WHERE o.id = ANY($1::text[]) AND o.id = v.id AND o.id = e2.id "
    f"AND {ids_span('$1::text[]', 'o')} "
    f"RETURNING {columns_of('o')}, "
    f"CASE WHEN o.watched THEN pg_notify('{NOTIFY_CHANNEL}', o.id) END IS NULL AS _notified"
)
"""Receipts of a batch and their `sent` and `answered` events, chained by the database
(`gateway_event_hash`, the same digest as `gateway.engine.history.event_hash`), in one
statement: a receipt's write costs one round trip and one commit, as before the history.

The rows are locked first (`cur`), and their chain heads and versions read under that
lock; the update then writes exactly those that pass the fence (`e`). Rows are found by
`id = ANY(...)`: an index lookup in any plan, where a join with `unnest` could become a
scan of the whole table in the generic plan a prepared statement keeps (measured: 2-3 ms
a statement at 6,000 operations)."""


def chained_receipt_events(events: Sequence[NewEvent]) -> tuple[str, str, str] | None:
    """(actor, sent data, answered data) when a receipt's events are the hot path's own
    `sent` and `answered` (naming their attempt, with nothing erasable); None otherwise."""
    if len(events) != 2 or [event.type for event in events] != ["sent", "answered"]:
        return None
    sent, answered = events
    if sent.actor != answered.actor or sent.payload or answered.payload:
        return None
    if "attempt" not in sent.data or "attempt" not in answered.data:
        return None
    done = {"state": "completed"}  # what the operation is after them (`chain`)
    return (
        sent.actor,
        canonical(done | dict(sent.data)).decode(),
        canonical(done | dict(answered.data)).decode(),
    )


def claimed_row(
    operation_id: str, event: NewEvent, cipher: BodyCipher | None
) -> tuple[str, str, bytes | None, str]:
    """(actor, data, payload, storage) of a new key's `claimed` event (attempt 1, token 1),
    as `_CLAIMS` writes it; the payload sealed like any event's (`history_rows`)."""
    # The claimed event names attempt 1 and the state it leaves (`chain`).
    data = canonical({**event.data, "attempt": 1, "state": "in_flight"}).decode()
    row = EventRow(operation_id, 1, event.type, 0, event.actor, 1, data, event.payload, "", "")
    _, _, _, _, _, _, _, payload, storage, _, _ = as_written(row, cipher)
    return event.actor, data, payload, storage


def hmac_pads(seal: HistorySeal | None) -> tuple[bytes | None, bytes | None]:
    """The key's inner and outer pads (RFC 2104), for the database to compute an HMAC."""
    if seal is None:
        return None, None
    block = seal.key.ljust(64, b"\0") if len(seal.key) <= 64 else seal.key
    return bytes(b ^ 0x36 for b in block), bytes(b ^ 0x5C for b in block)


class _Receipt(NamedTuple):
    """One `complete` call, encoded for `_COMPLETES` (`stored` is what it returns)."""

    operation_id: str
    token: int
    stored: StoredResponse
    headers: str | None
    body: bytes | None
    storage: str
    body_retained: bool
    retention_seconds: float
    tombstone_seconds: float
    resolution: Resolution
    events: tuple[NewEvent, ...] = ()


_APPEND = (
    "WITH heads AS (UPDATE operations SET "
    "history_head = ($13::text[])[array_position($12::text[], id)], "
    "history_seq = ($14::int4[])[array_position($12::text[], id)] "
    f"WHERE id = ANY($12::text[]) AND {ids_span('$12::text[]')} RETURNING id, created_at) "
    f"INSERT INTO operation_events ({EVENT_COLUMNS}, op_created_at) "
    "SELECT v.*, gateway_event_key(h.created_at) FROM unnest("
    "$1::text[], $2::int4[], $3::text[], $4::int8[], $5::text[], $6::int8[], $7::text[], "
    "$8::bytea[], $9::text[], $10::text[], $11::text[]) "
    "AS v(operation_id, seq, type, at_us, actor, version, data, payload, storage, prev, hash) "
    "JOIN heads h ON h.id = v.operation_id"
)
"""Each operation's new head and its events, in one statement: the events go to the
partition of their operation's creation (`gateway_event_key`); an operation that is
gone (forgotten, its day being dropped) gets neither."""

REQUEST_PAYLOADS = "type IN ('claimed', 'probe', 'probe-blind') AND payload IS NOT NULL"
"""The events whose payload holds a request, or what a probe asked and read."""

ERASE_REQUEST = (
    f"UPDATE operation_events SET payload = NULL WHERE {events_of('$1')} AND {REQUEST_PAYLOADS}"
)
"""Drop an operation's recorded request and what its probes asked and read (retention,
redaction): their commitments stay."""


async def append_events(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    changes: Sequence[tuple[Operation, Sequence[NewEvent]]],
    cipher: BodyCipher | None,
    seal: HistorySeal | None = None,
    *,
    at: float | None = None,
) -> list[Operation]:
    """Chain each operation's events after it (as this transaction changed it), in the
    caller's transaction; the operations with their new heads."""
    rows: list[tuple[Any, ...]] = []
    heads: list[tuple[str, str, int]] = []
    appended: list[Operation] = []
    for operation, events in changes:
        if not events:
            appended.append(operation)
            continue
        written, after = chained_rows(operation, events, cipher, seal, at=at)
        rows.extend(written)
        heads.append((after.id, after.history_head, after.history_seq))
        appended.append(after)
    if rows:
        columns = [list(column) for column in zip(*rows, strict=True)]
        ids, head_hashes, seqs = (list(column) for column in zip(*heads, strict=True))
        await connection.execute(_APPEND, *columns, ids, head_hashes, seqs)
    return appended


def _insert_args(request: ClaimRequest) -> tuple[Any, ...]:
    return (
        new_operation_id(),
        request.scope,
        request.key,
        request.route,
        request.method,
        request.path,
        request.fingerprint,
        request.owner,
        request.lease_seconds,
        request.claimed is not None and request.claimed.payload is not None,
        request.kind,
    )


async def _claim_existing(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    request: ClaimRequest,
    decode: Callable[[Any], Operation],
    cipher: BodyCipher | None,
    seal: HistorySeal | None = None,
    legacy: str | None = None,
) -> ClaimResult:
    """Decide under a row lock what a claim means for its key (inserting it if absent).

    A guarded claim first takes its request's advisory lock, as `gateway_claims`
    does, so a twin claimed by any replica has committed before this one looks.
    """

    async def appended(operation: Operation, event: NewEvent) -> Operation:
        return (await append_events(connection, [(operation, (event,))], cipher, seal))[0]

    async def started(
        operation: Operation, twin: Operation | None, recorded: NewEvent | None
    ) -> NewAttempt:
        """The new attempt with its `claimed` event, and the distinct twin's note."""
        twin_id = distinct_of(request, twin)
        event = claimed_event(recorded, operation.token, distinct_from=twin_id)
        operation = await appended(operation, event)
        if twin_id is not None:
            locked = await connection.fetchrow(
                f"SELECT {COLUMNS} FROM operations WHERE {by_id('$1')} FOR UPDATE", twin_id
            )
            if locked is not None:  # evidence, dated by the claim that learned it
                event = distinct_twin_event(operation.id)
                changes = [(decode(locked), (event,))]
                await append_events(connection, changes, cipher, seal, at=operation.updated_at)
        return NewAttempt(operation, twin=twin)

    if request.similar is not None:
        await connection.execute(
            f"SELECT pg_advisory_xact_lock({REQUEST_LOCK_CLASS}, "
            f"{REQUEST_LOCK_KEY.format('$1::text', '$2::text', '$3::text')})",
            request.scope,
            request.route,
            request.fingerprint,
        )
    for _ in range(3):
        row = await connection.fetchrow(
            f"SELECT {COLUMNS} FROM operations WHERE {by_key('$1', '$2')} FOR UPDATE",
            request.scope,
            request.key,
        )
        if row is not None:
            break
        # Absent, or deleted (forgotten) while we waited for its lock: insert; if
        # another claim got its key first, its row is read, locked, on the next turn.
        await connection.execute(_ORPHAN_KEY, request.scope, request.key)
        refused, twin = await _twins(connection, request, decode, legacy)
        if refused is not None:
            return Similar(refused)
        inserted = await connection.fetchrow(_INSERT_CLAIM, *_insert_args(request))
        if inserted is not None:
            return await started(decode(inserted), twin, request.claimed)
    else:
        raise StoreUnavailable("the key changed under three concurrent claims; retry")
    current = decode(row)
    if is_forgotten(current):
        # Its rows, found through its key row, then the key row: the key is free in this
        # transaction, and no other claims it before this one commits (its delete holds it).
        await connection.execute(
            f"DELETE FROM operation_events WHERE {events_of('$1')}", current.id
        )
        for table in OPERATION_TABLES:
            if table != "operation_events":
                await connection.execute(f"DELETE FROM {table} WHERE operation_id = $1", current.id)
        await connection.execute(f"DELETE FROM operations WHERE {by_id('$1')}", current.id)
        await connection.execute("DELETE FROM operation_keys WHERE id = $1", current.id)
        refused, twin = await _twins(connection, request, decode, legacy)
        if refused is not None:
            return Similar(refused)
        inserted = await connection.fetchrow(_INSERT_CLAIM, *_insert_args(request))
        if inserted is None:
            raise StoreUnavailable("the key was claimed by another transaction; retry")
        return await started(decode(inserted), twin, request.claimed)
    if current.state is State.RELEASED and request.same_request(current.fingerprint):
        refused, twin = await _twins(connection, request, decode, legacy)
        if refused is not None:
            return Similar(refused)
        updated = await connection.fetchrow(
            "UPDATE operations SET state = 'in_flight', attempts = attempts + 1, "
            f"token = token + 1, version = version + 1, lease_owner = $2, "
            f"lease_expires_at = {NOW} + {SECONDS.format('$3')}, sent_at = {NOW}, "
            f"forgotten_at = NULL, updated_at = {NOW} WHERE {by_id('$1')} RETURNING {COLUMNS}",
            current.id,
            request.owner,
            request.lease_seconds,
        )
        return await started(decode(updated), twin, None)
    if current.lease_expired():
        evidence = Evidence(at=current.observed_at, source="lease", detail=LEASE_EXPIRED)
        expired = await connection.fetchrow(
            "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
            f"updated_at = {NOW}, version = version + 1, "
            "evidence = evidence || jsonb_build_array($2::jsonb) "
            f"WHERE {by_id('$1')} {_OUTCOME_RETURNING}",
            current.id,
            json.dumps(evidence.as_json()),
        )
        return Existing(await appended(decode(expired), lease_expired_event(LEASE_EXPIRED)))
    return Existing(current)


_SINCE = f"CASE WHEN $5 THEN {NOW} - {SECONDS.format('$4')} ELSE '-infinity' END"
"""The start of a guard's window (`SimilarGuard.within`): $4 its seconds, $5 vouched."""

_BOUND = (
    f"SELECT {columns_of('t')} FROM similar_refusals b JOIN operations t ON t.id = b.twin_id "
    "WHERE b.scope = $1 AND b.key = $2 AND b.fingerprint IN ($3, $6) "
    f"AND b.refused_at > {_SINCE} "
    f"AND (t.forgotten_at IS NULL OR t.forgotten_at > {NOW})"
)
_TWIN = (
    f"(SELECT {columns_of('o')}, 0 AS _rank FROM operations o WHERE o.scope = $1 "
    "AND o.route = $2 AND o.fingerprint IN ($3, $6) AND o.state IN ('in_flight', 'unknown') "
    f"AND o.sent_at > {_SINCE} ORDER BY o.sent_at DESC LIMIT 1) "
    f"UNION ALL (SELECT {columns_of('o')}, 1 FROM operations o WHERE o.scope = $1 "
    "AND o.route = $2 AND o.fingerprint IN ($3, $6) AND o.state = 'completed' "
    f"AND o.sent_at > {_SINCE} AND (o.forgotten_at IS NULL OR o.forgotten_at > {NOW}) "
    "ORDER BY o.sent_at DESC LIMIT 1) ORDER BY _rank LIMIT 1"
)
"""The latest unsettled twin, else the latest completed one: a seek each on
`operations_by_request`, however many completed twins the window holds."""

_BIND = (
    "INSERT INTO similar_refusals (scope, key, fingerprint, twin_id, refused_at, expires_at) "
    f"VALUES ($1, $2, $3, $4, {NOW}, {NOW} + {SECONDS.format('$5')}) "
    "ON CONFLICT (scope, key) DO UPDATE SET fingerprint = excluded.fingerprint, "
    "twin_id = excluded.twin_id, refused_at = excluded.refused_at, "
    "expires_at = excluded.expires_at"
)


async def _twins(
    connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
    request: ClaimRequest,
    decode: Callable[[Any], Operation],
    legacy: str | None,
) -> tuple[Operation | None, Operation | None]:
    """(the twin that refuses this claim, the twin a claim that goes ahead names), found
    under the request's lock, by its fingerprint (and `legacy`, the old form, while one
    may still refuse); decided by `gateway.engine.twins`. A fresh refusal binds the key
    to its twin for the window."""
    guard = request.similar
    if guard is None or guard.derived:
        return None, None
    window = (
        request.scope,
        request.route,
        request.fingerprint,
        guard.window,
        guard.vouched,
        legacy,
    )
    bound: Operation | None = None
    if not guard.distinct:
        row = await connection.fetchrow(_BOUND, request.scope, request.key, *window[2:])
        bound = None if row is None else decode(row)
    row = await connection.fetchrow(_TWIN, *window)
    twin = None if row is None else decode(row)
    if twin is not None and not is_twin(twin, guard, twin.observed_at):
        twin = None
    refusing = refusing_twin(guard, bound=bound, twin=twin)
    if refusing is not None and bound is None:
        await connection.execute(
            _BIND, request.scope, request.key, request.fingerprint, refusing.id, guard.window
        )
    return refusing, noted_twin(guard, twin)
