"""The embedded SQLite store: one file, one gateway, durable before forwarding.

WAL with `synchronous=FULL`: a claim is on disk before the request goes
upstream. All statements run on one writer thread that groups concurrent work
into shared commits (`gateway.store.sqlite_thread`). A lock on the database
file itself (`gateway.store.sqlite_lock`, by any path or link) enforces one
gateway per database; therefore, when the gateway starts, every `in_flight`
record left behind belongs to a dead process and becomes `unknown` at once.

A gateway with worker processes (`[server] workers`) is one gateway: its
supervisor holds the lock, and each worker opens the file as a
`SharedDatabase`, an owner with leases like a PostgreSQL replica, with its own
group commits; SQLite's own locking orders the workers' transactions. Only the
first worker turns what it finds in flight `unknown`; a dead worker's claims
become `unknown` by its lease (or at once, when the supervisor restarts it).

The store's clock is the gateway host's (`clock`, registered in SQL as
`gateway_now()`): every time a record holds is written and compared on it.

Reads by key or id (`get`, `get_by_id`, `peek_receipt`) go through a second,
read-only connection on the event loop: in WAL mode it sees exactly what is
committed, never a batch that is still open, so a retry or a lookup is
answered without waiting for the next group commit.

The file lock and the connections live in `gateway.store.sqlite_connection`,
the claim's statements in `gateway.store.sqlite_statements`; this module is
the verbs.
"""

from __future__ import annotations

