"""Group commit for SQLite: statements on the event loop, the fsync on a thread.

Every durable commit costs an fsync (about 0.25 ms here, far more at the
tail). Sixty-four concurrent requests must not pay sixty-four of them, so
work is committed in groups:

- the first job that finds the store idle opens a transaction and runs its
  statements right away, on the event loop (a few microseconds of CPU each,
  no I/O: in WAL mode the disk is touched at COMMIT);
- the COMMIT (the fsync, and any WAL checkpoint) runs on a dedicated thread,
  so the loop keeps serving while the disk works;
- jobs arriving meanwhile queue up; when the commit returns, every job of the
  batch is resolved at once and the queue becomes the next batch.

A lone request pays one commit and no batching delay: the batch closes as soon
as nothing else is queued. No job's future resolves before the commit that
holds its write has returned, so nothing proceeds on a write that is not yet
durable. One failing job cannot spoil its neighbours: the batch is then
rolled back and run again with a savepoint around each job.

Why not a thread that runs the statements too: each statement would hand the
GIL between the loop and that thread, and under load each hand-off waits for
the loop to yield; measured here, that halved throughput. This way a batch
costs two hand-offs, whatever its size. If another process holds the
database's write lock (a backup, an operator's shell), the batch waits for it
on the thread, never on the loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from gateway.engine.errors import STORE_DOWN, StoreUnavailable

T = TypeVar("T")
log = logging.getLogger("gateway.store.sqlite")


@dataclass(slots=True)
class _Pending(Generic[T]):
    job: Callable[[sqlite3.Connection], T]
    future: asyncio.Future[T]
    off_loop: bool = False
    truncate_wal: bool = False


@dataclass(slots=True)
class _Done:
    future: asyncio.Future[Any]
    result: Any = None
    error: BaseException | None = None


class SqliteWriterThread:
    """Runs jobs `fn(connection) -> result`, committed in groups.

    >>> # writer = SqliteWriterThread(connect, busy_timeout=5.0); await writer.start()
    >>> # one = await writer.run(lambda c: c.execute("select 1").fetchone()[0])
    """

    def __init__(
        self,
        connect: Callable[[], sqlite3.Connection],
        *,
        busy_timeout: float = 5.0,
        max_batch: int = 256,
        on_batch: Callable[[int], None] | None = None,
        after_commit: Callable[[], None] | None = None,
    ) -> None:
        """`after_commit` runs on the loop once each batch's jobs are resolved."""
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        self._connect = connect
        self._busy_timeout = busy_timeout
        self._max_batch = max_batch
        self._on_batch = on_batch
        self._after_commit = after_commit
        self._queue: deque[_Pending[Any]] = deque()
        self._committing = False
        self._connection: sqlite3.Connection | None = None
        self._thread: _CommitThread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle = asyncio.Event()

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._thread = _CommitThread(self._loop)
        try:
            connection = await self._thread.call(self._connect)
        except (sqlite3.Error, OSError) as exc:
            self._thread.stop()
            self._thread = None
            raise StoreUnavailable(f"cannot open the SQLite database: {exc}") from exc
        # Statements on the loop must never wait for a lock; `_start_batch` handles busy.
        connection.execute("PRAGMA busy_timeout=0")
        self._connection = connection
        self._idle.set()

    async def run(
        self,
        job: Callable[[sqlite3.Connection], T],
        *,
        off_loop: bool = False,
        truncate_wal: bool = False,
    ) -> T:
        """Run `job` in the next batch; return once its batch is committed.

        `off_loop=True` is for statements whose cost grows with the table (sweeps,
        counts, migrations): their batch runs on the thread, so the loop never
        waits on a scan. `truncate_wal=True`: after the commit, the WAL is copied
        into the database file and emptied (a checkpoint cannot run inside the
        batch's transaction), so overwritten bytes leave the WAL too.
        """
        if self._loop is None or self._connection is None:
            raise StoreUnavailable("the SQLite store is not open")
        future: asyncio.Future[T] = self._loop.create_future()
        self._queue.append(_Pending(job, future, off_loop, truncate_wal))
        if not self._committing:
            self._start_batch()
        return await future

    async def stop(self) -> None:
        if self._connection is None:
            return
        while self._committing or self._queue:
            self._idle.clear()
            await self._idle.wait()
        connection, self._connection = self._connection, None
        thread, self._thread = self._thread, None
        assert thread is not None
        await thread.call(connection.close)
        thread.stop()

    # -- one batch ---------------------------------------------------------------

    def _start_batch(self) -> None:
        batch = [self._queue.popleft() for _ in range(min(len(self._queue), self._max_batch))]
        if not batch:
            self._idle.set()
            return
        self._committing = True
        connection = self._connection
        thread = self._thread
        assert connection is not None
        assert thread is not None
        if any(item.off_loop for item in batch):
            scan = lambda: self._run_batch_waiting(connection, batch)  # noqa: E731
            thread.submit(scan, self._delivered(batch))
            return
        try:
            connection.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError:
            # Another process holds the write lock (another worker of this gateway, a
            # backup): wait for it on the thread, then run the statements here.
            thread.submit(
                lambda: _begin_waiting(connection, self._busy_timeout),
                lambda _, error: self._run_on_loop(batch, error),
            )
            return
        except sqlite3.Error as exc:
            self._finish_now(batch, _unavailable("the SQLite store refused a transaction", exc))
            return
        self._run_on_loop(batch, None)

    def _run_on_loop(self, batch: list[_Pending[Any]], error: BaseException | None) -> None:
        """Run the batch's statements in the transaction just begun; COMMIT on the thread."""
        connection = self._connection
        thread = self._thread
        assert connection is not None
        assert thread is not None
        if error is not None:
            self._finish_now(batch, error)
            return
        try:
            done = _run_jobs(connection, batch)
        except sqlite3.Error as exc:  # even the rollback to the careful path failed
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            self._finish_now(batch, _unavailable("the SQLite store failed mid-batch", exc))
            return
        thread.submit(
            lambda: _commit(connection, done, truncate_wal=_truncates(batch)),
            self._delivered(batch),
        )

    def _delivered(
        self, batch: list[_Pending[Any]]
    ) -> Callable[[list[_Done] | None, BaseException | None], None]:
        def deliver(done: list[_Done] | None, error: BaseException | None) -> None:
            if done is None:  # the commit call itself blew up
                failure = _unavailable("the SQLite commit failed", error or RuntimeError())
                done = [_Done(item.future, error=failure) for item in batch]
            self._deliver(batch, done)

        return deliver

    def _run_batch_waiting(
        self, connection: sqlite3.Connection, batch: list[_Pending[Any]]
    ) -> list[_Done]:
        try:
            _begin_waiting(connection, self._busy_timeout)
        except StoreUnavailable as locked:
            return [_Done(item.future, error=locked) for item in batch]
        try:
            done = _run_jobs(connection, batch)
        except sqlite3.Error as exc:  # even the rollback to the careful path failed
            with contextlib.suppress(sqlite3.Error):
                connection.execute("ROLLBACK")
            error = _unavailable("the SQLite store failed mid-batch", exc)
            return [_Done(item.future, error=error) for item in batch]
        return _commit(connection, done, truncate_wal=_truncates(batch))

    def _finish_now(self, batch: list[_Pending[Any]], error: BaseException) -> None:
        self._deliver(batch, [_Done(item.future, error=error) for item in batch])

    def _deliver(self, batch: list[_Pending[Any]], done: list[_Done]) -> None:
        for item in done:
            if item.future.cancelled():
                continue
            if item.error is not None:
                item.future.set_exception(item.error)
            else:
                item.future.set_result(item.result)
        if self._on_batch is not None:
            self._on_batch(len(batch))
        if self._after_commit is not None:
            self._after_commit()
        self._committing = False
        if self._queue:
            self._start_batch()
        else:
            self._idle.set()


