"""What a test can see of a gateway's worker processes, from /proc: who they are, and
which of them holds which connection."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path


def worker_pids(supervisor_pid: int) -> list[int]:
    """The supervisor's children, i.e. its workers, in start order."""
    children = Path(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children").read_text()
    return sorted(int(pid) for pid in children.split())


async def wait_for_workers(
    supervisor_pid: int, count: int, *, besides: set[int] = frozenset(), seconds: float = 15.0
) -> list[int]:
    """Wait until `count` workers run, none of them in `besides` (dead or replaced ones)."""
    async with asyncio.timeout(seconds):
        while True:
            pids = [pid for pid in worker_pids(supervisor_pid) if pid not in besides]
            if len(pids) == count:
                return pids
            await asyncio.sleep(0.05)


async def wait_until_exited(pids: list[int], *, seconds: float) -> None:
    async with asyncio.timeout(seconds):
        while True:
            if not any(is_running(pid) for pid in pids):
                return
            await asyncio.sleep(0.05)


def is_running(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def connections(pid: int, *, local_port: int | None = None, remote_port: int | None = None) -> int:
    """How many established TCP connections process `pid` holds with that local or remote port."""
    return sum(
        1
        for local, remote in _established(pid)
        if (local_port is None or local == local_port)
        and (remote_port is None or remote == remote_port)
    )


def holder(pids: list[int], *, local_port: int, remote_port: int) -> int | None:
    """Which of `pids` holds the established connection from `remote_port` to `local_port`."""
    for pid in pids:
        if (local_port, remote_port) in set(_established(pid)):
            return pid
    return None


def listening_ports(pid: int) -> list[int]:
    """The TCP ports process `pid` listens on ([] once it is gone): a worker serves once
    it has one, before its supervisor announces the gateway."""
    try:
        return sorted({local for local, _ in _sockets(pid, state="0A")})  # 0A: LISTEN
    except OSError:  # it died while being read
        return []


def _established(pid: int) -> Iterator[tuple[int, int]]:
    """(local port, remote port) of each established TCP connection process `pid` holds."""
    return _sockets(pid, state="01")  # 01: ESTABLISHED


def _sockets(pid: int, *, state: str) -> Iterator[tuple[int, int]]:
    """(local port, remote port) of each TCP socket in `state` that process `pid` holds."""
    inodes = _socket_inodes(pid)
    for table in ("tcp", "tcp6"):
        path = Path(f"/proc/{pid}/net/{table}")
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, found, inode = fields[1], fields[2], fields[3], fields[9]
            if found == state and inode in inodes:
                yield int(local.rsplit(":", 1)[1], 16), int(remote.rsplit(":", 1)[1], 16)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    return inodes
