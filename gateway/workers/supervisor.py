"""The supervisor: start N workers on one port and one store, restart the dead, drain on SIGTERM.

What it holds, so that N processes are one gateway: the SQLite file's lock
(a second gateway on the file is refused, whatever its workers), the ports
(`gateway.workers.ports`), the directory the workers publish their metrics
to (`gateway.web.metrics_processes`), and one channel per worker
(`gateway.workers.channel`). It runs no request and opens no store.

The first worker starts alone: it migrates the schema and turns what an
earlier gateway left in flight `unknown`; the others start once it listens.
Only that first start can stop the gateway, and only for what no restart
mends: the worker exits with an error of its own (a configuration or a store
it refuses; it has printed why) or does not listen within `START_SECONDS`. A
first worker killed by a signal before it listens (the OOM killer during a
long migration, an operator's mistake) is started again, `FIRST_START_TRIES`
times at most.

Once the first worker has listened, the gateway has served, and no worker
death ends it: a worker killed while it serves, while it starts, before its
settings reach it, or one that cannot even be spawned, is a death like any
other. Each slot has a keeper task that logs the death and starts the slot
again, backing off up to `MAX_RESTART_DELAY` while its workers keep dying; the
replacement turns the dead one's claims `unknown` before it serves (never
released: the dead worker may have sent them). The supervisor tells every
worker how many serve (`/readyz`) and counts the restarts (`/metrics`). On
SIGTERM or SIGINT every worker gets SIGTERM and drains as a single-process
gateway does (its calls in flight finish and their receipts are recorded);
the supervisor exits once all have.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
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
from typing import IO

from gateway.config import Settings
from gateway.web.app import SHUTDOWN_GRACE
from gateway.web.metrics_processes import forget_dead_worker
from gateway.web.process import announce, listening_url, wait_for_termination
from gateway.workers.channel import REPORT_SECONDS, SupervisorEnd, pair
from gateway.workers.health import WorkersHealth
from gateway.workers.ports import bound_port, reserve_port
from gateway.workers.role import WorkerRole

log = logging.getLogger("gateway.workers")

START_SECONDS = 60.0
"""How long a worker may take to listen (migrations on a large file included)."""
MAX_RESTART_DELAY = 5.0
STABLE_SECONDS = 10.0
"""A worker that lived this long is restarted at once; one that dies sooner backs off."""
FIRST_START_TRIES = 5
"""Starts of a first worker killed by a signal each time before it listens, before the
gateway gives up (about 1.5 s of backoff in all): nothing has served yet, and a
process manager should learn that this gateway cannot start rather than wait."""


class WorkersFailed(Exception):
    """The first worker could not start; the gateway does not serve."""


class _Start(enum.Enum):
    """How a worker's start ended."""

    LISTENING = "listening"
    EXITED = "exited"
    TIMED_OUT = "timed out"


