"""Two SQLite stores on one file, as two workers of one gateway open it, seen as one store.

The conformance suite runs against it (`sqlite-workers`): every call goes to
the next store in turn, so a claim made through one worker is completed,
renewed, listed or expired through the other, as it is when SO_REUSEPORT sends
a retry to another worker. The fixture holds the file's lock as the supervisor
does (`gateway.workers.supervisor`) and lends its descriptor to both.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import IO, Any

from gateway.store.sqlite import SqliteStore
from gateway.store.sqlite_connection import SharedDatabase
from gateway.store.sqlite_lock import forget_database_file, lock_database_file


class GatewayLock:
    """The supervisor's part: hold the database file's lock for all workers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._handle: IO[bytes] | None = None

    @property
    def descriptor(self) -> int:
        if self._handle is None:
            self._handle = lock_database_file(self.path)
        return self._handle.fileno()

    def release(self) -> None:
        if self._handle is not None:
            forget_database_file(self._handle)
            self._handle.close()
            self._handle = None


class TwoWorkers:
    """`Store` over two worker stores of one gateway, alternating between them per call."""

    def __init__(self, lock: GatewayLock, *, busy_timeout: float = 1.0) -> None:
        self.workers = [
            SqliteStore(
                path=lock.path,
                busy_timeout=busy_timeout,
                shared=SharedDatabase(lock_descriptor=lock.descriptor, first=index == 0),
            )
            for index in range(2)
        ]
        self._turn = itertools.cycle(self.workers)

    async def open(self) -> None:
        for worker in self.workers:  # the first alone, as the supervisor starts them
            await worker.open()

    async def close(self) -> None:
        for worker in self.workers:
            await worker.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(next(self._turn), name)
