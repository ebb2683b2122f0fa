"""The journal lock: a short critical section shared by Python and Node writers.

Neither language has a lock the other can see without native code (Node has
no `flock`), so the lock is made of files both can create atomically. It has
generations, `<lock>.<n>`, each a record `{"host", "pid", "nonce", "at"}`
hard-linked into place from a fully written staging file
`<lock>-staging.<pid>.<nonce>` (so it appears whole or not at all, and `link`
refuses a name that exists). The highest generation decides: the lock is free
when there is none, when it is released (a marker `<lock>.<n>.released` beside
it), or when its holder is dead; otherwise its holder holds the lock. A
`FileJournal`'s lock is `.<journal>.lock`, hidden beside the journal, so its
files are too. The three kinds of name end differently (a number of at most
15 digits; `released`; a nonce of 16 hex digits), and staging files have a
stem of their own: none is taken for another, whatever the journal's name.

- To take the lock, a writer links its record to `top + 1` once the highest
  generation `top` is free. `link` lets one writer win each generation. The
  winner then checks that no higher generation exists (a writer that looked
  long ago may have linked a low one); if one does, it withdraws. Then it
  removes the older generations.
- To release, the holder creates its generation's `.released` marker. It
  never removes its own file: the highest generation is never removed, so
  numbers only grow and no name is reused, and a verdict about generation
  `n` ("released", "dead") can never be taken for one about a newer holder
  of the same name.
- A holder is dead when it is a process of this host that no longer exists,
  or when its file holds no lock record. A holder on another host, or this
  very process (another thread), is never judged dead: after `timeout` the
  waiter gives up, naming it.

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
from idempotency_gateway_client._journal import process_exists

__all__ = ["LockFile"]

_POLL_SECONDS = 0.01
_STAGING_SECONDS = 600.0
"""A staging file this old, of a pid that is not alive here, is a crashed writer's leftover."""


class LockFile:
    """The generations `<path>.<n>`: held for one read-check-write at a time.

    `path` names the lock, not a file: `.<journal>.lock` for a `FileJournal`.
    """

    def __init__(self, path: Path, timeout: float) -> None:
        self.path = path
        self.timeout = timeout
        self._generation = re.compile(re.escape(path.name) + r"\.([1-9][0-9]{0,14})")
        self._staging = re.compile(re.escape(path.name) + r"-staging\.([0-9]+)\.[^.]+")

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        generation = self._acquire()
        try:
            yield
        finally:
            self._release(generation)

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

    def _marker(self, generation: int) -> Path:
        return self.path.with_name(f"{self.path.name}.{generation}.released")

    def _acquire(self) -> int:
        nonce = secrets.token_hex(8)
        record = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "nonce": nonce,
            "at": time.time(),
        }
        staging = self.path.with_name(f"{self.path.name}-staging.{os.getpid()}.{nonce}")
        staging.write_text(json.dumps(record))
        deadline = time.monotonic() + self.timeout
        try:
            while True:
                seen = self.generations()
                top = seen[-1] if seen else 0
                holder = None if not top or self._marker(top).exists() else _read(self._file(top))
                if holder is None or _is_dead(holder):
                    mine = top + 1
                    try:
                        os.link(staging, self._file(mine))
                    except FileExistsError:
                        continue  # another writer won this generation
                    try:
                        if any(generation > mine for generation in self.generations()):
                            self._file(mine).unlink(missing_ok=True)  # we looked too long ago
                            continue
                        self._clean(seen)
                    except BaseException:
                        self._release(mine)  # never leave a live-looking grant nobody holds
                        raise
                    return mine
                if time.monotonic() > deadline:
                    raise JournalError(
                        f"{self._file(top)} stayed locked for {self.timeout} s by "
                        f"{_describe(holder)}; is that worker stopped (SIGSTOP) or stuck in a "
                        f"write? If it is gone, mark the lock released: touch {self._marker(top)} "
                        "(never delete the file: generation numbers must only grow)"
                    )
                time.sleep(_POLL_SECONDS)
        finally:
            staging.unlink(missing_ok=True)

    def _release(self, generation: int) -> None:
        if not self._file(generation).exists():
            return  # a newer generation's winner removed it: nothing is held
        with contextlib.suppress(FileExistsError):
            self._marker(generation).touch(exist_ok=False)

    def _clean(self, older: list[int]) -> None:
        """Remove older generations, their markers, and staging files of dead writers."""
        for generation in older:
            # The marker first: a crash between leaves an old file without one, never a
            # marker that could make a later holder of that number look released.
            self._marker(generation).unlink(missing_ok=True)
            self._file(generation).unlink(missing_ok=True)
        stale_before = time.time() - _STAGING_SECONDS
        for entry in os.listdir(self.path.parent):
            match = self._staging.fullmatch(entry)
            if match is None or process_exists(int(match.group(1))):
                continue
            staging = self.path.with_name(entry)
            # A staging name has no host: a writer on another host may share this pid
            # number, so only files older than any wait are taken for leftovers.
            with contextlib.suppress(FileNotFoundError):
                if staging.stat().st_mtime < stale_before:
                    staging.unlink(missing_ok=True)


_NO_RECORD: dict[str, Any] = {}
"""What `_read` gives for a file that holds no lock record (its holder is dead)."""


def _read(path: Path) -> dict[str, Any]:
    """The lock record in `path`; `_NO_RECORD` when it holds none (or is gone: a winner
    removed it, so a newer generation exists, and the next look finds it)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return _NO_RECORD
    try:
        value = json.loads(raw.decode("utf-8"), parse_constant=_no_constant)
    except (ValueError, RecursionError):  # not UTF-8 (a BOM included), not JSON, NaN, too deep
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


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _is_dead(holder: dict[str, Any]) -> bool:
    if not holder:
        return True
    if holder["host"] != socket.gethostname() or holder["pid"] == os.getpid():
        return False
    return not process_exists(holder["pid"])


def _describe(holder: dict[str, Any] | None) -> str:
    return "an unreadable lock" if not holder else f"pid {holder['pid']} on {holder['host']}"
