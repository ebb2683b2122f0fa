"""The one-process lock of a SQLite store, held on the database file itself.

An `flock` on the database file locks its inode, so it holds by whatever path
a second gateway names the file: the path itself, a symbolic link or a hard
link. (A lock file next to the path, `<db>.lock`, did not: a link in another
directory has its own.) On Linux, flock and the POSIX (fcntl) locks SQLite
takes on the same file do not interact.

One POSIX rule shapes the rest: closing *any* descriptor of a file drops every
POSIX lock the process holds on that file, SQLite's included. So the lock's
descriptor is closed only after the store's SQLite connections are, and a
second open of a file this process already holds is refused by its identity
(device and inode), without opening it: opening and closing a descriptor there
would silently drop the first store's SQLite locks.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO, TYPE_CHECKING

if TYPE_CHECKING:
    from pathlib import Path

__all__ = [
    "DatabaseFileInUse",
    "adopt_database_lock",
    "forget_database_file",
    "lock_database_file",
]

_held: set[tuple[int, int]] = set()
"""(device, inode) of every database file a store in this process holds."""


class DatabaseFileInUse(Exception):
    """Another store, in this process or another, holds the database file's lock."""


def lock_database_file(path: Path) -> IO[bytes]:
    """Hold an exclusive flock on the file at `path`, creating it (mode 0600) if missing.

    An empty file is a valid new SQLite database. Returns the open file, whose
    descriptor carries the lock: keep it open until the store's SQLite
    connections are closed, then pass it to `forget_database_file` and close
    it. Raises `DatabaseFileInUse` when the file is held, `OSError` when it
    cannot be opened.
    """
    try:
        if _identity(os.stat(path)) in _held:
            raise DatabaseFileInUse(str(path))
    except FileNotFoundError:
        pass
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    handle = os.fdopen(descriptor, "r+b", buffering=0)
    try:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        _held.add(_identity(os.fstat(handle.fileno())))
    except BlockingIOError as exc:
        # Held by another process: this one holds no lock on the file to drop.
        handle.close()
        raise DatabaseFileInUse(str(path)) from exc
    except BaseException:
        handle.close()
        raise
    return handle


def adopt_database_lock(path: Path, descriptor: int) -> None:
    """Check that `descriptor`, inherited from a supervisor, holds the lock on the file at `path`.

    A gateway with worker processes holds one lock for all of them: the
    supervisor takes it (`lock_database_file`) and each worker inherits the
    descriptor, which shares the supervisor's open file description, and with
    it the lock. Locking it again is therefore granted at once, and only to
    the gateway that holds it: any other open of the file is refused. The
    worker never unlocks or closes it (unlocking would free the file for a
    second gateway while the other workers still write it).

    Raises `DatabaseFileInUse` when the descriptor does not hold the lock, and
    `OSError` when it is not the database file at `path`.
    """
    if _identity(os.fstat(descriptor)) != _identity(os.stat(path)):
        raise OSError(f"the inherited lock descriptor {descriptor} is not the file {path}")
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError as exc:
        raise DatabaseFileInUse(str(path)) from exc


def forget_database_file(handle: IO[bytes]) -> None:
    """Stop counting the file as held by this process (before closing `handle`)."""
    _held.discard(_identity(os.fstat(handle.fileno())))


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino
