"""Fill an SQLite store with completed operations, fast, to measure the store at scale.

Going through the gateway would take minutes per million rows (each request
is a claim, a forward and a receipt); the rows themselves take seconds to
insert with `executemany` in large transactions. The schema comes from the
gateway's own migrations (`gateway.store.sqlite_schema.migrate`) and every
row is shaped like a real completed operation: scope "anonymous" (a caller
without `Authorization`), a UUID-shaped key, a ULID operation id, a request
of its own (`fill_body`: the key is in the body, so no two rows are the same
request and their keyed fingerprints spread over the request index as real
traffic's do), a 201 receipt with the headers the tool API sends and a
~300-byte JSON body, due for expiry a day later, as with the default
retention.

Keys are random-looking but reproducible (`fill_key(i)`), so the load
generator can look up pre-filled keys without being told them.
"""

from __future__ import annotations

import hashlib
import sqlite3
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from gateway.engine.digests import Digests
from gateway.engine.fingerprint import fingerprint_request
from gateway.engine.history import chain, micros
from gateway.engine.ids import new_operation_id
from gateway.engine.lifecycle_events import (
    answered_event,
    claimed_event,
    request_claimed,
    sent_event,
)
from gateway.engine.recorded_request import http_record
from gateway.store.sqlite_schema import STORED_COLUMNS, migrate
from gateway.store.sqlite_statements import _INSERT_EVENT, load_or_create_secret

__all__ = ["FILL_SCOPE", "FillReport", "bytes_per_operation", "fill_body", "fill_key", "prefill"]

FILL_SCOPE = "anonymous"
"""The scope of requests without `Authorization` (`gateway.engine.scopes.ANONYMOUS_SCOPE`)."""
_CHUNK = 50_000
_RECEIPT_BODY_SIZE = 300
_HEADERS = (
    '[["Content-Type","application/json; charset=utf-8"],'
    '["Date","Mon, 30 Nov 2026 06:05:20 GMT"],["Server","Python/3.11 aiohttp/3.14.5"]]'
)
_DAY = 24 * 3600.0


def fill_key(index: int) -> str:
    """The key of pre-filled operation `index`: UUID-shaped, like most agents' keys.

    >>> fill_key(0) == fill_key(0), len(fill_key(0))
    (True, 36)
    """
    return str(uuid.UUID(bytes=hashlib.blake2b(index.to_bytes(8, "big"), digest_size=16).digest()))


def fill_body(key: str) -> bytes:
    """The request body of the pre-filled operation with `key`: its own, as every
    operation's is (one body for all would be a million twins of one request).

    >>> fill_body("k-1")
    b'{"title":"benchmark ticket k-1"}'
    """
    return b'{"title":"benchmark ticket ' + key.encode() + b'"}'


@dataclass(frozen=True, slots=True)
class FillReport:
    """What `prefill` wrote."""

    rows: int
    seconds: float
    file_bytes: int

    @property
    def bytes_per_operation(self) -> float:
        return self.file_bytes / self.rows if self.rows else 0.0


def prefill(path: Path, rows: int) -> FillReport:
    """Create `path` with the gateway's schema holding `rows` completed operations.

    The file is left in WAL mode, checkpointed, for a gateway to open.
    """
    started = time.perf_counter()
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        # Durability is irrelevant while filling a scratch file; speed is not.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-262144")  # 256 MiB: random key inserts stay in RAM
        connection.execute("BEGIN")
        migrate(connection)
        # As the gateway's first start makes it: a store holding operations but no
        # secret refuses to start.
        digests = Digests(load_or_create_secret(connection))
        connection.execute("COMMIT")
        placeholders = ", ".join("?" for _ in STORED_COLUMNS)
        insert = f"INSERT INTO operations ({', '.join(STORED_COLUMNS)}) VALUES ({placeholders})"
        for start in range(0, rows, _CHUNK):
            connection.execute("BEGIN")
            events: list[tuple[object, ...]] = []
            made = _rows(start, min(rows, start + _CHUNK), rows, events, digests)
            connection.executemany(insert, made)
            connection.executemany(_INSERT_EVENT, events)
            connection.execute("COMMIT")
    finally:
        connection.close()
    return FillReport(
        rows=rows, seconds=time.perf_counter() - started, file_bytes=bytes_per_operation(path)[1]
    )


def bytes_per_operation(path: Path) -> tuple[float, int]:
    """(file bytes per stored operation, file bytes), after a full WAL checkpoint."""
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        count = connection.execute("SELECT count(*) FROM operations").fetchone()[0]
    finally:
        connection.close()
    size = path.stat().st_size
    return (size / count if count else 0.0), size


def _rows(
    first: int, end: int, total: int, events: list[tuple[object, ...]], digests: Digests
) -> Iterator[tuple[object, ...]]:
    """Rows `first..end-1` of `total`, created evenly over the hour before now; their
    history events (claimed with the request, sent, answered) go to `events`."""
    now = time.time()
    for index in range(first, end):
        created = now - 3600.0 + 3600.0 * index / total
        completed = created + 0.002
        key = fill_key(index)
        body = fill_body(key)
        fingerprint = digests.fingerprint(
            FILL_SCOPE,
            fingerprint_request(
                method="POST",
                route="tickets",
                path="/tickets/v1/issues",
                query="",
                content_type="application/json",
                body=body,
            ),
        )
        request = http_record(
            method="POST",
            target="/tickets/v1/issues",
            content_type="application/json",
            body=body,
            limit=64 << 10,
            redact=(),
            digest=lambda kept: digests.body(FILL_SCOPE, kept),
        )
        operation_id = new_operation_id(created)
        claimed, head, _ = chain(
            operation_id, head="", seq=0, version=1, at_us=micros(created), attempt=1,
            events=(claimed_event(request_claimed(request), 1),),
        )  # fmt: skip
        answered, head, seq = chain(
            operation_id, head=head, seq=1, version=2, at_us=micros(completed), attempt=1,
            events=(sent_event(1, operation_id, attempt=1), answered_event(201, attempt=1)),
        )  # fmt: skip
        events.extend((*row[:8], "plain", *row[8:]) for row in (*claimed, *answered))
        yield (
            operation_id,  # id
            FILL_SCOPE,
            key,
            "completed",  # state
            "tickets",  # route
            "POST",
            "/tickets/v1/issues",
            fingerprint,
            1,  # attempts
            1,  # token
            2,  # version: claimed, then completed
            created,  # created_at
            completed,  # updated_at
            None,  # lease_owner
            None,  # lease_expires_at
            created,  # sent_at
            201,  # response_status
            _HEADERS,
            _receipt_body(index, key),
            1,  # body_retained
            completed + _DAY,  # expires_at: the default retention
            completed + 30 * _DAY,  # forgotten_at: the default tombstone retention
            "upstream",  # resolution_by
            completed,  # resolution_at
            None,  # resolution_note
            "[]",  # evidence
            "plain",  # storage
            seq,  # history_seq
            head,  # history_head
        )


def _receipt_body(index: int, key: str) -> bytes:
    head = f'{{"id":"T-{index + 1}","title":"benchmark ticket","client_ref":"{key}","pad":"'
    return (head + "x" * max(0, _RECEIPT_BODY_SIZE - len(head) - 2) + '"}').encode()
