"""`SqliteJournal`: many runs' journals in one SQLite database, one row per run.

Each call is one `BEGIN IMMEDIATE` transaction (the database's write lock is
the critical section): read the row, apply the lease rule, write the row,
commit. With `synchronous=FULL` the commit is on disk when it returns. A
connection is opened per call, so the store is safe from any thread.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path

from idempotency_gateway_client._exceptions import JournalError
from idempotency_gateway_client._journal import (
    Worker,
    fence,
    grant,
    parse_document,
    released,
    renewed,
)
from idempotency_gateway_client._records import JournalDocument

__all__ = ["SqliteJournal"]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id        TEXT PRIMARY KEY,
    flow_version  TEXT NOT NULL,
    lease_holder  TEXT,
    lease_token   INTEGER,
    finished      INTEGER NOT NULL,
    document      TEXT NOT NULL,
    updated_at    REAL NOT NULL
)
"""


class SqliteJournal:
    """A `JournalStore` keeping every run as a row of one SQLite database.

    >>> journal = SqliteJournal("runs.db")
    >>> async with Run(journal, client=gw, run_id="run-77", flow_version="v1", tools=TOOLS) as run:
    ...     await run.step(plan)
    """

    def __init__(self, path: str | os.PathLike[str], *, timeout: float = 10.0) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.path = Path(path)
        self.timeout = timeout
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._connection() as connection:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute(_SCHEMA)

    def __repr__(self) -> str:
        return f"SqliteJournal({str(self.path)!r})"

    def load(self, run_id: str) -> JournalDocument | None:
        with self._connection() as connection:
            return self._select(connection, run_id)

    def run_ids(self) -> list[str]:
        """Every run in the database, oldest update first."""
        with self._connection() as connection:
            rows = connection.execute("SELECT run_id FROM runs ORDER BY updated_at").fetchall()
        return [str(row[0]) for row in rows]

    def acquire(
        self, run_id: str, flow_version: str, worker: Worker, *, duration: float
    ) -> JournalDocument:
        with self._transaction() as connection:
            now = time.time()
            document = grant(
                self._select(connection, run_id),
                run_id,
                flow_version,
                worker,
                now=now,
                duration=duration,
            )
            self._upsert(connection, document, now)
            return document

    def write(self, document: JournalDocument, *, duration: float) -> JournalDocument:
        with self._transaction() as connection:
            now = time.time()
            fence(self._select(connection, document.run_id), document)
            stored = renewed(document, now=now, duration=duration)
            self._upsert(connection, stored, now)
            return stored

    def release(self, document: JournalDocument) -> None:
        with self._transaction() as connection:
            fence(self._select(connection, document.run_id), document)
            self._upsert(connection, released(document), time.time())

    @contextlib.contextmanager
    def _connection(self) -> Iterator[sqlite3.Connection]:
        try:
            connection = sqlite3.connect(self.path, timeout=self.timeout, isolation_level=None)
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: cannot open the journal database: {exc}") from exc
        try:
            connection.execute("PRAGMA synchronous=FULL")
            yield connection
        except sqlite3.Error as exc:
            raise JournalError(f"{self.path}: {exc}") from exc
        finally:
            connection.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connection() as connection:
            connection.execute("BEGIN IMMEDIATE")
            try:
                yield connection
            except BaseException:
                connection.execute("ROLLBACK")
                raise
            connection.execute("COMMIT")

    def _select(self, connection: sqlite3.Connection, run_id: str) -> JournalDocument | None:
        row = connection.execute("SELECT document FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        if row is None:
            return None
        return parse_document(str(row[0]).encode(), f"{self.path} run {run_id!r}")

    def _upsert(
        self, connection: sqlite3.Connection, document: JournalDocument, now: float
    ) -> None:
        lease = document.lease
        connection.execute(
            "INSERT INTO runs (run_id, flow_version, lease_holder, lease_token, finished,"
            " document, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?)"
            " ON CONFLICT (run_id) DO UPDATE SET flow_version = excluded.flow_version,"
            " lease_holder = excluded.lease_holder, lease_token = excluded.lease_token,"
            " finished = excluded.finished, document = excluded.document,"
            " updated_at = excluded.updated_at",
            (
                document.run_id,
                document.flow_version,
                lease.holder if lease else None,
                lease.token if lease else None,
                int(document.finished),
                document.to_json().decode(),
                now,
            ),
        )