import json
import logging
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from gateway.engine.calibration import Calibration, CalibrationChange
from gateway.engine.clock import SYSTEM_CLOCK, Clock
from gateway.engine.errors import StoreUnavailable
from gateway.engine.history import NewEvent, capped, micros
from gateway.engine.lifecycle_events import LEASE_LAPSED, expired_event, lease_expired_event
from gateway.engine.models import (
    RECEIPT_SOURCES,
    ClaimRequest,
    ClaimResult,
    Evidence,
    Operation,
    ReplayableReceipt,
    Resolution,
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
from gateway.store import sqlite_calibration as calibration
from gateway.store.base import (
    ChainEvidence,
    HistoryPage,
    OperationFilter,
    Page,
    Renewal,
    SweepReport,
)
from gateway.store.crypto import BodyCipher, CipherError
from gateway.store.history_rows import (
    READ_COLUMNS,
    UPSERT_CHECKPOINT,
    CheckpointEntry,
    HistorySeal,
    chained_rows,
    checkpoint_of,
    checkpoint_rows,
    keyed_from_of,
    next_checkpoint,
    probe_merge,
    read_rows,
)
from gateway.store.rows import (
    ATTACHABLE,
    OPERATION_TABLES,
    UPGRADES,
    WITNESS_PREFIX,
    LegacyFingerprints,
    as_stored,
    decode_cursor,
    encode_cursor,
    is_forgotten,
    open_receipt,
    row_to_operation,
    seal_receipt,
    upgraded_since,
)
from gateway.store.sqlite_connection import SharedDatabase, SqliteConnection
from gateway.store.sqlite_schema import COLUMNS, migrate
from gateway.store.sqlite_statements import (
    _EVIDENCE_UNLESS_REPEATED,
    _INSERT_EVENT,
    _LATE_RESOLUTION,
    _LATE_WRITABLE,
    _OUTCOME_RETURNING,
    _OUTCOME_WRITABLE,
    _RECEIPT_COLUMNS,
    _RETURNING,
    _SELECT,
    ERASE_REQUEST,
    KEY_IN_ANY_SCOPE,
    PREFIX_OF_KEY_OR_ID,
    _claim,
    load_legacy_fingerprints,
    load_or_create_secret,
    prefix_parameters,
    seal_histories,
)

T = TypeVar("T")

_REPLAYABLE = (
    "SELECT id, attempts, fingerprint, response_status, response_headers, response_body, "
    "storage, resolution_by FROM operations WHERE scope = ?2 AND key = ?3 AND state = 'completed' "
    "AND body_retained AND response_status IS NOT NULL AND response_body IS NOT NULL "
    "AND (expires_at IS NULL OR expires_at > ?1) AND (forgotten_at IS NULL OR forgotten_at > ?1)"
)
"""A completed key's receipt while it can be replayed (`Operation.receipt_available`,
and not forgotten), judged on the store's clock (`?1`, its time now): the columns a replay
needs, no more."""
log = logging.getLogger("gateway.store.sqlite")


_UPSTREAM = "'upstream'"


class SqliteStore(SqliteConnection):
    """`Store` on one SQLite file, for one gateway (one process, or its workers).

    >>> # store = SqliteStore(path=Path("data/gateway.db"), busy_timeout=5.0)
    >>> # await store.open(); ...; await store.close()
    """

    def __init__(
        self,
        *,
        path: Path,
        busy_timeout: float = 5.0,
        max_batch: int = 256,
        on_batch: Callable[[int], None] | None = None,
        cipher: BodyCipher | None = None,
        clock: Clock = SYSTEM_CLOCK,
        shared: SharedDatabase | None = None,
        history_key: bytes | None = None,
    ) -> None:
        super().__init__(
            path=path,
            busy_timeout=busy_timeout,
            max_batch=max_batch,
            on_batch=on_batch,
            clock=clock,
            shared=shared,
        )
        self._cipher = cipher
        self._history_key = history_key
        self._seal: HistorySeal | None = None
        self._secret: bytes | None = None
        self._legacy = LegacyFingerprints()
        self.orphans_at_start = 0

    def _decode(self, row: Any) -> Operation:
        return row_to_operation(row, self._cipher)

    # -- lifecycle ---------------------------------------------------------

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._take_process_lock()
        try:
            await self._writer.start()
            await self._writer.run(migrate, off_loop=True)
            self._secret = await self._writer.run(load_or_create_secret)
            self._legacy = await self._writer.run(load_legacy_fingerprints)
            if history_key := self._history_key:
                now_us = micros(self._clock.time())
                await self._writer.run(lambda c: seal_histories(c, history_key, now_us))
                self._seal = HistorySeal(history_key)
            if self._shared is None or self._shared.first:
                # This gateway holds the file: whatever is in flight, nobody sends.
                self.orphans_at_start = await self.expire_orphans(owner=None, everything=True)
            self._reader = self._open_reader()
            if self.orphans_at_start:
                log.warning(
                    "%d in-flight operations of a previous process are now unknown",
                    self.orphans_at_start,
                    extra={"event": "orphans", "count": self.orphans_at_start},
                )
        except BaseException:
            await self._writer.stop()
            self._release_process_lock()
            raise

    async def close(self) -> None:
        reader, self._reader = self._reader, None
        if reader is not None:
            reader.close()
        await self._writer.stop()
        self._release_process_lock()

    async def subscribe(self, on_settled: Callable[[str], None]) -> bool:
        if self._shared is None or self._shared.signal is None:
            return False  # one process per file: outcomes are all signalled in memory
        self._shared.signal.listen(on_settled)
        return True

    async def watch(self, operation_id: str) -> None:
        if self._shared is None or self._shared.signal is None:
            return  # every outcome is recorded, and signalled, in this process
        await self._writer.run(
            lambda c: c.execute(
                "UPDATE operations SET watched = 1 WHERE id = ? AND NOT watched", (operation_id,)
            )
        )

    def history_seal(self) -> HistorySeal | None:
        return self._seal

    async def ping(self) -> None:
        await self._writer.run(lambda c: c.execute("SELECT version FROM schema_version").fetchone())

    async def now(self) -> float:
        return self._clock.time()

    async def scope_secret(self) -> bytes:
        if self._secret is None:
            raise StoreUnavailable("the SQLite store is not open")
        return self._secret

    async def upgraded_since(self, change: str) -> float | None:
        assert change in UPGRADES
        now = self._clock.time()

        def job(c: sqlite3.Connection) -> bytes:
            c.execute(
                "INSERT INTO gateway_meta (name, value) SELECT ?, CAST(CASE WHEN EXISTS "
                "(SELECT 1 FROM operations) THEN ? ELSE '0' END AS BLOB) "
                "ON CONFLICT (name) DO NOTHING",
                (change, repr(now)),
            )
            row = c.execute("SELECT value FROM gateway_meta WHERE name = ?", (change,)).fetchone()
            return bytes(row[0])

        return upgraded_since(await self._writer.run(job))

    async def read_clock_witnesses(self) -> dict[str, bytes]:
        rows = await self._writer.run(
            lambda c: c.execute(
                "SELECT name, value FROM gateway_meta WHERE substr(name, 1, ?) = ?",
                (len(WITNESS_PREFIX), WITNESS_PREFIX),
            ).fetchall()
        )
        return {name.removeprefix(WITNESS_PREFIX): bytes(value) for name, value in rows}

    async def write_clock_witness(self, host: str, witness: bytes) -> None:
        await self._writer.run(
            lambda c: c.execute(
                "INSERT INTO gateway_meta (name, value) VALUES (?, ?) "
                "ON CONFLICT (name) DO UPDATE SET value = excluded.value",
                (WITNESS_PREFIX + host, witness),
            )
        )

    # -- the state machine's verbs ------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        return await self._writer.run(
            lambda c: _claim(
                c,
                request,
                self._decode,
                self._clock,
                self._append,
                self._cipher,
                self._seal,
                self._legacy,
            )
        )

    def _append(
        self,
        c: sqlite3.Connection,
        operation: Operation,
        events: Sequence[NewEvent],
        *,
        at: float | None = None,
    ) -> Operation:
        """Chain `events` after the operation as this transaction left it."""
        if not events:
            return operation
        rows, appended = chained_rows(operation, events, self._cipher, self._seal, at=at)
        c.executemany(_INSERT_EVENT, rows)
        c.execute(
            "UPDATE operations SET history_head = ?, history_seq = ? WHERE id = ?",
            (appended.history_head, appended.history_seq, operation.id),
        )
        return appended

    def _append_row(
        self, c: sqlite3.Connection, row: Any, events: Sequence[NewEvent], **decode: Any
    ) -> Operation | None:
        if row is None:
            return None
        return self._append(c, row_to_operation(row, self._cipher, **decode), events)

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
        receipt_values = self._receipt_values(
            operation_id, response, body_retained, retention_seconds, tombstone_seconds
        )

        def job(c: sqlite3.Connection) -> Operation | None:
            now = self._clock.time()
            row = c.execute(
                f"UPDATE operations SET {_RECEIPT_COLUMNS}, resolution_by = ?, "
                "resolution_at = ?, resolution_note = ?, lease_owner = NULL, "
                "updated_at = ?, version = version + 1 "
                f"WHERE id = ? AND token = ? AND {_OUTCOME_WRITABLE} {_OUTCOME_RETURNING}",
                (
                    *receipt_values(now),
                    resolution.by,
                    now,
                    resolution.note,
                    now,
                    operation_id,
                    token,
                ),
            ).fetchone()
            return self._append_row(c, row, events, stored=stored)

        stored = as_stored(response, body_retained=body_retained)
        return await self._writer.run(job)

    def _receipt_values(
        self,
        operation_id: str,
        response: StoredResponse,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
    ) -> Callable[[float], tuple[object, ...]]:
        """The values of `_RECEIPT_COLUMNS` for a receipt written at store time `now`
        (sealed once, outside the writer's transaction)."""
        receipt = seal_receipt(
            response, response.body if body_retained else None, operation_id, self._cipher
        )

        def values(now: float) -> tuple[object, ...]:
            return (
                response.status,
                receipt.headers,
                receipt.body,
                receipt.storage,
                int(body_retained),
                now + retention_seconds,
                now + max(tombstone_seconds, retention_seconds),
            )

        return values

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
        receipt_values = self._receipt_values(
            operation_id, response, body_retained, retention_seconds, tombstone_seconds
        )

        def job(c: sqlite3.Connection) -> Operation | None:
            now = self._clock.time()
            row = c.execute(
                f"UPDATE operations SET {_RECEIPT_COLUMNS}, "
                f"resolution_by = {_LATE_RESOLUTION.format('by', _UPSTREAM)}, "
                f"resolution_at = {_LATE_RESOLUTION.format('at', '?')}, "
                f"resolution_note = {_LATE_RESOLUTION.format('note', 'NULL')}, "
                "lease_owner = NULL, token = token + 1, updated_at = ?, version = version + 1 "
                f"WHERE id = ? AND attempts = ? AND {_LATE_WRITABLE} {_OUTCOME_RETURNING}",
                (*receipt_values(now), now, now, operation_id, attempt),
            ).fetchone()
            return self._append_row(c, row, events, stored=stored)

        stored = as_stored(response, body_retained=body_retained)
        return await self._writer.run(job)

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
        receipt_values = self._receipt_values(
            operation_id, response, body_retained, retention_seconds, tombstone_seconds
        )

        def job(c: sqlite3.Connection) -> Operation | None:
            now = self._clock.time()
            row = c.execute(
                f"UPDATE operations SET {_RECEIPT_COLUMNS}, updated_at = ?, "
                f"version = version + 1 WHERE id = ? AND {ATTACHABLE} "
                f"AND (? IS NULL OR version = ?) {_OUTCOME_RETURNING}",
                (*receipt_values(now), now, operation_id, expected_version, expected_version),
            ).fetchone()
            return self._append_row(c, row, events, stored=stored)

        stored = as_stored(response, body_retained=body_retained)
        return await self._writer.run(job)

    async def append_request_lines(self, batches: Sequence[RequestBatch]) -> None:
        def job(c: sqlite3.Connection) -> None:
            for batch in batches:
                # Counted first: the counts row numbers the lines, and none is made for an
                # operation the store no longer holds.
                row = c.execute(
                    "INSERT INTO request_counts (operation_id, total, replays, refusals) "
                    "SELECT ?1, ?2, ?3, ?4 WHERE EXISTS (SELECT 1 FROM operations WHERE id = ?1) "
                    "ON CONFLICT (operation_id) DO UPDATE SET total = total + excluded.total, "
                    "replays = replays + excluded.replays, "
                    "refusals = refusals + excluded.refusals RETURNING total",
                    (batch.operation_id, batch.total, batch.replays, batch.refusals),
                ).fetchone()
                if row is None:
                    continue
                c.executemany(
                    "INSERT INTO request_log (operation_id, seq, at, request_id, status, "
                    "outcome, replayed, problem) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    [
                        (batch.operation_id, seq, line.at, line.request_id, line.status,
                         line.outcome, line.replayed, line.problem)
                        for seq, line in numbered(batch, total=row[0])
                    ],
                )  # fmt: skip
                c.execute(
                    "DELETE FROM request_log WHERE operation_id = ? AND seq > ? AND seq <= ?",
                    (batch.operation_id, FIRST, row[0] - LAST),
                )

        await self._writer.run(job)

    async def request_log(self, operation_id: str, *, lines: bool = True) -> RequestLog:
        counts = await self._read(
            "SELECT total, replays, refusals FROM request_counts WHERE operation_id = ?",
            (operation_id,),
        )
        if not counts:
            return RequestLog()
        total, replays, refusals = counts[0]
        if not lines:
            return RequestLog(total=total, replays=replays, refusals=refusals)
        rows = await self._read(
            "SELECT seq, at, request_id, status, outcome, replayed, problem FROM request_log "
            "WHERE operation_id = ? ORDER BY seq",
            (operation_id,),
        )
        kept = tuple(
            (seq, RequestLine(at, request_id, status, outcome, bool(replayed), problem))
            for seq, at, request_id, status, outcome, replayed, problem in rows
        )
        return RequestLog(kept, total=total, replays=replays, refusals=refusals)

    async def mark_unknown(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        def job(c: sqlite3.Connection) -> Operation | None:
            row = c.execute(
                "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
                "updated_at = ?, version = version + 1, "
                "evidence = json_insert(evidence, '$[#]', json(?)) "
                f"WHERE id = ? AND token = ? AND {_OUTCOME_WRITABLE} {_OUTCOME_RETURNING}",
                (self._clock.time(), json.dumps(evidence.as_json()), operation_id, token),
            ).fetchone()
            return self._append_row(c, row, events)

        return await self._writer.run(job)

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
        def job(c: sqlite3.Connection) -> Operation | None:
            now = self._clock.time()
            row = c.execute(
                "UPDATE operations SET state = 'released', lease_owner = NULL, "
                "forgotten_at = ?, expires_at = ?, updated_at = ?, "
                "version = version + 1, evidence = json_insert(evidence, '$[#]', json(?)) "
                f"WHERE id = ? AND token = ? AND {_OUTCOME_WRITABLE} {_OUTCOME_RETURNING}",
                (
                    now + max(tombstone_seconds, retention_seconds),
                    now + retention_seconds,
                    now,
                    json.dumps(evidence.as_json()),
                    operation_id,
                    token,
                ),
            ).fetchone()
            return self._append_row(c, row, events)

        return await self._writer.run(job)

    async def renew(self, leases: dict[str, int], *, owner: str, lease_seconds: float) -> Renewal:
        items = list(leases.items())

        def job(c: sqlite3.Connection) -> Renewal:
            now = self._clock.time()
            renewed, lapsed = set(), set()
            evidence = json.dumps(Evidence(at=now, source="lease", detail=LEASE_LAPSED).as_json())
            for op_id, token in items:
                cursor = c.execute(
                    # Never earlier than it was: a renewal read on a clock stepped back
                    # for a moment must not shorten the window a release waits for.
                    "UPDATE operations SET lease_expires_at = max(lease_expires_at, ?) "
                    "WHERE id = ? AND token = ? "
                    "AND lease_owner = ? AND state = 'in_flight' AND lease_expires_at > ?",
                    (now + lease_seconds, op_id, token, owner, now),
                )
                if cursor.rowcount:
                    renewed.add(op_id)
                    continue
                row = c.execute(
                    "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
                    "updated_at = ?, version = version + 1, "
                    "evidence = json_insert(evidence, '$[#]', json(?)) "
                    "WHERE id = ? AND token = ? AND lease_owner = ? AND state = 'in_flight' "
                    f"AND lease_expires_at <= ? {_OUTCOME_RETURNING}",
                    (now, evidence, op_id, token, owner, now),
                ).fetchone()
                if row is not None:
                    lapsed.add(op_id)
                    self._append_row(c, row, (lease_expired_event(LEASE_LAPSED),), lenient=True)
            return Renewal(frozenset(renewed), frozenset(lapsed), now)

        if not items:
            return Renewal(frozenset(), frozenset(), await self.now())
        return await self._writer.run(job)

    async def add_evidence(
        self, operation_id: str, evidence: Evidence, events: Sequence[NewEvent] = ()
    ) -> None:
        """Evidence changes no version (an operator's `If-Match` survives probes); a fact
        that repeats the latest one is not kept again (`Evidence.repeats`)."""

        def job(c: sqlite3.Connection) -> None:
            row = c.execute(
                f"UPDATE operations SET evidence = {_EVIDENCE_UNLESS_REPEATED} "
                f"WHERE id = ?2 {_RETURNING}",
                (json.dumps(evidence.as_json()), operation_id),
            ).fetchone()
            if row is None:
                return
            operation = self._decode(row)
            last = c.execute(
                f"SELECT {READ_COLUMNS} FROM operation_events WHERE operation_id = ? AND seq = ?",
                (operation.id, operation.history_seq),
            ).fetchone()
            merged = probe_merge(
                operation,
                events,
                None if last is None else read_rows([last], None)[0][0],
                self._seal,
            )
            if merged is not None:
                c.execute(
                    "UPDATE operation_events SET data = ?, hash = ? WHERE operation_id = ? "
                    "AND seq = ?",
                    (merged.data, merged.hash, operation.id, merged.seq),
                )
                c.execute(
                    "UPDATE operations SET history_head = ? WHERE id = ?",
                    (merged.hash, operation.id),
                )
                return
            self._append(c, operation, capped(operation, events), at=operation.observed_at)

        await self._writer.run(job)

    async def history(
        self, operation_id: str, *, after: int = 0, limit: int | None = None
    ) -> HistoryPage:
        rows = await self._read(
            f"SELECT {READ_COLUMNS} FROM operation_events WHERE operation_id = ? AND seq > ? "
            "ORDER BY seq LIMIT ?",
            (operation_id, after, -1 if limit is None else limit),
        )
        events, payloads = read_rows(rows, self._cipher)
        return HistoryPage(tuple(events), tuple(payloads))

    async def chain_evidence(self, operation_id: str) -> ChainEvidence | None:
        def job(c: sqlite3.Connection) -> ChainEvidence | None:
            # On the writer: its transaction is one snapshot, and no write comes between.
            row = c.execute(f"{_SELECT} WHERE id = ?", (operation_id,)).fetchone()
            if row is None:
                return None
            raw = c.execute(
                f"SELECT {READ_COLUMNS} FROM operation_events WHERE operation_id = ? ORDER BY seq",
                (operation_id,),
            ).fetchall()
            keyed = c.execute(
                "SELECT seq, mac FROM history_keyed_since WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()
            checkpoint = c.execute(
                "SELECT seq, head, checkpoint, at_us, mac FROM history_checkpoints "
                "WHERE operation_id = ?",
                (operation_id,),
            ).fetchone()
            events, payloads = read_rows(raw, self._cipher)
            return ChainEvidence(
                self._decode(row),
                HistoryPage(tuple(events), tuple(payloads)),
                keyed_from_of(keyed),
                checkpoint_of(checkpoint),
            )

        return await self._writer.run(job)

    async def write_checkpoint(self) -> int:
        seal = self._seal
        if seal is None or not seal.touched:
            return 0
        touched = seal.take_touched()
        at_us = micros(self._clock.time())

        def job(c: sqlite3.Connection) -> int:
            heads: list[Any] = []
            ids = sorted(touched)
            for start in range(0, len(ids), 500):
                chunk = ids[start : start + 500]
                heads += c.execute(
                    "SELECT id, history_seq, history_head FROM operations "
                    f"WHERE id IN ({', '.join('?' * len(chunk))})",
                    chunk,
                ).fetchall()
            last = c.execute(
                "SELECT checkpoint, mac FROM history_checkpoint_log "
                "ORDER BY checkpoint DESC LIMIT 1"
            ).fetchone()
            entry = next_checkpoint(seal.key, last, at_us, len(heads))
            c.executemany(
                UPSERT_CHECKPOINT.format("?, ?, ?, ?, ?, ?"),
                checkpoint_rows(seal.key, entry.number, at_us, heads),
            )
            c.execute("INSERT INTO history_checkpoint_log VALUES (?, ?, ?, ?, ?)", entry)
            return len(heads)

        try:
            return await self._writer.run(job)
        except BaseException:
            seal.touched |= touched  # the next checkpoint covers them
            raise

    async def checkpoint_log(self) -> list[CheckpointEntry]:
        rows = await self._read(
            "SELECT checkpoint, at_us, count, prev, mac FROM history_checkpoint_log "
            "ORDER BY checkpoint",
            (),
        )
        return [CheckpointEntry(*row) for row in rows]

    async def get(self, scope: str, key: str) -> Operation | None:
        rows = await self._read(f"{_SELECT} WHERE scope = ? AND key = ?", (scope, key))
        return self._unless_forgotten(rows)

    def peek_receipt(self, scope: str, key: str) -> ReplayableReceipt | None:
        rows = self._read_now(_REPLAYABLE, (self._clock.time(), scope, key))
        if not rows:
            return None
        op_id, attempts, fingerprint, status, headers, body, storage, by = rows[0]
        try:
            opened_headers, opened_body = open_receipt(headers, body, storage, op_id, self._cipher)
        except CipherError:
            return None  # the full path reports it (503): a replay never guesses
        return ReplayableReceipt(
            op_id,
            attempts,
            fingerprint,
            StoredResponse(status, opened_headers, opened_body),
            RECEIPT_SOURCES.get(by or "upstream", "upstream"),
        )

    def _unless_forgotten(self, rows: list[Any]) -> Operation | None:
        if not rows:
            return None
        operation = self._decode(rows[0])
        return None if is_forgotten(operation) else operation

    async def get_by_id(self, operation_id: str) -> Operation | None:
        rows = await self._read(f"{_SELECT} WHERE id = ?", (operation_id,))
        return self._decode(rows[0]) if rows else None

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
        receipt = seal_receipt(
            response, response.body if response else None, operation_id, self._cipher
        )

        def job(c: sqlite3.Connection) -> Operation | None:
            now = self._clock.time()
            if calibrated is not None and not calibration.admits_release(c, *calibrated, now):
                return None
            retained = response is not None
            row = c.execute(
                "UPDATE operations SET state = ?, response_status = ?, response_headers = ?, "
                "response_body = ?, storage = ?, body_retained = ?, expires_at = ?, "
                "forgotten_at = ?, "
                "resolution_by = ?, resolution_at = ?, resolution_note = ?, "
                "token = token + 1, updated_at = ?, version = version + 1 "
                "WHERE id = ? AND state = 'unknown' AND token = ? AND (? IS NULL OR version = ?) "
                f"{_RETURNING}",
                (
                    state.value,
                    response.status if response else None,
                    receipt.headers,
                    receipt.body,
                    receipt.storage,
                    int(retained),
                    now + retention_seconds,
                    now + max(tombstone_seconds, retention_seconds),
                    resolution.by,
                    now,
                    resolution.note,
                    now,
                    operation_id,
                    token,
                    expected_version,
                    expected_version,
                ),
            ).fetchone()
            return self._append_row(c, row, events)

        return await self._writer.run(job)

    async def calibration_samples(
        self,
        *,
        route: str,
        kind: str,
        scope: str | None,
        completed_since: float | None,
        limit: int,
    ) -> tuple[Operation, ...]:
        return await self._writer.run(
            lambda c: calibration.samples(
                c,
                self._decode,
                route=route,
                kind=kind,
                scope=scope,
                completed_since=completed_since,
                now=self._clock.time(),
                limit=limit,
            ),
            off_loop=True,
        )

    async def calibrations(self, route: str) -> tuple[Calibration, ...]:
        return await self._writer.run(lambda c: calibration.calibrations(c, route))

    async def save_calibration(self, change: CalibrationChange) -> Calibration | None:
        return await self._writer.run(lambda c: calibration.save(c, change, self._clock.time()))

    async def route_kinds(self, route: str, *, limit: int) -> tuple[str, ...]:
        return await self._writer.run(
            lambda c: calibration.route_kinds(c, route, limit), off_loop=True
        )

    async def latest_of_request(
        self, *, scope: str, route: str, fingerprints: tuple[str, ...]
    ) -> Operation | None:
        return await self._writer.run(
            lambda c: calibration.latest_of_request(
                c,
                self._decode,
                scope=scope,
                route=route,
                fingerprints=fingerprints,
                now=self._clock.time(),
            )
        )

    async def list_operations(
        self, where: OperationFilter, *, limit: int, cursor: str | None
    ) -> Page:
        after = decode_cursor(cursor)

        def job(c: sqlite3.Connection) -> Page:
            clauses: list[str] = ["seq > ?"]
            params: list[object] = [after]
            if where.state is not None:
                clauses.append("state = ?")
                params.append(where.state.value)
            if where.route is not None:
                clauses.append("route = ?")
                params.append(where.route)
            if where.older_than is not None:
                clauses.append("created_at <= ?")
                params.append(self._clock.time() - where.older_than)
            if where.key is not None:
                clauses.append(KEY_IN_ANY_SCOPE)
                params.append(where.key)
            if where.prefix is not None:
                matching = prefix_parameters(where.prefix)
                if not _many_match(c, matching):
                    # `+seq`: the cursor's range must not be the index SQLite walks (it
                    # would be, and read every row after the cursor); the prefix's must.
                    clauses[0] = "+seq > ?"
                clauses.append(PREFIX_OF_KEY_OR_ID)
                params.extend(matching)
            rows = c.execute(
                f"SELECT seq, {', '.join(COLUMNS)} FROM operations "
                f"WHERE {' AND '.join(clauses)} ORDER BY seq LIMIT ?",
                (*params, limit + 1),
            ).fetchall()
            more = len(rows) > limit
            rows = rows[:limit]
            items = tuple(row_to_operation(row[1:], self._cipher, lenient=True) for row in rows)
            next_cursor = encode_cursor(rows[-1][0]) if more and rows else None
            return Page(items=items, next_cursor=next_cursor)

        return await self._writer.run(job)

    async def expire_orphans(self, *, owner: str | None, everything: bool = False) -> int:
        def job(c: sqlite3.Connection) -> int:
            now = self._clock.time()
            params: tuple[object, ...]
            if everything:
                detail = "the gateway process holding the lease died"
                where, params = "state = 'in_flight'", ()
            elif owner is not None:
                detail = f"lease holder {owner} is gone"
                where, params = "state = 'in_flight' AND lease_owner = ?", (owner,)
            else:
                detail = "the lease expired before an outcome was recorded"
                where, params = "state = 'in_flight' AND lease_expires_at <= ?", (now,)
            evidence = json.dumps(Evidence(at=now, source="lease", detail=detail).as_json())
            expired = c.execute(
                "UPDATE operations SET state = 'unknown', lease_owner = NULL, "
                "updated_at = ?, version = version + 1, "
                "evidence = json_insert(evidence, '$[#]', json(?)) "
                f"WHERE {where} {_OUTCOME_RETURNING}",
                (now, evidence, *params),
            ).fetchall()
            event = lease_expired_event(detail)
            for row in expired:
                self._append(c, row_to_operation(row, self._cipher, lenient=True), (event,))
            return len(expired)

        return await self._writer.run(job, off_loop=everything)

    async def sweep(self, *, batch: int) -> SweepReport:
        def job(c: sqlite3.Connection) -> SweepReport:
            now = self._clock.time()
            expired = c.execute(
                "UPDATE operations SET response_body = NULL, response_headers = NULL, "
                "request_kept = 0, updated_at = ?, version = version + 1 "
                "WHERE seq IN (SELECT seq FROM operations "
                "INDEXED BY operations_by_body_expiry WHERE response_body IS NOT NULL "
                "AND expires_at <= ? AND state = 'completed' LIMIT ?) "
                f"{_RETURNING}",
                (now, now, batch),
            ).fetchall()
            requests = c.execute(
                "UPDATE operations SET request_kept = 0, updated_at = ?, version = version + 1 "
                "WHERE seq IN (SELECT seq FROM operations "
                "INDEXED BY operations_by_request_expiry WHERE request_kept = 1 "
                "AND expires_at <= ? AND state IN ('completed', 'released') LIMIT ?) "
                f"{_RETURNING}",
                (now, now, batch),
            ).fetchall()
            for rows, erased in (
                (expired, ["receipt", "request", "probes"]),
                (requests, ["request", "probes"]),
            ):
                for row in rows:
                    operation = row_to_operation(row, self._cipher, lenient=True)
                    c.execute(ERASE_REQUEST, (operation.id,))
                    self._append(c, operation, (expired_event(erased),))
            doomed = (
                "SELECT id FROM operations INDEXED BY operations_by_forgotten_at "
                "WHERE forgotten_at IS NOT NULL AND forgotten_at <= ? "
                "AND state IN ('completed', 'released') LIMIT ?"
            )
            ids = [row[0] for row in c.execute(doomed, (now, batch))]
            for table in OPERATION_TABLES:
                c.executemany(f"DELETE FROM {table} WHERE operation_id = ?", [(i,) for i in ids])
            forgotten = c.executemany(
                "DELETE FROM operations WHERE id = ?", [(i,) for i in ids]
            ).rowcount
            c.execute(
                "DELETE FROM similar_refusals WHERE (scope, key) IN (SELECT scope, key "
                "FROM similar_refusals WHERE expires_at <= ? LIMIT ?)",
                (now - BINDING_SWEEP_SLACK, batch),
            )
            return SweepReport(receipts_expired=len(expired), forgotten=forgotten)

        return await self._writer.run(job, off_loop=True)

    async def count_for_scope(self, scope: str) -> int:
        return int(
            await self._writer.run(
                lambda c: c.execute(
                    "SELECT (SELECT count(*) FROM operations WHERE scope = ?1) "
                    "+ (SELECT count(*) FROM similar_refusals WHERE scope = ?1)",
                    (scope,),
                ).fetchone()[0],
                off_loop=True,
            )
        )

    async def unbind_past(self, scope: str, key: str, limit: int) -> bool:
        return bool(
            await self._writer.run(
                lambda c: (
                    c.execute(
                        "DELETE FROM similar_refusals WHERE scope = ?1 AND key = ?2 AND "
                        "(SELECT count(*) FROM similar_refusals WHERE scope = ?1) > ?3",
                        (scope, key, limit),
                    ).rowcount
                )
            )
        )

    async def redact(
        self,
        operation_id: str,
        evidence: Evidence,
        *,
        expected_version: int | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        def job(c: sqlite3.Connection) -> Operation | None:
            row = c.execute(
                "UPDATE operations SET response_body = NULL, response_headers = NULL, "
                "body_retained = CASE WHEN state = 'completed' THEN 0 ELSE body_retained END, "
                "request_kept = 0, updated_at = ?, version = version + 1, "
                "evidence = json_insert(evidence, '$[#]', json(?)) "
                "WHERE id = ? AND (? IS NULL OR version = ?) "
                f"{_RETURNING}",
                (
                    self._clock.time(),
                    json.dumps(evidence.as_json()),
                    operation_id,
                    expected_version,
                    expected_version,
                ),
            ).fetchone()
            if row is None:
                return None
            c.execute(ERASE_REQUEST, (operation_id,))
            return self._append_row(c, row, events)

        # The old page versions would still sit in the WAL: the commit copies the new
        # ones over the database file and empties the WAL, so the bytes leave both.
        return await self._writer.run(job, truncate_wal=True)

    async def count_by_state(self) -> dict[State, int]:
        def job(c: sqlite3.Connection) -> dict[State, int]:
            counts = dict.fromkeys(State, 0)
            for state, count in c.execute("SELECT state, count(*) FROM operations GROUP BY state"):
                counts[State(state)] = count
            return counts

        return await self._writer.run(job, off_loop=True)


PREFIX_WALK_FROM = 10_000
"""Rows a prefix must match before a search walks the table in creation order instead of
reading the prefix's index ranges: the ranges cost the rows they match (sorted for the
page), the walk the rows it passes before it has a page, few when matches are dense."""


def _many_match(c: sqlite3.Connection, matching: tuple[object, ...]) -> bool:
    """Whether a prefix matches more than `PREFIX_WALK_FROM` rows (counted through its
    index ranges, stopping there: a few milliseconds at most)."""
    count = c.execute(
        f"SELECT count(*) FROM (SELECT 1 FROM operations WHERE {PREFIX_OF_KEY_OR_ID} LIMIT ?)",
        (*matching, PREFIX_WALK_FROM + 1),
    ).fetchone()[0]
    return int(count) > PREFIX_WALK_FROM