class _CommitThread:
    """One thread for the calls that may block on the disk: connect, COMMIT, close.

    Cheaper than a ThreadPoolExecutor on this path (no concurrent.futures
    machinery): a queue in, one `call_soon_threadsafe` out per call.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: queue.SimpleQueue[
            tuple[Callable[[], Any], Callable[[Any, BaseException | None], None]] | None
        ] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._main, name="sqlite-commit", daemon=True)
        self._thread.start()

    def submit(
        self, call: Callable[[], T], then: Callable[[T | None, BaseException | None], None]
    ) -> None:
        """Run `call` on the thread; `then(result, error)` runs on the loop afterwards."""
        self._queue.put((call, then))

    async def call(self, call: Callable[[], T]) -> T:
        future: asyncio.Future[T] = self._loop.create_future()

        def then(result: T | None, error: BaseException | None) -> None:
            if future.cancelled():
                return
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)  # type: ignore[arg-type]

        self.submit(call, then)
        return await future

    def stop(self) -> None:
        self._queue.put(None)
        self._thread.join()

    def _main(self) -> None:
        while (item := self._queue.get()) is not None:
            call, then = item
            try:
                result, error = call(), None
            except BaseException as exc:
                result, error = None, exc
            try:
                self._loop.call_soon_threadsafe(then, result, error)
            except RuntimeError:  # the loop is closed: nobody is waiting any more
                return


BUSY_RETRY = (0.0002, 0.005)
"""First and longest sleep between tries for the write lock another process holds.

