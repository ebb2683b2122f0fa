"""The supervisor: start N workers on one port and one store, restart the dead, drain on SIGTERM.

What it holds, so that N processes are one gateway: the SQLite file's lock
(a second gateway on the file is refused, whatever its workers), the ports
(`gateway.workers.ports`), the directory the workers publish their metrics
to (`gateway.web.metrics_processes`), and one channel per worker
(`gateway.workers.channel`). It runs no request and opens no store.

The first worker starts alone: it migrates the schema and turns what an
earlier gateway left in flight `unknown`; the others start once it listens. A
worker that dies is restarted in its slot, and the replacement turns the dead
one's claims `unknown` before it serves (never released: the dead worker may
have sent them). Restarts of a worker that keeps dying back off up to
`MAX_RESTART_DELAY`. On SIGTERM or SIGINT every worker gets SIGTERM and drains
as a single-process gateway does (its calls in flight finish and their
receipts are recorded); the supervisor exits once all have.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import shutil
import signal
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from prometheus_client import CollectorRegistry

from gateway.config import Settings
from gateway.web.app import SHUTDOWN_GRACE
from gateway.web.metrics import worker_restarts_counter
from gateway.web.metrics_processes import SUPERVISOR, WorkerSnapshots, forget_dead_worker
from gateway.web.process import announce, listening_url, wait_for_termination
from gateway.workers.channel import REPORT_SECONDS, SupervisorEnd, WorkersServing, pair
from gateway.workers.ports import bound_port, reserve_port
from gateway.workers.role import WorkerRole

log = logging.getLogger("gateway.workers")

START_SECONDS = 60.0
"""How long a worker may take to listen (migrations on a large file included)."""
MAX_RESTART_DELAY = 5.0
STABLE_SECONDS = 10.0
"""A worker that lived this long is restarted at once; one that dies sooner backs off."""
DEGRADED_SECONDS = 10.0
"""Fewer workers than configured serve for longer than this: `/readyz` says degraded.
A restart takes a second or two, so a load balancer that reads `/readyz` does not
take the gateway out for each one, only for a slot that stays empty."""


class WorkersFailed(Exception):
    """A worker could not start; the gateway does not serve."""


@dataclass
class _Slot:
    index: int
    process: asyncio.subprocess.Process | None = None
    channel: SupervisorEnd | None = None
    owner: str = ""
    started_at: float = 0.0
    failures: int = 0
    serving: bool = False
    """It listens (it said so on its channel) and has not died since."""
    dead_owners: list[str] = field(default_factory=list)


class Supervisor:
    """Runs `settings.server.workers` worker processes until `stop()`.

    >>> # supervisor = Supervisor(settings); urls = await supervisor.start(); ...
    >>> # await supervisor.stop()
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._slots = [_Slot(index) for index in range(settings.server.workers)]
        self._lock: IO[bytes] | None = None
        self._ports: list[socket.socket] = []
        self._metrics_directory = ""
        self._worker_settings = settings
        self._stopping = False
        self._watchers: set[asyncio.Task[None]] = set()
        self._short_since: float | None = None
        """Since when fewer than all workers serve (None: all do, or none has served yet:
        the clock starts when the first worker listens)."""
        self._degraded = False
        self._reporter: asyncio.Task[None] | None = None
        self._counts = CollectorRegistry(auto_describe=True)
        self._restarts = worker_restarts_counter(self._counts)

    async def start(self) -> list[str]:
        """Hold the file and the ports, start every worker; the URLs, main first."""
        try:
            self._hold_store()
            urls = self._hold_ports()
            self._metrics_directory = tempfile.mkdtemp(prefix="idempotency-gateway-metrics-")
            self._reporter = asyncio.create_task(self._report_workers(), name="workers-report")
            await self._start_worker(self._slots[0], first=True)
            await asyncio.gather(*(self._start_worker(slot) for slot in self._slots[1:]))
        except BaseException:
            await self.stop()
            raise
        return urls

    async def stop(self) -> None:
        """SIGTERM every worker and wait for each to drain (SIGKILL after the grace)."""
        self._stopping = True
        running = [
            slot.process
            for slot in self._slots
            if slot.process is not None and slot.process.returncode is None
        ]
        for process in running:
            with contextlib.suppress(ProcessLookupError):
                process.send_signal(signal.SIGTERM)
        if running:
            log.info("stopping %d workers: draining their calls in flight", len(running))
            await asyncio.wait(
                [asyncio.ensure_future(p.wait()) for p in running], timeout=SHUTDOWN_GRACE + 10
            )
            for process in running:
                if process.returncode is None:
                    with contextlib.suppress(ProcessLookupError):
                        process.kill()
                    await process.wait()
        for task in self._watchers:
            task.cancel()
        if self._reporter is not None:
            self._reporter.cancel()
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.close()
                slot.channel = None
        for sock in self._ports:
            sock.close()
        self._ports.clear()
        if self._metrics_directory:
            shutil.rmtree(self._metrics_directory, ignore_errors=True)
        self._release_store()

    @property
    def worker_pids(self) -> list[int]:
        return [
            slot.process.pid
            for slot in self._slots
            if slot.process is not None and slot.process.returncode is None
        ]

    # -- what makes the workers one gateway -------------------------------------

    def _hold_store(self) -> None:
        path = self._settings.store.sqlite_path
        if path is None:
            return  # PostgreSQL: the workers are replicas, nothing to hold
        from gateway.store.sqlite_lock import DatabaseFileInUse, lock_database_file

        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._lock = lock_database_file(path)
        except DatabaseFileInUse as exc:
            raise WorkersFailed(
                f"{path} is in use by another gateway process (the database file "
                f"{path.resolve()} is locked); "
                "SQLite serves one gateway: use PostgreSQL for replicas"
            ) from exc
        os.set_inheritable(self._lock.fileno(), True)

    def _release_store(self) -> None:
        if self._lock is not None:
            from gateway.store.sqlite_lock import forget_database_file

            forget_database_file(self._lock)
            self._lock.close()  # the last descriptor of the lock: the file is free
            self._lock = None

    def _hold_ports(self) -> list[str]:
        server, admin = self._settings.server, self._settings.admin
        main = reserve_port(server.host, server.port)
        self._ports.append(main)
        updates: dict[str, object] = {
            "server": server.model_copy(update={"port": bound_port(main)})
        }
        urls = [listening_url(server.host, bound_port(main))]
        if admin.enabled:
            admin_socket = reserve_port(admin.host, admin.port)
            self._ports.append(admin_socket)
            updates["admin"] = admin.model_copy(update={"port": bound_port(admin_socket)})
            urls.append(listening_url(admin.host, bound_port(admin_socket)))
        self._worker_settings = self._settings.model_copy(update=updates)
        return urls

    # -- one worker ---------------------------------------------------------------

    async def _start_worker(self, slot: _Slot, *, first: bool = False) -> None:
        supervisor_end, worker_end = pair()
        lock_descriptor = None if self._lock is None else self._lock.fileno()
        slot.owner = f"{socket.gethostname()}:{os.getpid()}:w{slot.index}:{uuid.uuid4().hex[:8]}"
        role = WorkerRole(
            index=slot.index,
            owner=slot.owner,
            supervisor_pid=os.getpid(),
            channel_descriptor=worker_end.fileno(),
            lock_descriptor=lock_descriptor,
            first=first,
            metrics_directory=self._metrics_directory,
            dead_owners=tuple(slot.dead_owners),
        )
        settings = self._worker_settings
        if slot.started_at:
            # A test-only fault fires in the workers that start with the gateway, never
            # again in a replacement: a crash test's restarted worker must serve.
            settings = settings.model_copy(
                update={"testing": settings.testing.model_copy(update={"fault": None})}
            )
        inherited = [worker_end.fileno(), *([] if lock_descriptor is None else [lock_descriptor])]
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway.workers.child",
                stdin=asyncio.subprocess.PIPE,
                pass_fds=inherited,
            )
        finally:
            worker_end.close()
        slot.process = process
        slot.started_at = time.monotonic()
        slot.channel = SupervisorEnd(supervisor_end, self._relay)
        slot.channel.send(self._report().encode())  # what it reads first, once it follows
        assert process.stdin is not None
        process.stdin.write(pickle.dumps((settings, role)))
        await process.stdin.drain()
        process.stdin.close()
        exited = asyncio.ensure_future(process.wait())
        done, _ = await asyncio.wait(
            [slot.channel.ready, exited], timeout=START_SECONDS, return_when="FIRST_COMPLETED"
        )
        if slot.channel.ready not in done:
            if not exited.done():
                process.kill()
                await process.wait()
            raise WorkersFailed(
                f"worker {slot.index} did not start (exit code {process.returncode})"
            )
        slot.dead_owners.clear()
        slot.serving = True
        self._workers_changed()
        watcher = asyncio.create_task(
            self._watch(slot, process, exited), name=f"worker-{slot.index}"
        )
        self._watchers.add(watcher)
        watcher.add_done_callback(self._watchers.discard)

    async def _watch(
        self, slot: _Slot, process: asyncio.subprocess.Process, exited: asyncio.Future[int]
    ) -> None:
        code = await exited
        slot.serving = False
        if self._stopping:
            return
        self._workers_changed()
        forget_dead_worker(process.pid, self._metrics_directory)
        lived = time.monotonic() - slot.started_at
        slot.failures = 0 if lived >= STABLE_SECONDS else slot.failures + 1
        delay = 0.0 if slot.failures <= 1 else _restart_delay(slot.failures)
        log.warning(
            "worker %d (pid %d) died (%s); its calls in flight turn unknown; restarting%s",
            slot.index,
            process.pid,
            _exit_reason(code),
            f" in {delay:.1f}s" if delay else "",
            extra={"event": "worker_died", "worker": slot.index, "pid": process.pid},
        )
        if slot.channel is not None:
            slot.channel.close()
            slot.channel = None
        slot.dead_owners.append(slot.owner)
        while not self._stopping:
            await asyncio.sleep(delay)
            if self._stopping:
                return
            try:
                self._count_restart()
                await self._start_worker(slot)
                return
            except (WorkersFailed, OSError) as exc:  # OSError: it could not even be spawned
                slot.failures += 1
                delay = _restart_delay(slot.failures)
                log.error("restarting worker %d failed: %s; again in %.1fs", slot.index, exc, delay)

    # -- what the workers and the scrapes learn from the supervisor -----------------

    def _workers_changed(self) -> None:
        """A worker started serving or died: tell every worker how many serve now."""
        serving = sum(slot.serving for slot in self._slots)
        if serving < len(self._slots):
            if self._short_since is None:
                self._short_since = time.monotonic()
        else:
            self._short_since = None
        self._broadcast()

    def _report(self) -> WorkersServing:
        serving = sum(slot.serving for slot in self._slots)
        short_for = 0.0 if self._short_since is None else time.monotonic() - self._short_since
        degraded = self._short_since is not None and short_for >= DEGRADED_SECONDS
        if degraded != self._degraded:
            self._degraded = degraded
            if degraded:
                log.warning(
                    "%d of %d workers serve, fewer than all for %.0fs: /readyz answers degraded",
                    serving,
                    len(self._slots),
                    short_for,
                    extra={"event": "workers_degraded", "serving": serving},
                )
            else:
                log.info("all %d workers serve again", len(self._slots))
        return WorkersServing(serving, len(self._slots), degraded=degraded)

    def _broadcast(self) -> None:
        datagram = self._report().encode()
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.send(datagram)

    async def _report_workers(self) -> None:
        """Repeat the report: it turns degraded with time alone, and a datagram may drop."""
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            self._broadcast()

    def _count_restart(self) -> None:
        """One more replacement worker: `worker_restarts_total` in every worker's scrape."""
        self._restarts.inc()
        try:
            WorkerSnapshots(Path(self._metrics_directory), SUPERVISOR).publish(self._counts)
        except OSError as exc:  # a full disk must not stop the restarts
            log.warning("cannot publish the restart count: %s", exc)

    def _relay(self, source: SupervisorEnd, datagram: bytes) -> None:
        for slot in self._slots:
            if slot.channel is not None and slot.channel is not source:
                slot.channel.send(datagram)


def _restart_delay(failures: int) -> float:
    """0.1 s after the first failure in a row, doubling up to `MAX_RESTART_DELAY`."""
    return min(0.1 * 2.0 ** (failures - 1), MAX_RESTART_DELAY)


def _exit_reason(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


async def supervise(settings: Settings) -> None:
    """Serve with workers until SIGTERM or SIGINT; the same lines as one process prints."""
    supervisor = Supervisor(settings)
    waiting = asyncio.ensure_future(wait_for_termination())
    await asyncio.sleep(0)  # its signal handlers are in place before any worker starts
    try:
        urls = await supervisor.start()
        announce(urls)
        log.info(
            "serving with %d workers",
            len(supervisor.worker_pids),
            extra={"event": "workers_started", "pids": supervisor.worker_pids},
        )
        await waiting
    finally:
        waiting.cancel()
        await supervisor.stop()  # a no-op when a failed start has stopped it already
