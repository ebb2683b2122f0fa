"""The `JournalStore` protocol and the lease rules every store applies the same way.

A store decides nothing about leases itself: inside its own critical section
(a file lock, a SQLite transaction) it reads the current document and calls
`grant` (to take the run) or `fence` (before any write), which raise when the
caller may not proceed.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from pydantic import ValidationError

from idempotency_gateway_client._exceptions import (
    IncompatibleJournal,
    JournalCorrupt,
    RunLeased,
    RunLeaseLost,
)
from idempotency_gateway_client._records import JOURNAL_FORMAT, JournalDocument, RunLease

__all__ = [
    "JournalStore",
    "Worker",
    "check_compatible",
    "fence",
    "grant",
    "parse_document",
    "process_exists",
    "released",
    "renewed",
]


@dataclass(frozen=True)
class Worker:
    """Who asks for a run's lease: a name for messages, and the process that holds it.

    >>> Worker.current().name
    'build-host:4242'
    """

    name: str
    host: str
    pid: int

    @classmethod
    def current(cls, name: str | None = None) -> Worker:
        """This process; `name` defaults to `host:pid`."""
        host, pid = socket.gethostname(), os.getpid()
        return cls(name=name or f"{host}:{pid}", host=host, pid=pid)


class JournalStore(Protocol):
    """Durable storage for run journals, shared by every worker that may run a run.

    An implementation must guarantee:

    - `write` is atomic and durable when it returns: after a crash, the store
      holds the previous document or the new one, never a mix, never neither;
    - `acquire`, `write` and `release` each read the current document and
      apply `grant` or `fence` to it in the same critical section as their
      write, so no two workers can both pass the check;
    - `acquire` refuses with `RunLeased` while another live worker holds the
      run, refuses with `IncompatibleJournal` a run of another flow version,
      and otherwise grants a fencing token larger than any granted before.
    """

    def load(self, run_id: str) -> JournalDocument | None:
        """The run's document as last written, or None when the run was never started."""
        ...

    def acquire(
        self, run_id: str, flow_version: str, worker: Worker, *, duration: float
    ) -> JournalDocument:
        """Take the run's lease for `duration` seconds (creating the run when it is new)."""
        ...

    def write(self, document: JournalDocument, *, duration: float) -> JournalDocument:
        """Store `document` if its lease is still current, renewing it; return what was stored."""
        ...

    def release(self, document: JournalDocument) -> None:
        """Let the lease expire now (the token is kept, so the next grant is larger)."""
        ...


def iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def parse_document(raw: bytes, where: str) -> JournalDocument:
    """Read a stored journal, telling a foreign format from a damaged file."""
    try:
        data = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise JournalCorrupt(f"{where}: not a JSON journal: {exc}") from exc
    if not isinstance(data, dict):
        raise JournalCorrupt(f"{where}: not a JSON journal object")
    if data.get("format") != JOURNAL_FORMAT:
        raise IncompatibleJournal(
            f"{where}: journal format {data.get('format')!r}; this client reads format "
            f"{JOURNAL_FORMAT}"
        )
    try:
        return JournalDocument.model_validate(data)
    except ValidationError as exc:
        raise JournalCorrupt(f"{where}: invalid journal: {exc}") from exc


def check_compatible(document: JournalDocument, run_id: str, flow_version: str) -> None:
    """Refuse a journal of another run or another flow version, before touching it."""
    if document.run_id != run_id:
        raise IncompatibleJournal(
            f"this journal holds run {document.run_id!r}, not {run_id!r}; "
            "use one journal (file or row) per run"
        )
    if document.flow_version != flow_version:
        raise IncompatibleJournal(
            f"run {run_id!r} was written by flow version {document.flow_version!r}; this "
            f"worker runs flow version {flow_version!r} and will not resume it. Resume it "
            f"with flow version {document.flow_version!r}, or start a new run"
        )


def grant(
    existing: JournalDocument | None,
    run_id: str,
    flow_version: str,
    worker: Worker,
    *,
    now: float,
    duration: float,
) -> JournalDocument:
    """The document with `worker` holding the run, or `RunLeased` naming the live holder."""
    if existing is None:
        existing = JournalDocument(run_id=run_id, flow_version=flow_version, created_at=now)
    check_compatible(existing, run_id, flow_version)
    current = existing.lease
    if current is not None and _is_live(current, now):
        raise RunLeased(
            f"run {run_id!r} is held by worker {current.holder!r} (pid {current.pid} on "
            f"{current.host}, fencing token {current.token}) until {iso(current.expires_at)}; "
            "only one worker may advance a run. Wait for it to finish or for its lease to expire",
            holder=current.holder,
            token=current.token,
            expires_at=current.expires_at,
        )
    lease = RunLease(
        holder=worker.name,
        token=(current.token if current is not None else 0) + 1,
        expires_at=now + duration,
        host=worker.host,
        pid=worker.pid,
    )
    return existing.model_copy(update={"lease": lease})


def fence(current: JournalDocument | None, mine: JournalDocument) -> None:
    """Raise `RunLeaseLost` unless the stored lease is still the writer's (holder and token)."""
    ours = mine.lease
    if ours is None:
        raise RunLeaseLost(f"run {mine.run_id!r}: a write without a lease", holder=None, token=None)
    stored = current.lease if current is not None else None
    if stored is None or stored.holder != ours.holder or stored.token != ours.token:
        raise RunLeaseLost(
            f"run {mine.run_id!r} was taken over by worker "
            f"{stored.holder if stored else None!r} (fencing token "
            f"{stored.token if stored else None}); this worker ({ours.holder!r}, token "
            f"{ours.token}) must stop",
            holder=stored.holder if stored else None,
            token=stored.token if stored else None,
        )


def renewed(document: JournalDocument, *, now: float, duration: float) -> JournalDocument:
    """The document with its lease extended to `now + duration`."""
    assert document.lease is not None
    lease = document.lease.model_copy(update={"expires_at": now + duration})
    return document.model_copy(update={"lease": lease})


def released(document: JournalDocument) -> JournalDocument:
    """The document with its lease expired (holder and token kept for the record)."""
    assert document.lease is not None
    lease = document.lease.model_copy(update={"expires_at": 0.0})
    return document.model_copy(update={"lease": lease})


def _is_live(lease: RunLease, now: float) -> bool:
    """Unexpired, and not held by a process of this host that no longer exists.

    A worker killed with `kill -9` cannot release its lease; on its own host
    its death is certain (no such pid), so a restart need not wait out the
    lease. A holder on another host is trusted until its lease expires.
    """
    if lease.expires_at <= now:
        return False
    if lease.host != socket.gethostname() or lease.pid == os.getpid():
        return True
    return process_exists(lease.pid)


def process_exists(pid: int) -> bool:
    """Whether a process with this pid is alive on this host (one of another user counts).

    A worker killed while its parent does not reap it (a shell script, a supervisor
    that waits later) stays a zombie: its pid answers signals, but it runs no code
    and holds nothing. It is dead here, or a restart would wait out the whole lease.
    """
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user: alive, unless a zombie
    except (OverflowError, ValueError):
        return False  # no process has such a pid
    return not _exited(pid)


def _exited(pid: int) -> bool:
    """Whether the pid is a process that has exited and not been reaped (Linux `/proc`:
    state `Z` or `X`); False where there is no `/proc` to tell."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            fields = stat.read().rpartition(b")")[2].split()
    except OSError:
        return False
    return bool(fields) and fields[0] in (b"Z", b"X")