Another worker's transaction is a batch and its fsync, a fraction of a
millisecond: a first retry that soon takes the lock when it is free again, and
the doubling keeps a long holder (a backup) from costing many wake-ups."""


def _begin_waiting(connection: sqlite3.Connection, seconds: float) -> None:
    """BEGIN IMMEDIATE once the write lock is free; `StoreUnavailable` after `seconds`."""
    deadline = time.monotonic() + seconds
    pause = BUSY_RETRY[0]
    while True:
        try:
            connection.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if time.monotonic() >= deadline:
                raise _unavailable("the SQLite database stayed locked", exc) from exc
            time.sleep(pause)
            pause = min(pause * 2, BUSY_RETRY[1])


def _run_jobs(connection: sqlite3.Connection, batch: list[_Pending[Any]]) -> list[_Done]:
    """Each job's statements inside the open transaction.

    Optimistic: jobs run back to back, without savepoints (two statements per
    job saved on the hot path). If any job fails, the whole transaction is
    rolled back and the batch runs again with a savepoint around each job, so
    the failure stays with its job and its neighbours' writes still commit.
    """
    done: list[_Done] = []
    for item in batch:
        try:
            done.append(_Done(item.future, result=item.job(connection)))
        except Exception:
            connection.execute("ROLLBACK")
            connection.execute("BEGIN IMMEDIATE")
            return _run_jobs_isolated(connection, batch)
    return done


def _run_jobs_isolated(connection: sqlite3.Connection, batch: list[_Pending[Any]]) -> list[_Done]:
    done: list[_Done] = []
    for item in batch:
        try:
            connection.execute("SAVEPOINT job")
            try:
                result = item.job(connection)
            except BaseException:
                connection.execute("ROLLBACK TO job")
                raise
            finally:
                connection.execute("RELEASE job")
            done.append(_Done(item.future, result=result))
        except sqlite3.Error as exc:
            log.warning("sqlite statement failed: %s", exc)
            done.append(
                _Done(
                    item.future, error=StoreUnavailable(STORE_DOWN, internal=f"SQLite error: {exc}")
                )
            )
        except Exception as exc:
            done.append(_Done(item.future, error=exc))
    return done


def _truncates(batch: list[_Pending[Any]]) -> bool:
    return any(item.truncate_wal for item in batch)


def _commit(
    connection: sqlite3.Connection, done: list[_Done], *, truncate_wal: bool = False
) -> list[_Done]:
    """COMMIT (the fsync) on the thread; on failure every job of the batch fails."""
    try:
        connection.execute("COMMIT")
    except sqlite3.Error as exc:
        log.warning("sqlite commit failed: %s", exc)
        # SQLite may already have rolled the transaction back itself.
        with contextlib.suppress(sqlite3.Error):
            connection.execute("ROLLBACK")
        error = _unavailable("the SQLite commit failed", exc)
        return [_Done(d.future, error=d.error or error) for d in done]
    if truncate_wal:
        try:
            busy, _, _ = connection.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error as exc:
            busy = 1
            log.warning("sqlite checkpoint after a redaction failed: %s", exc)
        if busy:  # a reader held the WAL: the bytes stay until the next checkpoint
            log.warning("the WAL could not be truncated after a redaction; it will be later")
    return done


def _unavailable(what: str, exc: BaseException) -> StoreUnavailable:
    return StoreUnavailable(STORE_DOWN, internal=f"{what}: {exc}")
