"""WAL checkpoints on a thread of their own, never inside a commit.

SQLite copies the write-ahead log back into the database file (a checkpoint)
whenever a commit leaves the log past 1,000 pages, and by default it does so
inside that COMMIT: the batch whose commit crossed the line waits for the
copy and its fsync. On a small store the copy is a few pages rewritten over
and over, and cheap. On a big one, each claim dirties leaves of its random
indexes (the key, the fingerprint) far apart in the file, so a checkpoint
writes hundreds of scattered pages and syncs them: measured here, a claim's
p99 went from 7.5 ms at a thousand stored operations to 113 ms at a million,
because about one batch in a hundred paid for a checkpoint.

So the writer's connection turns automatic checkpoints off and this thread
runs them instead, on a connection of its own, in PASSIVE mode: it copies
what it can without waiting for or blocking the writer or the readers, and
syncs the database file on this thread. Commits keep syncing only the log.
The writer wraps the log back to its start on its own once a checkpoint has
copied all of it. A nudge after each commit wakes the thread, which checks
the log's size (a `stat`) and copies when it is past the same 1,000 pages.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("gateway.store.sqlite")

CHECKPOINT_PAGES = 1000
"""Log pages after which a checkpoint runs: SQLite's own default for automatic ones."""


class WalCheckpointer:
    """Runs `PRAGMA wal_checkpoint(PASSIVE)` on its own thread when the log has grown.

    >>> # checkpointer = WalCheckpointer(connect, Path("gw.db")); checkpointer.start()
    >>> # ... after each commit: checkpointer.nudge(); at close: checkpointer.stop()
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        database: Path,
        *,
        pages: int = CHECKPOINT_PAGES,
    ) -> None:
        self._connect = connect
        self._wal = Path(f"{database}-wal")
        self._pages = pages
        self._threshold = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.checkpoints = 0
        """Checkpoints run so far (for tests and the curious)."""

    def start(self) -> None:
        self._thread = threading.Thread(target=self._main, name="sqlite-checkpoint", daemon=True)
        self._thread.start()

    def nudge(self) -> None:
        """A commit just happened: look at the log's size (cheap; any thread may call)."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread; SQLite checkpoints what is left when the last connection closes."""
        if self._thread is None:
            return
        self._stopping = True
        self._wake.set()
        self._thread.join()
        self._thread = None

    def _main(self) -> None:
        try:
            connection = self._connect()
        except sqlite3.Error as exc:  # the writer's own open reports the file's problems
            log.warning("no WAL checkpoint thread: %s", exc)
            return
        try:
            page_size = int(connection.execute("PRAGMA page_size").fetchone()[0])
            self._threshold = self._pages * page_size
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                if self._wal_size() >= self._threshold:
                    self._checkpoint(connection)
        finally:
            connection.close()

    def _wal_size(self) -> int:
        try:
            return os.stat(self._wal).st_size
        except FileNotFoundError:
            return 0

    def _checkpoint(self, connection: sqlite3.Connection) -> None:
        try:
            connection.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
        except sqlite3.OperationalError as exc:  # another process's checkpoint is running
            log.debug("wal checkpoint skipped: %s", exc)


def checkpoint_connection(path: Path) -> Callable[[], sqlite3.Connection]:
    """How the checkpoint thread opens the database: its own connection, which never
    waits for a lock (a checkpoint that finds the file busy tries again next time)."""

    def connect() -> sqlite3.Connection:
        connection = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        with contextlib.suppress(sqlite3.Error):
            connection.execute("PRAGMA busy_timeout=0")
        connection.execute("PRAGMA synchronous=FULL")
        return connection

    return connect
