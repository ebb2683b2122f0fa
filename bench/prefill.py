"""Fill an SQLite store with a day of realistic operations, fast, to measure the store at scale.

Going through the gateway would take hours per ten million rows (each request
is a claim, a forward and a receipt, about 1,000 a second); the rows
themselves (`bench.fill_rows`: completed, released and unknown operations
with their histories and request logs) go in with `executemany` in large
transactions. The schema comes from the gateway's own migrations
(`gateway.store.sqlite_schema.migrate`); its secondary indexes are dropped
while filling and made again afterwards, from the very statements the schema
made them with, because one sorted index build is an order of magnitude
faster than ten million random inserts into it. The file that results is what
the gateway would have written row by row, index for index.

Keys are random-looking but reproducible (`fill_key(i)` for the `exact`
newest operations), so the load generator can look them up without being told them.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from bench.fill_rows import FILL_SCOPE, OPERATION_COLUMNS, fill_body, fill_key, made_in_parallel
from gateway.store.history_rows import EVENT_COLUMNS
from gateway.store.sqlite_schema import migrate
from gateway.store.sqlite_statements import load_or_create_secret

__all__ = [
    "EXACT_ROWS",
    "FILL_SCOPE",
    "FillReport",
    "bytes_per_operation",
    "fill_body",
    "fill_key",
    "prefill",
]

EXACT_ROWS = 100_000
"""Operations built exactly as the gateway builds them (`bench.fill_rows`): the ones a
benchmark may look up or replay."""
_CHUNK = 50_000


@dataclass(frozen=True, slots=True)
class FillReport:
    """What a prefill wrote."""

    rows: int
    exact: int
    """How many of them are exact (`fill_key(0..exact-1)`)."""
    seconds: float
    file_bytes: int

    @property
    def bytes_per_operation(self) -> float:
        """Bytes on disk per operation, history, request log and indexes included."""
        return self.file_bytes / self.rows if self.rows else 0.0


def prefill(path: Path, rows: int, *, exact: int = EXACT_ROWS) -> FillReport:
    """Create `path` with the gateway's schema holding `rows` operations of the day before now.

    The file is left in WAL mode, checkpointed, for a gateway to open.
    """
    started = time.perf_counter()
    connection = sqlite3.connect(path, isolation_level=None)
    try:
        # Durability is irrelevant while filling a scratch file; speed is not.
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=OFF")
        connection.execute("PRAGMA cache_size=-1048576")  # 1 GiB: the index builds sort in RAM
        connection.execute("BEGIN")
        migrate(connection)
        # As the gateway's first start makes it: a store holding operations but no
        # secret refuses to start.
        secret = load_or_create_secret(connection)
        indexes = _drop_secondary_indexes(connection)
        connection.execute("COMMIT")
        _insert(connection, rows, exact, secret)
        connection.execute("BEGIN")
        for statement in indexes:
            connection.execute(statement)
        connection.execute("COMMIT")
    finally:
        connection.close()
    return FillReport(
        rows=rows,
        exact=min(rows, exact),
        seconds=time.perf_counter() - started,
        file_bytes=bytes_per_operation(path)[1],
    )


def _drop_secondary_indexes(connection: sqlite3.Connection) -> list[str]:
    """Drop the schema's own `CREATE INDEX` indexes; return the statements that made them.

    Indexes SQLite made for a UNIQUE or PRIMARY KEY clause (no `sql`) stay: they
    cannot be dropped, and the claim's key probe is one of them.
    """
    made = connection.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL"
    ).fetchall()
    for name, _ in made:
        connection.execute(f'DROP INDEX "{name}"')
    return [sql for _, sql in made]


def _insert(connection: sqlite3.Connection, rows: int, exact: int, secret: bytes) -> None:
    placeholders = ", ".join("?" for _ in OPERATION_COLUMNS)
    operations = f"INSERT INTO operations ({', '.join(OPERATION_COLUMNS)}) VALUES ({placeholders})"
    events = f"INSERT INTO operation_events ({EVENT_COLUMNS}) VALUES ({', '.join('?' * 11)})"
    log = (
        "INSERT INTO request_log (operation_id, seq, at, request_id, status, outcome, "
        "replayed, problem) VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
    )
    counts = (
        "INSERT INTO request_counts (operation_id, total, replays, refusals) VALUES (?, ?, ?, ?)"
    )
    for made in made_in_parallel(rows, secret, exact=exact, chunk=_CHUNK):
        connection.execute("BEGIN")
        for statement, values in zip((operations, events, log, counts), made, strict=True):
            connection.executemany(statement, values)
        connection.execute("COMMIT")


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
