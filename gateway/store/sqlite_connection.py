"""The SQLite store's connections: the file lock, the writer thread, the read-only reader.

Kept apart from the store's verbs (`gateway.store.sqlite`) because it changes
for other reasons: how one process holds the file (a lock on the file itself,
by any path or link), how every connection is set up (WAL, `synchronous=FULL`,
zeroed free pages, the store's clock as an SQL function), and how a read is
served from the committed state without waiting for the next group commit.
"""

from __future__ import annotations

import fcntl
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from gateway.engine.clock import Clock
from gateway.engine.errors import StoreUnavailable
from gateway.store.sqlite_schema import CLOCK_FUNCTION
from gateway.store.sqlite_thread import SqliteWriterThread


class SqliteConnection:
    """The file, the writer thread and the reader a `SqliteStore` runs its statements on."""

    def __init__(
        self,
        *,
        path: Path,
        busy_timeout: float,
        max_batch: int,
        on_batch: Callable[[int], None] | None,
        clock: Clock,
    ) -> None:
        self.path = path
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._writer = SqliteWriterThread(
            self._connect, busy_timeout=busy_timeout, max_batch=max_batch, on_batch=on_batch
        )
        self._lock_file: IO[bytes] | None = None
        self._reader: sqlite3.Connection | None = None

    def _take_process_lock(self) -> None:
        """Lock the database file itself, so the lock holds by any path or link to it.

        See `gateway.store.sqlite_lock`: the descriptor stays open until
        `_release_process_lock`, after the SQLite connections are closed.
        """
        from gateway.store.sqlite_lock import DatabaseFileInUse, lock_database_file

        try:
            self._lock_file = lock_database_file(self.path)
        except DatabaseFileInUse as exc:
            raise StoreUnavailable(
                f"{self.path} is in use by another gateway process (the database file "
                f"{self.path.resolve()} is locked); "
                "SQLite serves one gateway process: use PostgreSQL for replicas"
            ) from exc
        except OSError as exc:
            raise StoreUnavailable(f"cannot open the SQLite database {self.path}: {exc}") from exc

    def _release_process_lock(self) -> None:
        # Only once the SQLite connections are closed: closing this descriptor
        # drops every POSIX lock this process holds on the file, theirs too.
        if self._lock_file is not None:
            from gateway.store.sqlite_lock import forget_database_file

            fcntl.flock(self._lock_file.fileno(), fcntl.LOCK_UN)
            forget_database_file(self._lock_file)
            self._lock_file.close()
            self._lock_file = None

    def _connect(self) -> sqlite3.Connection:
        connection = sqlite3.connect(
            self.path, isolation_level=None, check_same_thread=False, timeout=self._busy_timeout
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=FULL")
        connection.execute(f"PRAGMA busy_timeout={int(self._busy_timeout * 1000)}")
        connection.execute("PRAGMA foreign_keys=ON")
        # Freed and overwritten content is zeroed, whatever the build's default: a
        # redacted receipt leaves no bytes behind in the database file.
        connection.execute("PRAGMA secure_delete=ON")
        connection.create_function(CLOCK_FUNCTION, 0, self._clock.time)
        return connection

    def _open_reader(self) -> sqlite3.Connection:
        try:
            reader = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
            reader.execute("PRAGMA query_only=1")
            # Never wait on the loop: a busy reader hands its read to the writer instead.
            reader.execute("PRAGMA busy_timeout=0")
            reader.create_function(CLOCK_FUNCTION, 0, self._clock.time)
        except sqlite3.Error as exc:
            raise StoreUnavailable(f"cannot open the SQLite database for reading: {exc}") from exc
        return reader

    def _read_now(self, sql: str, parameters: tuple[Any, ...]) -> list[Any] | None:
        """Rows from the committed state, read on the loop; `None` if that would wait.

        `fetchall` runs the statement to its end, so no read transaction stays
        open to hold back WAL checkpoints.
        """
        if self._reader is None:
            return None
        try:
            return self._reader.execute(sql, parameters).fetchall()
        except sqlite3.Error:  # busy in a WAL recovery, or worse: the writer path reports it
            return None

    async def _read(self, sql: str, parameters: tuple[Any, ...]) -> list[Any]:
        """Committed rows: on the loop if the reader can, else through the writer."""
        rows = self._read_now(sql, parameters)
        if rows is None:
            rows = await self._writer.run(lambda c: c.execute(sql, parameters).fetchall())
        return rows