@dataclass
class _Slot:
    index: int
    process: asyncio.subprocess.Process | None = None
    channel: SupervisorEnd | None = None
    owner: str = ""
    started_at: float = 0.0
    starts: int = 0
    """Workers spawned in this slot so far: any after the first is a restart."""
    failures: int = 0
    """Deaths in a row of workers that lived less than `STABLE_SECONDS`."""
    delay: float = 0.0
    """How long the keeper waits before the next start."""
    serving: bool = False
    """It listens (it said so on its channel) and has not died since."""
    first_try_over: asyncio.Event = field(default_factory=asyncio.Event)
    """Its first worker listens or has died starting: `start()` waits for this."""
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
        self._keepers: list[asyncio.Task[None]] = []
        self._health = WorkersHealth(settings.server.workers)
        self._reporter: asyncio.Task[None] | None = None

    async def start(self) -> list[str]:
        """Hold the file and the ports, start the first worker, then the others; the URLs,
        main first. Raises only for the first worker (`WorkersFailed`) or what the
        supervisor holds (OSError); returns once every other worker listens or has died
        starting, which its keeper mends like any later death."""
        try:
            self._hold_store()
            urls = self._hold_ports()
            self._metrics_directory = tempfile.mkdtemp(prefix="idempotency-gateway-metrics-")
            self._health.metrics_directory = self._metrics_directory
            self._reporter = asyncio.create_task(self._report_workers(), name="workers-report")
            first = await self._start_first()
            self._keepers = [
                asyncio.create_task(
                    self._keep(slot, first if slot.index == 0 else None),
                    name=f"worker-{slot.index}",
                )
                for slot in self._slots
            ]
            await asyncio.gather(*(slot.first_try_over.wait() for slot in self._slots[1:]))
        except BaseException:
            await self.stop()
            raise
        return urls

    async def stop(self) -> None:
        """Stop restarting, SIGTERM every worker (starting ones too) and wait for each to
        drain (SIGKILL after the grace). Idempotent: a failed start has called it already."""
        self._stopping = True
        tasks = [*self._keepers, *([self._reporter] if self._reporter is not None else [])]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._keepers.clear()
        self._reporter = None
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
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.close()
                slot.channel = None
        for sock in self._ports:
            sock.close()
        self._ports.clear()
        if self._metrics_directory:
            shutil.rmtree(self._metrics_directory, ignore_errors=True)
            self._metrics_directory = ""
        self._release_store()

    @property
    def worker_pids(self) -> list[int]:
        return [
            slot.process.pid
            for slot in self._slots
            if slot.process is not None and slot.process.returncode is None
        ]

    @property
    def serving_workers(self) -> int:
        return sum(slot.serving for slot in self._slots)

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

    async def _start_first(self) -> asyncio.subprocess.Process:
        """Start worker 0 alone; the gateway stops only here (see the module's docstring)."""
        slot = self._slots[0]
        for tries in range(1, FIRST_START_TRIES + 1):
            try:
                process = await self._launch(slot, first=True)
            except OSError as exc:
                raise WorkersFailed(f"worker 0 could not be started: {exc}") from exc
            outcome = await self._until_listening(slot, process)
            if outcome is _Start.LISTENING:
                return process
            self._bury(slot, process)
            code = process.returncode
            assert code is not None  # reaped by `_until_listening`
            if outcome is _Start.TIMED_OUT:
                raise WorkersFailed(f"worker 0 did not listen within {START_SECONDS:g}s")
            if code >= 0:  # its own verdict: it printed why
                raise WorkersFailed(f"worker 0 did not start (exit code {code})")
            if tries == FIRST_START_TRIES:
                raise WorkersFailed(
                    f"worker 0 was {_exit_reason(code)} {tries} times before it listened"
                )
            delay = _restart_delay(tries)
            log.warning(
                "worker 0 (pid %d) was %s before it listened; starting it again in %.1fs "
                "(try %d of %d)",
                process.pid,
                _exit_reason(code),
                delay,
                tries + 1,
                FIRST_START_TRIES,
                extra={"event": "worker_died", "worker": 0, "pid": process.pid},
            )
            await asyncio.sleep(delay)
            self._health.count_restart()
        raise AssertionError("unreachable: the last try returns or raises")

    async def _keep(self, slot: _Slot, process: asyncio.subprocess.Process | None) -> None:
        """Keep `slot` served until `stop()` cancels this task: whatever ends a worker
        here (killed serving or starting, an exit of its own, a failed spawn, even a bug
        in this loop) is a death, logged, and the slot is started again after its
        backoff. Nothing leaves this loop: the gateway has served."""
        try:
            while not self._stopping:
                try:
                    if process is None:
                        process = await self._restart(slot)
                        slot.first_try_over.set()
                    if process is not None:
                        await self._serve(slot, process)
                        process = None
                except Exception:  # not CancelledError: that is `stop()`
                    log.exception("worker %d: supervising it failed; starting it again", slot.index)
                    process = None
                    with contextlib.suppress(Exception):
                        await self._reap(slot)
                    slot.failures += 1
                    slot.delay = _restart_delay(slot.failures)
                    slot.first_try_over.set()
        finally:
            slot.first_try_over.set()

    async def _restart(self, slot: _Slot) -> asyncio.subprocess.Process | None:
        """Start a worker in `slot`, after the slot's backoff when it replaces a dead one:
        the process once it listens, or None when it died starting (logged; the next
        try backs off further)."""
        verb = "restarting" if slot.starts else "starting"
        await asyncio.sleep(slot.delay)  # 0 for a slot's first start
        if self._stopping:
            return None
        if slot.starts:
            self._health.count_restart()
        try:
            process = await self._launch(slot, first=False)
        except OSError as exc:  # it could not even be spawned
            slot.failures += 1
            slot.delay = _restart_delay(slot.failures)
            log.error("%s worker %d failed: %s; again in %.1fs", verb, slot.index, exc, slot.delay)
            return None
        outcome = await self._until_listening(slot, process)
        if outcome is _Start.LISTENING:
            return process
        self._bury(slot, process)
        self._back_off(slot)
        code = process.returncode
        assert code is not None  # reaped by `_until_listening`
        why = (
            f"did not listen within {START_SECONDS:g}s"
            if outcome is _Start.TIMED_OUT
            else f"did not start ({_exit_reason(code)})"
        )
        log.error(
            "%s worker %d failed: worker %d (pid %d) %s; again in %.1fs",
            verb,
            slot.index,
            slot.index,
            process.pid,
            why,
            slot.delay,
            extra={"event": "worker_died", "worker": slot.index, "pid": process.pid},
        )
        return None

    async def _serve(self, slot: _Slot, process: asyncio.subprocess.Process) -> None:
        """`process` listens in `slot`: count it as serving until it dies, then log the death
        (its replacement is the keeper's next step)."""
        slot.dead_owners.clear()  # it turned them `unknown` before it listened
        slot.serving = True
        self._workers_changed()
        try:
            code = await process.wait()
        finally:
            slot.serving = False
        if self._stopping:
            return
        self._workers_changed()
        self._bury(slot, process)
        self._back_off(slot)
        log.warning(
            "worker %d (pid %d) died (%s); its calls in flight turn unknown; restarting%s",
            slot.index,
            process.pid,
            _exit_reason(code),
            f" in {slot.delay:.1f}s" if slot.delay else "",
            extra={"event": "worker_died", "worker": slot.index, "pid": process.pid},
        )

    async def _launch(self, slot: _Slot, *, first: bool) -> asyncio.subprocess.Process:
        """Spawn a worker in `slot` and hand it its settings and role (OSError: no process
        was made). A worker that dies meanwhile is not an error here: its exit says how."""
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
        if slot.starts:
            # A test-only fault fires in the workers that start with the gateway, never
            # again in a replacement: a crash test's restarted worker must serve.
            settings = settings.model_copy(
                update={"testing": settings.testing.model_copy(update={"fault": None})}
            )
        inherited = [worker_end.fileno(), *([] if lock_descriptor is None else [lock_descriptor])]
        slot.starts += 1
        try:
            process = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "gateway.workers.child",
                stdin=asyncio.subprocess.PIPE,
                pass_fds=inherited,
            )
        except BaseException:
            supervisor_end.close()
            raise
        finally:
            worker_end.close()
        slot.process = process
        slot.started_at = time.monotonic()
        slot.channel = SupervisorEnd(supervisor_end, self._relay)
        slot.channel.send(self._health.report().encode())  # what it reads first, once it follows
        assert process.stdin is not None
        try:
            # A worker killed before it read its settings has closed the pipe; uvloop (the
            # default loop) then refuses the write with RuntimeError where asyncio's loop
            # drops it: either way the worker is dead, and `_until_listening` sees it exit.
            if not process.stdin.is_closing():
                process.stdin.write(pickle.dumps((settings, role)))
                await process.stdin.drain()
        except OSError:  # BrokenPipeError, ConnectionResetError: it is dead already
            pass
        finally:
            process.stdin.close()
        return process

    async def _until_listening(self, slot: _Slot, process: asyncio.subprocess.Process) -> _Start:
        """Wait until the worker says it listens, exits, or `START_SECONDS` pass (then it is
        killed). Unless it listens, it has been reaped when this returns."""
        assert slot.channel is not None
        ready = slot.channel.ready
        exited = asyncio.ensure_future(process.wait())
        try:
            await asyncio.wait(
                [ready, exited], timeout=START_SECONDS, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            exited.cancel()
        if ready.done() and not ready.cancelled():
            return _Start.LISTENING
        if process.returncode is not None:
            return _Start.EXITED
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        await process.wait()
        return _Start.TIMED_OUT

    def _bury(self, slot: _Slot, process: asyncio.subprocess.Process) -> None:
        """What a reaped worker leaves behind: its channel, its gauges in the metrics, and
        its claims, which its replacement turns `unknown`."""
        with contextlib.suppress(OSError):
            forget_dead_worker(process.pid, self._metrics_directory)
        if slot.channel is not None:
            slot.channel.close()
            slot.channel = None
        slot.process = None
        slot.dead_owners.append(slot.owner)

    async def _reap(self, slot: _Slot) -> None:
        """After an unexpected error: make sure the slot's worker is gone and buried."""
        process = slot.process
        if process is None:
            return
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            await process.wait()
        self._bury(slot, process)

    def _back_off(self, slot: _Slot) -> None:
        """A worker that lived `STABLE_SECONDS` is restarted at once; deaths in a row of
        shorter-lived ones wait longer and longer (none after the first)."""
        lived = time.monotonic() - slot.started_at
        slot.failures = 0 if lived >= STABLE_SECONDS else slot.failures + 1
        slot.delay = 0.0 if slot.failures <= 1 else _restart_delay(slot.failures)

    # -- what the workers and the scrapes learn from the supervisor -----------------

    def _workers_changed(self) -> None:
        """A worker started serving or died: tell every worker how many serve now."""
        self._health.serving_changed(self.serving_workers)
        self._broadcast()

    def _broadcast(self) -> None:
        datagram = self._health.report().encode()
        for slot in self._slots:
            if slot.channel is not None:
                slot.channel.send(datagram)

    async def _report_workers(self) -> None:
        """Repeat the report: it turns degraded with time alone, and a datagram may drop."""
        while True:
            await asyncio.sleep(REPORT_SECONDS)
            self._broadcast()

    def _relay(self, source: SupervisorEnd, datagram: bytes) -> None:
        for slot in self._slots:
            if slot.channel is not None and slot.channel is not source:
                slot.channel.send(datagram)


def _restart_delay(failures: int) -> float:
    """0.1 s after the first failure in a row, doubling up to `MAX_RESTART_DELAY`."""
    return min(0.1 * 2.0 ** (failures - 1), MAX_RESTART_DELAY)


def _exit_reason(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:  # a signal without a name (a real-time one)
            return f"killed by signal {-code}"
    return f"exit code {code}"


async def supervise(settings: Settings) -> None:
    """Serve with workers until SIGTERM or SIGINT; the same lines as one process prints."""
    supervisor = Supervisor(settings)
    waiting = asyncio.ensure_future(wait_for_termination())
    await asyncio.sleep(0)  # its signal handlers are in place before any worker starts
    try:
        urls = await supervisor.start()
        announce(urls)
        started = {"event": "workers_started", "pids": supervisor.worker_pids}
        serving, workers = supervisor.serving_workers, settings.server.workers
        if serving == workers:
            log.info("serving with %d workers", serving, extra=started)
        else:
            log.info(
                "serving with %d of %d workers; the others died starting and are restarting",
                serving,
                workers,
                extra=started,
            )
        await waiting
    finally:
        waiting.cancel()
        await supervisor.stop()  # a no-op when a failed start has stopped it already
