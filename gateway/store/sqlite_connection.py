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
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from gateway.engine.clock import Clock
from gateway.engine.errors import StoreUnavailable
from gateway.store.base import SettledSignal
from gateway.store.sqlite_schema import CLOCK_FUNCTION, SETTLED_FUNCTION
from gateway.store.sqlite_thread import SqliteWriterThread


@dataclass(frozen=True, slots=True)
class SharedDatabase:
    """How one worker process of a gateway shares the database file with the others.

    The supervisor holds the gateway's lock on the file and passes its
    descriptor down (`gateway.store.sqlite_lock.adopt_database_lock`).
    """

    lock_descriptor: int
    first: bool
    """The gateway's first worker, started alone: every `in_flight` record it finds
    belongs to a process of an earlier gateway, now dead."""
    signal: SettledSignal | None = None


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
        shared: SharedDatabase | None = None,
    ) -> None:
        self.path = path
        self._clock = clock
        self._busy_timeout = busy_timeout
        self._shared = shared
        self._settled_pending: list[str] = []
        self._writer = SqliteWriterThread(
            self._connect,
            busy_timeout=busy_timeout,
            max_batch=max_batch,
            on_batch=on_batch,
            after_commit=self._publish_settled if shared and shared.signal else None,
        )
        self._lock_file: IO[bytes] | None = None
        self._reader: sqlite3.Connection | None = None

    def _take_process_lock(self) -> None:
        """Lock the database file itself, so the lock holds by any path or link to it.

        See `gateway.store.sqlite_lock`: the descriptor stays open until
        `_release_process_lock`, after the SQLite connections are closed. A
        worker checks the lock its supervisor holds for the whole gateway instead.
        """
        from gateway.store.sqlite_lock import (
            DatabaseFileInUse,
            adopt_database_lock,
            lock_database_file,
        )

        try:
            if self._shared is not None:
                adopt_database_lock(self.path, self._shared.lock_descriptor)
            else:
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
        connection.create_function(SETTLED_FUNCTION, 1, self._settled_pending.append)
        return connection

    def _publish_settled(self) -> None:
        """Tell the other workers which watched operations the last batch settled.

        After the commit, so a woken waiter reads the outcome. A batch that was
        rolled back may have noted some too: a waiter woken for nothing re-reads,
        finds the operation still in flight, and waits again.
        """
        if not self._settled_pending or self._shared is None or self._shared.signal is None:
            return
        settled = list(self._settled_pending)
        self._settled_pending.clear()  # the same list the SQL function appends to
        for operation_id in settled:
            self._shared.signal.publish(operation_id)

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
