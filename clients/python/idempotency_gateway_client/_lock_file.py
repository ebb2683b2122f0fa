"""The journal lock: a short critical section shared by Python and Node writers.

Neither language has a lock the other can see without native code (Node has
no `flock`), so the lock is a file both can make atomically: a record
`{"host", "pid", "nonce", "at"}` written to a temporary file, then hard-linked
to `<journal>.lock`. `link` fails when the lock exists, so exactly one writer
holds it, and it appears with its whole record or not at all. The holder
unlinks it when its read-check-write is done (milliseconds).

A writer killed inside the section leaves the lock behind. It is stale when its
holder is a process of this host that no longer exists, or when it holds no
lock record at all (an empty `.lock` left by client 0.1's `flock`); a waiter
breaks a stale lock by renaming it aside and checking that what it moved is the
record it judged (if a newer writer's lock was moved instead, it is linked
back). A holder on another host is never judged dead: the waiter gives up after
`timeout` naming it. The run's lease and fencing token, checked inside the
section, stay the guard against a worker that outlives its turn.

The TypeScript client (`clients/typescript/src/lock-file.ts`) follows the same
protocol; `docs/journal.md` writes it down.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idempotency_gateway_client._exceptions import JournalError

__all__ = ["LockFile"]

_POLL_SECONDS = 0.01


class LockFile:
    """`<journal>.lock`, held for one read-check-write at a time."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        nonce = self._acquire()
        try:
            yield
        finally:
            self._release(nonce)

    def _acquire(self) -> str:
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "nonce": secrets.token_hex(8),
            "at": time.time(),
        }
        staging = self.path.with_name(f".{self.path.name}.{record['nonce']}")
        staging.write_text(json.dumps(record))
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                try:
                    os.link(staging, self.path)
                    return str(record["nonce"])
                except FileExistsError:
                    pass
                held = _read(self.path)
                if held is None:
                    continue  # released between our link and our read
                raw, holder = held
                if _is_stale(holder):
                    self._break_stale(raw, str(record["nonce"]))
                    continue
                if time.monotonic() > deadline:
                    raise JournalError(
                        f"{self.path} stayed locked for {self.timeout} s by {_describe(holder)}; "
                        "is a worker stopped (SIGSTOP) in the middle of a write? If that process "
                        "is gone, delete the file"
                    )
                time.sleep(_POLL_SECONDS)
        finally:
            staging.unlink(missing_ok=True)

    def _release(self, nonce: str) -> None:
        held = _read(self.path)
        if held is not None and held[1] is not None and held[1].get("nonce") == nonce:
            self.path.unlink(missing_ok=True)

    def _break_stale(self, judged: str, nonce: str) -> None:
        aside = self.path.with_name(f"{self.path.name}.stale-{nonce}")
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return  # someone else broke or released it
        try:
            moved: str | None = aside.read_text()
        except OSError:
            moved = None
        if moved != judged:
            # A newer writer's lock was moved, not the stale one: put it back.
            with contextlib.suppress(OSError):
                os.link(aside, self.path)
        aside.unlink(missing_ok=True)


def _read(path: Path) -> tuple[str, dict[str, Any] | None] | None:
    try:
        raw = path.read_text()
    except FileNotFoundError:
        return None
    return raw, _record(raw)


def _record(raw: str) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(value, dict):
        return None
    typed = (
        isinstance(value.get("host"), str)
        and isinstance(value.get("pid"), int)
        and isinstance(value.get("nonce"), str)
        and isinstance(value.get("at"), int | float)
    )
    return value if typed else None


def _is_stale(holder: dict[str, Any] | None) -> bool:
    if holder is None:
        return True
    if holder["host"] != socket.gethostname() or holder["pid"] == os.getpid():
        return False
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # a process of another user: alive
    return False


def _describe(holder: dict[str, Any] | None) -> str:
    return "an unreadable lock" if holder is None else f"pid {holder['pid']} on {holder['host']}"
