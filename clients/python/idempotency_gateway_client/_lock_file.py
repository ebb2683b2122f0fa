"""The journal lock: a short critical section shared by Python and Node writers.

Neither language has a lock the other can see without native code (Node has
no `flock`), so the lock is made of files both can create atomically. It has
generations: the writer holding the lock holds the file `<journal>.lock.<n>`
with the highest `n`, a record `{"host", "pid", "nonce", "at"}` hard-linked
into place from a fully written temporary file (so it appears whole or not at
all, and `link` refuses a name that exists). No such file: the lock is free.

- To take the lock, a writer links its record to generation `top + 1`, where
  `top` is the highest generation it sees, once `top` is free: none, or
  held by a dead holder. `link` lets one writer win each generation. The
  winner then checks that no higher generation exists (a writer that looked
  long ago may have linked a low one); if one does, it withdraws. Then it
  removes the older generations.
- To release, the holder unlinks its own generation.
- A holder is dead when it is a process of this host that no longer exists,
  or a process of this one that holds no such grant, or when its file holds
  no lock record. A dead holder's generation is never renamed or removed
  before a newer one exists, and names grow, so a writer never mistakes a
  live lock for the stale one it judged (the trap of breaking stale lock
  files by rename or unlink). A holder on another host is never judged dead:
  after `timeout` the waiter gives up, naming it.

The critical section is one read-check-write of the journal (milliseconds);
the run's lease and fencing token, checked inside it, stay the guard against
a worker that outlives its turn. Writers that share a journal on one host name
must share one process-id namespace (not two containers with one hostname),
or each judges the other's pids dead; the run lease makes the same
assumption. `clients/typescript/src/lock-file.ts` is the same protocol, and
`docs/journal.md` writes it down.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from idempotency_gateway_client._exceptions import JournalError

__all__ = ["LockFile"]

_POLL_SECONDS = 0.01

_HELD: set[str] = set()
"""Nonces of the grants this process holds now: a record of this pid with another nonce is
left over from an earlier grant of this process, and dead."""


class LockFile:
    """`<journal>.lock.<n>`: held for one read-check-write at a time."""

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._generation = re.compile(re.escape(path.name) + r"\.([1-9][0-9]{0,14})")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        generation, nonce = self._acquire()
        try:
            yield
        finally:
            _HELD.discard(nonce)
            self._file(generation).unlink(missing_ok=True)

    def generations(self) -> list[int]:
        """The generations on disk, lowest first."""
        found = []
        for entry in os.listdir(self.path.parent):
            match = self._generation.fullmatch(entry)
            if match is not None:
                found.append(int(match.group(1)))
        return sorted(found)

    def _file(self, generation: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{generation}")

    def _acquire(self) -> tuple[int, str]:
        nonce = secrets.token_hex(8)
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "nonce": nonce,
            "at": time.time(),
        }
        staging = self.path.with_name(f".{self.path.name}.{os.getpid()}.{nonce}")
        staging.write_text(json.dumps(record))
        deadline = time.monotonic() + self.timeout
        _HELD.add(nonce)  # before the link: a record of ours is never judged dead by us
        try:
            while True:
                seen = self.generations()
                top = seen[-1] if seen else 0
                holder = _read(self._file(top)) if top else None
                if top and holder is None:
                    continue  # released between the listing and the read
                if not top or _is_dead(holder):
                    mine = top + 1
                    try:
                        os.link(staging, self._file(mine))
                    except FileExistsError:
                        continue  # another writer won this generation
                    if any(generation > mine for generation in self.generations()):
                        self._file(mine).unlink(missing_ok=True)  # we looked too long ago
                        continue
                    for older in seen:
                        self._file(older).unlink(missing_ok=True)
                    return mine, nonce
                if time.monotonic() > deadline:
                    raise JournalError(
                        f"{self._file(top)} stayed locked for {self.timeout} s by "
                        f"{_describe(holder)}; is a worker stopped (SIGSTOP) in the middle "
                        "of a write? If that process is gone, delete the file"
                    )
                time.sleep(_POLL_SECONDS)
        except BaseException:
            _HELD.discard(nonce)
            raise
        finally:
            staging.unlink(missing_ok=True)


_NO_RECORD: dict[str, Any] = {}
"""What `_read` gives for a file that holds no lock record (its holder is dead)."""


def _read(path: Path) -> dict[str, Any] | None:
    """The lock record in `path`; `_NO_RECORD` when it holds none; None when there is no file."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    try:
        value = json.loads(raw.decode("utf-8"))
    except ValueError:  # not UTF-8, or not JSON
        return _NO_RECORD
    if not isinstance(value, dict):
        return _NO_RECORD
    pid = value.get("pid")
    if isinstance(pid, float) and pid.is_integer():
        pid = int(pid)  # JSON has one number type: 42.0 is 42, as in JavaScript
    typed = (
        isinstance(value.get("host"), str)
        and isinstance(pid, int)
        and not isinstance(pid, bool)
        and 0 < pid < 2**31
        and isinstance(value.get("nonce"), str)
        and isinstance(value.get("at"), int | float)
        and not isinstance(value.get("at"), bool)
    )
    return {**value, "pid": pid} if typed else _NO_RECORD


def _is_dead(holder: dict[str, Any] | None) -> bool:
    if not holder:
        return True
    if holder["host"] != socket.gethostname():
        return False
    if holder["pid"] == os.getpid():
        return holder["nonce"] not in _HELD
    try:
        os.kill(holder["pid"], 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # a process of another user: alive
    return False


def _describe(holder: dict[str, Any] | None) -> str:
    return "an unreadable lock" if not holder else f"pid {holder['pid']} on {holder['host']}"
