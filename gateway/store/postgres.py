"""The PostgreSQL store: several gateway replicas, one truth.

- A claim is atomic across replicas: `INSERT ... ON CONFLICT DO NOTHING` of a
  new key into the unpartitioned key table `operation_keys`, then the
  operation's row for the keys won, in one statement (an existing key's row is
  returned instead: a retry of a settled key is answered from it), and a row
  lock (`FOR UPDATE`) when the claim must change an existing record, so exactly
  one replica gets the right to send.
- Operations and their events live in day partitions (schema version 12,
  `gateway.store.postgres_partitions`); every lookup by key or by id goes
  through the key table to one partition (`gateway.store.postgres_keys`), and
  the sweep drops whole days whose operations are all forgotten
  (`gateway.store.postgres_maintenance`).
- Claims, and receipts, made at the same time by one replica share one
  statement and one commit (`gateway.store.postgres_batch`).
- Leases, expiries and retention are measured on the database's clock
  (`clock_timestamp()`), never a replica's.
- Outcome writes are fenced by state and token like SQLite's. A replica
  waiting on a key another holds (`Prefer: wait`) marks the row `watched`;
  outcome writes of watched rows notify `NOTIFY_CHANNEL` in the same
  statement, so the waiter learns the outcome without polling. Unwatched rows
  are not notified: a NOTIFY takes a database-wide lock at commit, which
  would serialize every receipt's commit for the rare retry that waits.
- Sweeps and orphan expiry take bounded batches with `FOR UPDATE SKIP LOCKED`:
  every replica may run them at once without blocking each other.

Every driver or connection failure surfaces as `StoreUnavailable`; the pool
reconnects on its own once the server is back. The connections live in
`gateway.store.postgres_connection`, the batched statements and the locked
claim in `gateway.store.postgres_statements`; this module is the verbs.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
import asyncpg.pool

from gateway.engine.calibration import Calibration, CalibrationChange
from gateway.engine.errors import StoreUnavailable
from gateway.engine.history import NewEvent, capped, micros
from gateway.engine.ids import new_operation_id
from gateway.engine.lifecycle_events import (
    LEASE_LAPSED,
    claimed_event,
    expired_event,
    lease_expired_event,
)
from gateway.engine.models import (
    ClaimRequest,
    ClaimResult,
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    ReplayableReceipt,
    Resolution,
    Similar,
    SimilarGuard,
    State,
    StoredResponse,
)
from gateway.engine.request_lines import (
    FIRST,
    LAST,
    RequestBatch,
    RequestLine,
    RequestLog,
    numbered,
)
from gateway.engine.twins import BINDING_SWEEP_SLACK
from gateway.store import postgres_calibration as calibration_rows
from gateway.store.base import (
    ChainEvidence,
    HistoryPage,
    OperationFilter,
    Page,
    Renewal,
    SweepReport,
    like_prefix,
)
from gateway.store.crypto import BodyCipher
from gateway.store.history_rows import (
    BASELINE,
    KEY_SINCE,
    READ_COLUMNS,
    UPSERT_CHECKPOINT,
    CheckpointEntry,
    HistorySeal,
    baseline_done,
    baseline_rows,
    checkpoint_of,
    checkpoint_rows,
    key_since_record,
    keyed_from_of,
    next_checkpoint,
    probe_merge,
    read_rows,
)
from gateway.store.postgres_batch import StatementBatcher
from gateway.store.postgres_connection import PostgresConnection, _translated
from gateway.store.postgres_keys import by_id, events_of, ids_span
from gateway.store.postgres_maintenance import PartitionKeeper
from gateway.store.postgres_partitions import NOT_FORGOTTEN
from gateway.store.postgres_prefix import COUNT as PREFIX_COUNT
from gateway.store.postgres_prefix import WALK_FROM as PREFIX_WALK_FROM
from gateway.store.postgres_prefix import PrefixIndexes, matching, upper_bound
from gateway.store.postgres_schema import COLUMNS, NOTIFY_CHANNEL, columns_of, migrate
from gateway.store.postgres_statements import (
    _CLAIMS,
    _COMPLETES,
    _COMPLETES_CHAINED,
    _OUTCOME_RETURNING,
    _OUTCOME_WRITABLE,
    _SELECT_BY_KEY,
    ERASE_REQUEST,
    KEY_IN_ANY_SCOPE,
    NOW,
    NOW_ONCE,
    REQUEST_PAYLOADS,
    SECONDS,
    _claim_existing,
    _Receipt,
    append_events,
    chained_receipt_events,
    claimed_row,
    hmac_pads,
)
from gateway.store.rows import (
    ATTACHABLE,
    LEGACY_SINCE,
    LEGACY_UNSETTLED,
    UPGRADES,
    WITNESS_PREFIX,
    LegacyFingerprints,
    as_stored,
    claim_changes,
    decode_cursor,
    encode_cursor,
    is_forgotten,
    row_to_operation,
    scope_secret_lost,
    seal_receipt,
    upgraded_since,
)


class PostgresStore(PostgresConnection):
    """`Store` on PostgreSQL, shared by any number of gateway replicas.

    >>> # store = PostgresStore("postgresql://gateway@db:5432/gateway", pool_size=10)
    >>> # await store.open(); ...; await store.close()
    """

    def __init__(
        self,
        url: str,
        *,
        pool_size: int = 10,
        command_timeout: float = 10.0,
        cipher: BodyCipher | None = None,
        history_key: bytes | None = None,
    ) -> None:
        super().__init__(url, pool_size=pool_size, command_timeout=command_timeout)
        self._cipher = cipher
        self._history_key = history_key
        self._seal: HistorySeal | None = None
        self._secret: bytes | None = None
        self._legacy = LegacyFingerprints()
        self._claims = StatementBatcher(self._run_claims)
        self._completes = StatementBatcher(self._run_completes)
        self._partitions = PartitionKeeper(url, self._require_pool)
        self._prefix = PrefixIndexes(url, self._require_pool)

    @property
    def partitions(self) -> PartitionKeeper:
        """The upkeep of the day partitions (made ahead, dropped, the backfill)."""
        return self._partitions

    # -- lifecycle ---------------------------------------------------------------

    async def open(self) -> None:
        pool = await self._open_pool()
        try:
            async with _translated("migration"), pool.acquire() as connection:
                await migrate(connection)
            async with _translated("partitions"):
                await self._partitions.opened()
            async with _translated("migration"):
                await self._prefix.opened()
            self._secret = await self._load_or_create_secret()
            if self._history_key is not None:
                self._seal = await self._history_seal(self._history_key)
            self._legacy = await self._legacy_fingerprints()
        except BaseException:
            await self.close()
            raise

    async def _legacy_fingerprints(self) -> LegacyFingerprints:
        since = await self._fetchval(
            "migration", "SELECT value FROM gateway_meta WHERE name = $1", LEGACY_SINCE
        )
        if since is None:
            return LegacyFingerprints()
        unsettled = await self._fetchval("migration", LEGACY_UNSETTLED)
        return LegacyFingerprints(float(bytes(since).decode()), unsettled is not None)

    def _twin_form(self, request: ClaimRequest) -> str | None:
        """The old fingerprint form a claim's twins are looked up by too (`LegacyFingerprints`;
        judged on this host's clock, inside a margin for its disagreement with the store's)."""
        return self._legacy.twin_form(request, time.time())

    @property
    def prefix_indexes(self) -> PrefixIndexes:
        """The key table's indexes for the admin search by prefix (built at open or after)."""
        return self._prefix

    async def close(self) -> None:
        await self._partitions.close()
        await self._prefix.close()
        await self._claims.drain()
        await self._completes.drain()
        await self._close_connections()

    def _decode(self, row: Any) -> Operation:
        return row_to_operation(row, self._cipher)

    def history_seal(self) -> HistorySeal | None:
        return self._seal

    async def _history_seal(self, key: bytes) -> HistorySeal:
        """The key, once every operation that had plain events when it came has its
        keyed-since record (`BASELINE`; one replica at a time, under a lock)."""
        now_us = micros(await self.now())
        async with (
            _translated("history_key"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            await connection.execute("SELECT pg_advisory_xact_lock(hashtext($1))", KEY_SINCE)
            record = await connection.fetchval(
                "SELECT value FROM gateway_meta WHERE name = $1", KEY_SINCE
            )
            if not baseline_done(key, None if record is None else bytes(record)):
                found = await connection.fetch(BASELINE)
                await connection.executemany(
                    "INSERT INTO history_keyed_since (operation_id, seq, mac) "
                    "VALUES ($1, $2, $3) ON CONFLICT (operation_id) DO NOTHING",
                    baseline_rows(key, (tuple(row) for row in found)),
                )
                await connection.execute(
                    "INSERT INTO gateway_meta (name, value) VALUES ($1, $2) "
                    "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                    KEY_SINCE,
                    key_since_record(key, now_us),
                )
        return HistorySeal(key)

    async def chain_evidence(self, operation_id: str) -> ChainEvidence | None:
        async with (
            _translated("history"),
            self._require_pool().acquire() as connection,
            connection.transaction(isolation="repeatable_read", readonly=True),
        ):
            row = await connection.fetchrow(
                f"SELECT {COLUMNS} FROM operations WHERE {by_id('$1')}", operation_id
            )
            if row is None:
                return None
            raw = await connection.fetch(
                f"SELECT {READ_COLUMNS} FROM operation_events WHERE {events_of('$1')} ORDER BY seq",
                operation_id,
            )
            keyed = await connection.fetchrow(
                "SELECT seq, mac FROM history_keyed_since WHERE operation_id = $1", operation_id
            )
            checkpoint = await connection.fetchrow(
                "SELECT seq, head, checkpoint, at_us, mac FROM history_checkpoints "
                "WHERE operation_id = $1",
                operation_id,
            )
        events, payloads = read_rows([tuple(event) for event in raw], self._cipher)
        return ChainEvidence(
            self._decode(row),
            HistoryPage(tuple(events), tuple(payloads)),
            keyed_from_of(None if keyed is None else tuple(keyed)),
            checkpoint_of(None if checkpoint is None else tuple(checkpoint)),
        )

    async def write_checkpoint(self) -> int:
        seal = self._seal
        if seal is None or not seal.touched:
            return 0
        touched = seal.take_touched()
        try:
            async with (
                _translated("checkpoint"),
                self._require_pool().acquire() as connection,
                connection.transaction(),
            ):
                # Replicas number their checkpoints in one chain: one at a time.
                await connection.execute(
                    "SELECT pg_advisory_xact_lock(hashtext('history_checkpoint'))"
                )
                at_us = micros(await connection.fetchval(f"SELECT extract(epoch from {NOW})"))
                heads = await connection.fetch(
                    "SELECT id, history_seq, history_head FROM operations "
                    f"WHERE id = ANY($1::text[]) AND {ids_span('$1::text[]')}",
                    sorted(touched),
                )
                last = await connection.fetchrow(
                    "SELECT checkpoint, mac FROM history_checkpoint_log "
                    "ORDER BY checkpoint DESC LIMIT 1"
                )
                entry = next_checkpoint(
                    seal.key, None if last is None else tuple(last), at_us, len(heads)
                )
                await connection.executemany(
                    UPSERT_CHECKPOINT.format("$1, $2, $3, $4, $5, $6"),
                    checkpoint_rows(seal.key, entry.number, at_us, (tuple(h) for h in heads)),
                )
                await connection.execute(
                    "INSERT INTO history_checkpoint_log VALUES ($1, $2, $3, $4, $5)", *entry
                )
        except BaseException:
            seal.touched |= touched  # the next checkpoint covers them
            raise
        return len(heads)

    async def checkpoint_log(self) -> list[CheckpointEntry]:
        rows = await self._fetch(
            "history",
            "SELECT checkpoint, at_us, count, prev, mac FROM history_checkpoint_log "
            "ORDER BY checkpoint",
        )
        return [CheckpointEntry(*row) for row in rows]

    async def _load_or_create_secret(self) -> bytes:
        """The scope secret; made on first start only (see `scope_secret_lost`).

        Insert-if-absent, then read back: replicas starting together all use the
        one row that won. Never inserted beside existing operations.
        """
        await self._fetchval(
            "secret",
            "INSERT INTO gateway_meta (name, value) SELECT 'scope_secret', $1 "
            "WHERE NOT EXISTS (SELECT 1 FROM operations) "
            "ON CONFLICT (name) DO NOTHING",
            secrets.token_bytes(32),
        )
        value = await self._fetchval(
            "secret", "SELECT value FROM gateway_meta WHERE name = 'scope_secret'"
        )
        if value is None:
            raise scope_secret_lost()
        return bytes(value)

    async def watch(self, operation_id: str) -> None:
        async with _translated("watch"):
            await self._require_pool().execute(
                f"UPDATE operations SET watched = true WHERE {by_id('$1')} AND NOT watched",
                operation_id,
            )

    async def ping(self) -> None:
        await self._fetchval("ping", "SELECT version FROM gateway_schema_version")
        if self._on_settled is not None and not self.listening:
            with contextlib.suppress(StoreUnavailable):
                await self._listen()

    async def now(self) -> float:
        return float(await self._fetchval("clock", f"SELECT extract(epoch from {NOW})::float8"))

    async def scope_secret(self) -> bytes:
        if self._secret is None:
            raise StoreUnavailable("the PostgreSQL store is not open")
        return self._secret

    async def upgraded_since(self, change: str) -> float | None:
        assert change in UPGRADES
        await self._fetchval(
            "meta",
            "INSERT INTO gateway_meta (name, value) SELECT $1, convert_to(CASE WHEN EXISTS "
            "(SELECT 1 FROM operations) THEN extract(epoch from clock_timestamp())::text "
            "ELSE '0' END, 'UTF8') ON CONFLICT (name) DO NOTHING",
            change,
        )
        value = await self._fetchval(
            "meta", "SELECT value FROM gateway_meta WHERE name = $1", change
        )
        return upgraded_since(bytes(value))

    async def read_clock_witnesses(self) -> dict[str, bytes]:
        rows = await self._fetch(
            "witness",
            "SELECT name, value FROM gateway_meta WHERE left(name, $1) = $2",
            len(WITNESS_PREFIX),
            WITNESS_PREFIX,
        )
        return {row["name"].removeprefix(WITNESS_PREFIX): bytes(row["value"]) for row in rows}

    async def write_clock_witness(self, host: str, witness: bytes) -> None:
        await self._fetchval(
            "witness",
            "INSERT INTO gateway_meta (name, value) VALUES ($1, $2) "
            "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
            WITNESS_PREFIX + host,
            witness,
        )

    # -- the state machine's verbs ----------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        try:
            return await self._claim(request)
        except StoreUnavailable as exc:
            if not _no_partition(exc):
                raise
        # The database's clock is past the partitions made ahead (no sweep for days, or
        # a clock step): make today's, then claim again (the failed claim wrote nothing).
        async with _translated("partitions"):
            await self._partitions.ensure()
        return await self._claim(request)

    async def _claim(self, request: ClaimRequest) -> ClaimResult:
        async with _translated("claim"):
            # A claim marked distinct notes its twin in the twin's history: under that
            # row's lock, alone (rare: a deliberate second effect).
            distinct = request.similar is not None and request.similar.distinct
            claimed = None if distinct else await self._claims.submit(request)
            if claimed is not None:
                return claimed
            # The claim changes the record, or a concurrent claim's row is newer than
            # the batch's snapshot: decide again under the row's lock.
            async with self._require_pool().acquire() as connection, connection.transaction():
                return await _claim_existing(
                    connection,
                    request,
                    self._decode,
                    self._cipher,
                    self._seal,
                    self._twin_form(request),
                )

    async def _changed(
        self,
        action: str,
        events: Sequence[NewEvent],
        query: str,
        *args: Any,
        stored: StoredResponse | None = None,
    ) -> Operation | None:
        """Run one write and append its events to the history, in one transaction."""
        async with (
            _translated(action),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            row = await connection.fetchrow(query, *args)
            if row is None:
                return None
            operation = row_to_operation(row, self._cipher, stored=stored)
            if not events:
                return operation
            return (
                await append_events(connection, [(operation, events)], self._cipher, self._seal)
            )[0]

    async def _run_claims(self, requests: Sequence[ClaimRequest]) -> list[ClaimResult | None]:
        """One round trip for a batch of claims and their `claimed` events (`gateway_claims`):
        each gets its new row (with a completed twin), its refusing twin, the key's row
        as the statement saw it (when the claim would not change it), or `None`."""
        ids = [new_operation_id() for _ in requests]
        events = [
            claimed_row(operation_id, claimed_event(request.claimed, 1), self._cipher)
            for operation_id, request in zip(ids, requests, strict=True)
        ]
        inner, outer = hmac_pads(self._seal)
        if self._seal is not None:
            self._seal.touched.update(ids)
        guards = [_guard_kind(request.similar) for request in requests]
        rows = await self._require_pool().fetch(
            _CLAIMS,
            ids,
            [request.scope for request in requests],
            [request.key for request in requests],
            [request.route for request in requests],
            [request.method for request in requests],
            [request.path for request in requests],
            [request.fingerprint for request in requests],
            [request.owner for request in requests],
            [request.lease_seconds for request in requests],
            [
                request.claimed is not None and request.claimed.payload is not None
                for request in requests
            ],
            [event[0] for event in events],
            [event[1] for event in events],
            [event[2] for event in events],
            [event[3] for event in events],
            inner,
            outer,
            guards,
            [0.0 if r.similar is None else r.similar.window for r in requests],
            [r.similar is None or r.similar.vouched for r in requests],
            [r.kind for r in requests],
            [self._twin_form(r) for r in requests],
        )
        found: dict[tuple[str, str], Any] = {}
        existing: dict[tuple[str, str], Any] = {}
        for row in rows:
            kind = row["_kind"]
            if kind == "existing":
                existing[(row["scope"], row["key"])] = row
            else:  # inserted: by its own id; similar, twin: by the id of the claim
                found[(kind, row["id"] if kind == "inserted" else row["_for"])] = row
        results: list[ClaimResult | None] = []
        for operation_id, request in zip(ids, requests, strict=True):
            mine: Any = found.get(("inserted", operation_id))
            if mine is not None:
                twin = found.get(("twin", operation_id))
                twin_op = None if twin is None else self._decode(twin)
                results.append(NewAttempt(self._decode(mine), twin=twin_op))
                continue
            refused = found.get(("similar", operation_id))
            if refused is not None:
                results.append(Similar(self._decode(refused)))
                continue
            key_row = existing.get((request.scope, request.key))
            if key_row is None:
                results.append(None)
                continue
            current = self._decode(key_row)
            changes = claim_changes(current, request)
            results.append(None if changes else Existing(current))
        return results

    async def complete(
        self,
        operation_id: str,
        token: int,
        response: StoredResponse,
        *,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        resolution: Resolution,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        sealed = seal_receipt(
            response, response.body if body_retained else None, operation_id, self._cipher
        )
        receipt = _Receipt(
            operation_id=operation_id,
            token=token,
            stored=as_stored(response, body_retained=body_retained),
            headers=sealed.headers,
            body=sealed.body,
            storage=sealed.storage,
            body_retained=body_retained,
            retention_seconds=retention_seconds,
            tombstone_seconds=max(tombstone_seconds, retention_seconds),
            resolution=resolution,
            events=tuple(events),
        )
        async with _translated("complete"):
            return await self._completes.submit(receipt)

    async def complete_late(
        self,
        operation_id: str,
        attempt: int,
        response: StoredResponse,
        *,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        sealed = seal_receipt(
            response, response.body if body_retained else None, operation_id, self._cipher
        )
        released = "state = 'released'"
        return await self._changed(
            "complete",
            events,
            "UPDATE operations SET state = 'completed', response_status = $3, "
            "response_headers = $4, response_body = $5, storage = $6, body_retained = $7, "
            f"expires_at = {NOW} + {SECONDS.format('$8')}, "
            f"forgotten_at = {NOW} + {SECONDS.format('$9')}, "
            f"resolution_by = CASE WHEN {released} THEN 'upstream' ELSE resolution_by END, "
            f"resolution_at = CASE WHEN {released} THEN {NOW} ELSE resolution_at END, "
            f"resolution_note = CASE WHEN {released} THEN NULL ELSE resolution_note END, "
            f"lease_owner = NULL, token = token + 1, updated_at = {NOW}, "
            f"version = version + 1 WHERE {by_id('$1')} AND attempts = $2 "
            f"AND (state = 'released' OR {ATTACHABLE}) AND {NOT_FORGOTTEN} {_OUTCOME_RETURNING}",
            operation_id,
            attempt,
            response.status,
            sealed.headers,
            sealed.body,
            sealed.storage,
            body_retained,
            retention_seconds,
            max(tombstone_seconds, retention_seconds),
            stored=as_stored(response, body_retained=body_retained),
        )

    async def attach_receipt(
        self,
        operation_id: str,
        response: StoredResponse,
        *,
        expected_version: int | None,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        sealed = seal_receipt(
            response, response.body if body_retained else None, operation_id, self._cipher
        )
        return await self._changed(
            "attach",
            events,
            "UPDATE operations SET response_status = $3, response_headers = $4, "
            "response_body = $5, storage = $6, body_retained = $7, "
            f"expires_at = {NOW} + {SECONDS.format('$8')}, "
            f"forgotten_at = {NOW} + {SECONDS.format('$9')}, updated_at = {NOW}, "
            f"version = version + 1 WHERE {by_id('$1')} AND ($2::bigint IS NULL OR version = $2) "
            f"AND {ATTACHABLE} AND {NOT_FORGOTTEN} {_OUTCOME_RETURNING}",
            operation_id,
            expected_version,
            response.status,
            sealed.headers,
            sealed.body,
            sealed.storage,
            body_retained,
            retention_seconds,
            max(tombstone_seconds, retention_seconds),
            stored=as_stored(response, body_retained=body_retained),
        )

    async def append_request_lines(self, batches: Sequence[RequestBatch]) -> None:
        async with (
            _translated("request_log"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            # In id order, so that two replicas writing lines of the same operations never
            # wait for each other's row locks in turn.
            for batch in sorted(batches, key=lambda b: b.operation_id):
                total = await connection.fetchval(
                    "INSERT INTO request_counts (operation_id, total, replays, refusals) "
                    "SELECT $1, $2, $3, $4 WHERE EXISTS "
                    f"(SELECT 1 FROM operations WHERE {by_id('$1')}) "
                    "ON CONFLICT (operation_id) DO UPDATE SET "
                    "total = request_counts.total + excluded.total, "
                    "replays = request_counts.replays + excluded.replays, "
                    "refusals = request_counts.refusals + excluded.refusals RETURNING total",
                    batch.operation_id,
                    batch.total,
                    batch.replays,
                    batch.refusals,
                )
                if total is None:
                    continue
                await connection.executemany(
                    "INSERT INTO request_log (operation_id, seq, at, request_id, status, "
                    "outcome, replayed, problem) VALUES ($1, $2, to_timestamp($3), $4, $5, $6, "
                    "$7, $8)",
                    [
                        (batch.operation_id, seq, line.at, line.request_id, line.status,
                         line.outcome, line.replayed, line.problem)
                        for seq, line in numbered(batch, total=total)
                    ],
                )  # fmt: skip
                await connection.execute(
                    "DELETE FROM request_log WHERE operation_id = $1 AND seq > $2 AND seq <= $3",
                    batch.operation_id,
                    FIRST,
                    total - LAST,
                )

    async def request_log(self, operation_id: str, *, lines: bool = True) -> RequestLog:
        counts = await self._fetchrow(
            "request_log",
            "SELECT total, replays, refusals FROM request_counts WHERE operation_id = $1",
            operation_id,
        )
        if counts is None:
            return RequestLog()
        if not lines:
            return RequestLog(total=counts[0], replays=counts[1], refusals=counts[2])
        rows = await self._fetch(
            "request_log",
            "SELECT seq, extract(epoch from at)::float8, request_id, status, outcome, replayed, "
            "problem FROM request_log WHERE operation_id = $1 ORDER BY seq",
            operation_id,
        )
        kept = tuple(
            (row[0], RequestLine(row[1], row[2], row[3], row[4], row[5], row[6])) for row in rows
        )
        return RequestLog(kept, total=counts[0], replays=counts[1], refusals=counts[2])

    async def _run_completes(self, receipts: Sequence[_Receipt]) -> list[Operation | None]:
        """One statement for a batch of receipts, each fenced by its own token, with their
        events chained by the database (`_COMPLETES_CHAINED`); receipts with other events
        than the hot path's own take two statements in one transaction."""
        chained = [chained_receipt_events(receipt.events) for receipt in receipts]
        if all(events is not None for events in chained):
            return await self._complete_chained(receipts, chained)
        async with self._require_pool().acquire() as connection, connection.transaction():
            return await self._complete_batch(connection, receipts)

    async def _complete_chained(
        self, receipts: Sequence[_Receipt], chained: Sequence[tuple[str, str, str] | None]
    ) -> list[Operation | None]:
        inner, outer = hmac_pads(self._seal)
        if self._seal is not None:
            self._seal.touched.update(receipt.operation_id for receipt in receipts)
        rows = await self._require_pool().fetch(
            _COMPLETES_CHAINED,
            *_receipt_columns(receipts),
            [events[0] for events in chained if events is not None],
            [events[1] for events in chained if events is not None],
            [events[2] for events in chained if events is not None],
            inner,
            outer,
        )
        written = {row["id"]: row for row in rows}
        return [
            None if row is None else row_to_operation(row, self._cipher, stored=receipt.stored)
            for receipt in receipts
            for row in (written.get(receipt.operation_id),)
        ]

    async def _complete_batch(
        self,
        connection: asyncpg.pool.PoolConnectionProxy[asyncpg.Record],
        receipts: Sequence[_Receipt],
    ) -> list[Operation | None]:
        rows = await connection.fetch(
            _COMPLETES,
            *_receipt_columns(receipts),
        )
        written = {row["id"]: row for row in rows}
        changes = [
            (row_to_operation(row, self._cipher, stored=receipt.stored), receipt.events)
            for receipt in receipts
            if (row := written.get(receipt.operation_id)) is not None
        ]
        appended = {
            operation.id: operation
            for operation in await append_events(connection, changes, self._cipher, self._seal)
        }
        return [appended.get(receipt.operation_id) for receipt in receipts]

    async def mark_unknown(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._changed(
            "mark_unknown",
            events,
            "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
            f"updated_at = {NOW}, version = version + 1, "
            "evidence = evidence || jsonb_build_array($3::jsonb) "
            f"WHERE {by_id('$1')} AND token = $2 AND {_OUTCOME_WRITABLE} {_OUTCOME_RETURNING}",
            operation_id,
            token,
            json.dumps(evidence.as_json()),
        )

    async def release(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        *,
        tombstone_seconds: float,
        retention_seconds: float = 0.0,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._changed(
            "release",
            events,
            "UPDATE operations SET state = 'released', lease_owner = NULL, "
            f"forgotten_at = {NOW} + {SECONDS.format('$4')}, "
            f"expires_at = {NOW} + {SECONDS.format('$5')}, "
            f"updated_at = {NOW}, version = version + 1, "
            "evidence = evidence || jsonb_build_array($3::jsonb) "
            f"WHERE {by_id('$1')} AND token = $2 AND {_OUTCOME_WRITABLE} {_OUTCOME_RETURNING}",
            operation_id,
            token,
            json.dumps(evidence.as_json()),
            max(tombstone_seconds, retention_seconds),
            retention_seconds,
        )

    async def renew(self, leases: dict[str, int], *, owner: str, lease_seconds: float) -> Renewal:
        if not leases:
            return Renewal(frozenset(), frozenset(), await self.now())
        ids, tokens = zip(*leases.items(), strict=True)
        evidence = json.dumps(Evidence(at=0.0, source="lease", detail=LEASE_LAPSED).as_json())
        async with (
            _translated("renew"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            at = await connection.fetchval(f"SELECT extract(epoch from {NOW})::float8")
            rows = await connection.fetch(
                # Never earlier than it was: a renewal read on a clock stepped back for a
                # moment must not shorten the window a release waits for.
                "UPDATE operations o SET lease_expires_at = greatest(o.lease_expires_at, "
                f"{NOW} + {SECONDS.format('$4')}) "
                "FROM unnest($1::text[], $2::bigint[]) AS held(id, token) "
                "WHERE o.id = held.id AND o.token = held.token AND o.lease_owner = $3 "
                f"AND o.state = 'in_flight' AND o.lease_expires_at > {NOW} "
                f"AND o.id = ANY($1::text[]) AND {ids_span('$1::text[]', 'o')} RETURNING o.id",
                list(ids),
                list(tokens),
                owner,
                lease_seconds,
            )
            lapsed = await connection.fetch(
                "UPDATE operations o SET state = 'unknown', lease_owner = NULL, "
                f"updated_at = {NOW}, version = version + 1, "
                "evidence = evidence || jsonb_build_array("
                f"jsonb_set($4::jsonb, '{{at}}', to_jsonb(extract(epoch from {NOW})::float8))) "
                "FROM unnest($1::text[], $2::bigint[]) AS held(id, token) "
                "WHERE o.id = held.id AND o.token = held.token AND o.lease_owner = $3 "
                f"AND o.state = 'in_flight' AND o.lease_expires_at <= {NOW} "
                f"AND o.id = ANY($1::text[]) AND {ids_span('$1::text[]', 'o')} "
                f"RETURNING {columns_of('o')}, CASE WHEN o.watched THEN "
                f"pg_notify('{NOTIFY_CHANNEL}', o.id) END IS NULL AS _notified",
                list(ids),
                list(tokens),
                owner,
                evidence,
            )
            event = lease_expired_event(LEASE_LAPSED)
            await append_events(
                connection,
                [(row_to_operation(row, self._cipher, lenient=True), (event,)) for row in lapsed],
                self._cipher,
                self._seal,
            )
        return Renewal(
            frozenset(row["id"] for row in rows), frozenset(row["id"] for row in lapsed), at
        )

    async def add_evidence(
        self, operation_id: str, evidence: Evidence, events: Sequence[NewEvent] = ()
    ) -> None:
        """Evidence changes no version (an operator's `If-Match` survives probes); a fact
        that repeats the latest one is not kept again (`Evidence.repeats`)."""
        async with (
            _translated("add_evidence"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            # `Evidence.repeats`: the latest item but for its time is not kept again.
            row = await connection.fetchrow(
                "UPDATE operations SET evidence = evidence || CASE "
                "WHEN (evidence -> -1) - 'at' = $2::jsonb - 'at' THEN '[]'::jsonb "
                "ELSE jsonb_build_array($2::jsonb) END "
                f"WHERE {by_id('$1')} RETURNING {COLUMNS}",
                operation_id,
                json.dumps(evidence.as_json()),
            )
            if row is None:
                return
            operation = row_to_operation(row, self._cipher, lenient=True)
            last = await connection.fetchrow(
                f"SELECT {READ_COLUMNS} FROM operation_events WHERE {events_of('$1')} AND seq = $2",
                operation.id,
                operation.history_seq,
            )
            previous = None if last is None else read_rows([tuple(last)], None)[0][0]
            merged = probe_merge(operation, events, previous, self._seal)
            if merged is not None:
                await connection.execute(
                    "WITH event AS (UPDATE operation_events SET data = $3, hash = $4 "
                    f"WHERE {events_of('$1')} AND seq = $2) "
                    f"UPDATE operations SET history_head = $4 WHERE {by_id('$1')}",
                    operation.id,
                    merged.seq,
                    merged.data,
                    merged.hash,
                )
                return
            await append_events(
                connection,
                [(operation, capped(operation, events))],
                self._cipher,
                self._seal,
                at=operation.observed_at,
            )

    async def history(
        self, operation_id: str, *, after: int = 0, limit: int | None = None
    ) -> HistoryPage:
        rows = await self._fetch(
            "history",
            f"SELECT {READ_COLUMNS} FROM operation_events WHERE {events_of('$1')} AND seq > $2 "
            "ORDER BY seq LIMIT $3",
            operation_id,
            after,
            limit,
        )
        events, payloads = read_rows([tuple(row) for row in rows], self._cipher)
        return HistoryPage(tuple(events), tuple(payloads))

    async def get(self, scope: str, key: str) -> Operation | None:
        row = await self._fetchrow("get", _SELECT_BY_KEY, scope, key)
        if row is None:
            return None
        operation = self._decode(row)
        return None if is_forgotten(operation) else operation

    def peek_receipt(self, scope: str, key: str) -> ReplayableReceipt | None:
        # A read is a network round trip here; for a new key (the common case) it
        # would come on top of the claim's single INSERT. Retries go through claim.
        return None

    async def get_by_id(self, operation_id: str) -> Operation | None:
        row = await self._fetchrow(
            "get", f"SELECT {COLUMNS} FROM operations WHERE {by_id('$1')}", operation_id
        )
        return None if row is None else self._decode(row)

    async def resolve(
        self,
        operation_id: str,
        *,
        token: int,
        expected_version: int | None,
        state: State,
        response: StoredResponse | None,
        resolution: Resolution,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
        calibrated: tuple[str, str] | None = None,
    ) -> Operation | None:
        sealed = seal_receipt(
            response, response.body if response else None, operation_id, self._cipher
        )
        calibration = (
            ""
            if calibrated is None
            else "AND " + calibration_rows.ADMITS_RELEASE.format("$14", "$15")
        )
        return await self._changed(
            "resolve",
            events,
            "UPDATE operations SET state = $2, response_status = $3, response_headers = $4, "
            "response_body = $5, body_retained = $6, storage = $13, "
            f"expires_at = {NOW} + {SECONDS.format('$7')}, "
            f"forgotten_at = {NOW} + {SECONDS.format('$8')}, "
            f"resolution_by = $9, resolution_at = {NOW}, resolution_note = $10, "
            f"token = token + 1, updated_at = {NOW}, version = version + 1 "
            f"WHERE {by_id('$1')} AND state = 'unknown' AND token = $12 "
            f"AND ($11::bigint IS NULL OR version = $11) {calibration}"
            f"{_OUTCOME_RETURNING}",
            operation_id,
            state.value,
            response.status if response else None,
            sealed.headers,
            sealed.body,
            response is not None,
            retention_seconds,
            max(tombstone_seconds, retention_seconds),
            resolution.by,
            resolution.note,
            expected_version,
            token,
            sealed.storage,
            *(() if calibrated is None else calibrated),
        )

    async def calibration_samples(
        self,
        *,
        route: str,
        kind: str,
        scope: str | None,
        completed_since: float | None,
        limit: int,
    ) -> tuple[Operation, ...]:
        rows = await self._fetch(
            "calibration", calibration_rows.SAMPLE, route, kind, scope, completed_since, limit
        )
        return tuple(self._decode(row) for row in rows)

    async def calibrations(self, route: str) -> tuple[Calibration, ...]:
        async with _translated("calibration"), self._require_pool().acquire() as connection:
            return await calibration_rows.calibrations(connection, route)

    async def save_calibration(self, change: CalibrationChange) -> Calibration | None:
        async with (
            _translated("calibration"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            return await calibration_rows.save(connection, change)

    async def route_kinds(self, route: str, *, limit: int) -> tuple[str, ...]:
        rows = await self._fetch("calibration", calibration_rows.ROUTE_KINDS, route, limit)
        return tuple(row["kind"] for row in rows)

    async def latest_of_request(
        self, *, scope: str, route: str, fingerprints: tuple[str, ...]
    ) -> Operation | None:
        row = await self._fetchrow(
            "lookup", calibration_rows.LATEST_OF_REQUEST, list(fingerprints), scope, route
        )
        return None if row is None else self._decode(row)

    async def list_operations(
        self, where: OperationFilter, *, limit: int, cursor: str | None
    ) -> Page:
        after = decode_cursor(cursor)
        # A statement of its own with a key: its condition must reach the planner as an
        # index path, never as `$6 IS NULL OR ...` in a generic plan that scans.
        by_key = f"AND {KEY_IN_ANY_SCOPE.format('$6')} " if where.key is not None else ""
        prefix: tuple[str, ...] = ()
        if where.prefix is not None:
            place = 7 if where.key is not None else 6
            if await self._prefix_in_ranges(where.prefix):
                by_key += f"AND {matching(f'${place}', f'${place + 1}')} "
                prefix = (where.prefix, upper_bound(where.prefix))
            else:
                by_key += f"AND (key LIKE ${place} ESCAPE '\\' OR id LIKE ${place} ESCAPE '\\') "
                prefix = (like_prefix(where.prefix),)
        rows = await self._fetch(
            "list",
            f"SELECT seq, {COLUMNS} FROM operations WHERE seq > $1 "
            "AND ($2::text IS NULL OR state = $2) "
            "AND ($4::text IS NULL OR route = $4) "
            f"AND ($5::float8 IS NULL OR created_at <= {NOW} - {SECONDS.format('$5')}) "
            f"{by_key}ORDER BY seq LIMIT $3",
            after,
            where.state.value if where.state else None,
            limit + 1,
            where.route,
            where.older_than,
            *(() if where.key is None else (where.key,)),
            *prefix,
        )
        more = len(rows) > limit
        rows = rows[:limit]
        items = tuple(row_to_operation(tuple(row)[1:], self._cipher, lenient=True) for row in rows)
        next_cursor = encode_cursor(rows[-1]["seq"]) if more and rows else None
        return Page(items=items, next_cursor=next_cursor)

    async def _prefix_in_ranges(self, prefix: str) -> bool:
        """Whether a search for `prefix` reads the key table's ranges (`postgres_prefix`):
        their indexes are ready, and it matches at most `PREFIX_WALK_FROM` operations."""
        async with _translated("list"):
            if not await self._prefix.ready():
                return False
        count = await self._fetchval(
            "list", PREFIX_COUNT, prefix, upper_bound(prefix), PREFIX_WALK_FROM + 1
        )
        return int(count) <= PREFIX_WALK_FROM

    async def expire_orphans(self, *, owner: str | None, everything: bool = False) -> int:
        args: tuple[str, ...]
        if everything:
            where, args, detail = "state = 'in_flight'", (), "all leases were declared dead"
        elif owner is not None:
            where, args = "state = 'in_flight' AND lease_owner = $2", (owner,)
            detail = f"lease holder {owner} is gone"
        else:
            where, args = f"state = 'in_flight' AND lease_expires_at <= {NOW_ONCE}", ()
            detail = "the lease expired before an outcome was recorded"
        evidence = json.dumps(Evidence(at=0.0, source="lease", detail=detail).as_json())
        async with (
            _translated("expire_orphans"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            rows = await connection.fetch(
                f"{_DUE.format(where=where, order='lease_expires_at', limit='1000')} "
                "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
                f"updated_at = {NOW}, version = version + 1, "
                "evidence = evidence || jsonb_build_array("
                f"jsonb_set($1::jsonb, '{{at}}', to_jsonb(extract(epoch from {NOW})::float8))) "
                f"WHERE {_IN_DUE.format(t='')} {_OUTCOME_RETURNING}",
                evidence,
                *args,
            )
            event = lease_expired_event(detail)
            await append_events(
                connection,
                [(row_to_operation(row, self._cipher, lenient=True), (event,)) for row in rows],
                self._cipher,
                self._seal,
            )
        return len(rows)

    async def sweep(self, *, batch: int) -> SweepReport:
        # Whole days first (`gateway.store.postgres_partitions`): what they drop, rows
        # need not be deleted one by one below.
        await self._partitions.maintain()
        limit = int(batch)  # written in: the planner then knows a batch is small
        async with (
            _translated("sweep"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            expired = await connection.fetch(
                _DUE.format(
                    where="state = 'completed' AND response_body IS NOT NULL "
                    f"AND expires_at <= {NOW_ONCE}",
                    order="expires_at",
                    limit=limit,
                )
                + _ERASE_DUE
                + "UPDATE operations o SET response_body = NULL, response_headers = NULL, "
                f"request_kept = false, updated_at = {NOW}, version = version + 1 "
                f"WHERE {_IN_DUE.format(t='o.')} RETURNING {columns_of('o')}",
            )
            requests = await connection.fetch(
                _DUE.format(
                    where="request_kept AND state IN ('completed', 'released') "
                    f"AND expires_at <= {NOW_ONCE}",
                    order="expires_at",
                    limit=limit,
                )
                + _ERASE_DUE
                + f"UPDATE operations o SET request_kept = false, updated_at = {NOW}, "
                f"version = version + 1 WHERE {_IN_DUE.format(t='o.')} "
                f"RETURNING {columns_of('o')}",
            )
            changes = []
            for rows, erased in (
                (expired, ["receipt", "request", "probes"]),
                (requests, ["request", "probes"]),
            ):
                for row in rows:
                    operation = row_to_operation(row, self._cipher, lenient=True)
                    changes.append((operation, (expired_event(erased),)))
            await append_events(connection, changes, self._cipher, self._seal)
            forgotten = await connection.fetchval(
                _DUE.format(
                    where=f"state IN ('completed', 'released') AND forgotten_at <= {NOW_ONCE}",
                    order="forgotten_at",
                    limit=limit,
                )
                + f", events AS (DELETE FROM operation_events e WHERE {_EVENTS_OF_DUE}), "
                # By `= ANY(ARRAY(...))`, not a join: each is then a probe of the table's
                # index per due id, where a join may hash the whole table.
                "checkpoints AS (DELETE FROM history_checkpoints c "
                "WHERE c.operation_id = ANY(ARRAY(SELECT id FROM due))), "
                "keyed AS (DELETE FROM history_keyed_since k "
                "WHERE k.operation_id = ANY(ARRAY(SELECT id FROM due))), "
                "requests AS (DELETE FROM request_log r "
                "WHERE r.operation_id = ANY(ARRAY(SELECT id FROM due))), "
                "counts AS (DELETE FROM request_counts n "
                "WHERE n.operation_id = ANY(ARRAY(SELECT id FROM due))), "
                "keys AS (DELETE FROM operation_keys k "
                "WHERE k.id = ANY(ARRAY(SELECT id FROM due))), "
                f"gone AS (DELETE FROM operations o WHERE {_IN_DUE.format(t='o.')} "
                "RETURNING 1) SELECT count(*) FROM gone",
            )
            await connection.execute(
                "DELETE FROM similar_refusals WHERE (scope, key) IN (SELECT scope, key "
                f"FROM similar_refusals WHERE expires_at <= {NOW_ONCE} - {SECONDS.format('$1')} "
                f"ORDER BY expires_at LIMIT {limit} FOR UPDATE SKIP LOCKED)",
                BINDING_SWEEP_SLACK,
            )
        return SweepReport(receipts_expired=len(expired), forgotten=int(forgotten))

    async def count_for_scope(self, scope: str) -> int:
        return int(
            await self._fetchval(
                "count",
                "SELECT (SELECT count(*) FROM operations WHERE scope = $1) "
                "+ (SELECT count(*) FROM similar_refusals WHERE scope = $1)",
                scope,
            )
        )

    async def unbind_past(self, scope: str, key: str, limit: int) -> bool:
        dropped = await self._fetchval(
            "unbind",
            "WITH gone AS (DELETE FROM similar_refusals WHERE scope = $1 AND key = $2 AND "
            "(SELECT count(*) FROM similar_refusals WHERE scope = $1) > $3 RETURNING 1) "
            "SELECT count(*) FROM gone",
            scope,
            key,
            limit,
        )
        return bool(dropped)

    async def redact(
        self,
        operation_id: str,
        evidence: Evidence,
        *,
        expected_version: int | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        async with (
            _translated("redact"),
            self._require_pool().acquire() as connection,
            connection.transaction(),
        ):
            row = await connection.fetchrow(
                "UPDATE operations SET response_body = NULL, response_headers = NULL, "
                "body_retained = CASE WHEN state = 'completed' THEN false ELSE body_retained END, "
                f"request_kept = false, updated_at = {NOW}, version = version + 1, "
                "evidence = evidence || jsonb_build_array($2::jsonb) "
                f"WHERE {by_id('$1')} AND ($3::bigint IS NULL OR version = $3) "
                f"RETURNING {COLUMNS}",
                operation_id,
                json.dumps(evidence.as_json()),
                expected_version,
            )
            if row is None:
                return None
            await connection.execute(ERASE_REQUEST, operation_id)
            operation = self._decode(row)
            return (
                await append_events(connection, [(operation, events)], self._cipher, self._seal)
            )[0]

    async def count_by_state(self) -> dict[State, int]:
        counts = dict.fromkeys(State, 0)
        for row in await self._fetch(
            "count", "SELECT state, count(*) AS n FROM operations GROUP BY state"
        ):
            counts[State(row["state"])] = int(row["n"])
        return counts


_DUE = (
    "WITH due AS (SELECT created_at, seq, id FROM operations WHERE {where} "
    "ORDER BY {order} LIMIT {limit} FOR UPDATE SKIP LOCKED) "
)
"""A batch of rows, locked, that other replicas' batches skip (format: the condition, the
time column it bounds and the limit); `_IN_DUE` finds them again. Ordered by that column,
so the plan reads its index from the oldest due row (a generic plan otherwise scanned
every partition whole, betting that due rows were everywhere, and found none when none
was due), and the limit written in, so the planner knows the batch is small and deletes
its per-operation rows by index."""

_IN_DUE = (
    "{t}seq = ANY(ARRAY(SELECT seq FROM due)) AND {t}created_at "
    "BETWEEN (SELECT min(created_at) FROM due) AND (SELECT max(created_at) FROM due)"
)
"""`_DUE`'s rows (format: the table's prefix): by `seq`, in the partitions their creation
times span (one, for a batch of one day), never by a join a generic plan could make a scan
of every partition."""


_EVENTS_OF_DUE = (
    "e.operation_id = ANY(ARRAY(SELECT id FROM due)) AND e.op_created_at "
    "BETWEEN (SELECT min(gateway_event_key(created_at)) FROM due) "
    "AND (SELECT max(gateway_event_key(created_at)) FROM due)"
)
"""`WHERE` condition on `operation_events e`: the events of `_DUE`'s rows, in the events'
partitions their operations' creation times span."""

_ERASE_DUE = (
    ", erased AS (UPDATE operation_events e SET payload = NULL "
    f"WHERE {_EVENTS_OF_DUE} AND {REQUEST_PAYLOADS}) "
)
"""A CTE after `_DUE`: `ERASE_REQUEST` for every row of the batch, in one statement (one
statement per receipt cost the sweep milliseconds each)."""


def _no_partition(exc: StoreUnavailable) -> bool:
    """Whether a claim failed for want of a partition for the database's day."""
    cause = exc.__cause__
    return isinstance(cause, asyncpg.CheckViolationError) and "no partition" in str(cause)


def _guard_kind(guard: SimilarGuard | None) -> str | None:
    """What `gateway_claims` does for a claim: nothing (`None`), take the request's lock
    only (a derived key), or take it and look for twins (`unsettled`, `all`)."""
    if guard is None:
        return None
    if guard.derived:
        return "lock"
    return "all" if State.COMPLETED in guard.refuse else "unsettled"


def _receipt_columns(receipts: Sequence[_Receipt]) -> list[list[Any]]:
    """The receipts' columns, as `_COMPLETES` and `_COMPLETES_CHAINED` take them ($1-$11)."""
    return [
        [receipt.operation_id for receipt in receipts],
        [receipt.token for receipt in receipts],
        [receipt.stored.status for receipt in receipts],
        [receipt.headers for receipt in receipts],
        [receipt.body for receipt in receipts],
        [receipt.body_retained for receipt in receipts],
        [receipt.retention_seconds for receipt in receipts],
        [receipt.tombstone_seconds for receipt in receipts],
        [receipt.resolution.by for receipt in receipts],
        [receipt.resolution.note for receipt in receipts],
        [receipt.storage for receipt in receipts],
    ]
