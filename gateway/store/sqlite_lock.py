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

__all__ = ["DatabaseFileInUse", "forget_database_file", "lock_database_file"]

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


def forget_database_file(handle: IO[bytes]) -> None:
    """Stop counting the file as held by this process (before closing `handle`)."""
    _held.discard(_identity(os.fstat(handle.fileno())))


def _identity(stat: os.stat_result) -> tuple[int, int]:
    return stat.st_dev, stat.st_ino
