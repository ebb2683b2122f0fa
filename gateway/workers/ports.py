"""The gateway's ports, held by the supervisor so every worker can listen on them.

The supervisor binds each address with SO_REUSEPORT and never listens on it:
the kernel hands connections only to listening sockets, so all of them go to
the workers, which bind the same address with SO_REUSEPORT and listen. Holding
the bound socket resolves port 0 to one real port for every worker, and keeps
the port this gateway's while a dead worker is restarted: while any worker
listens, a program that does not set SO_REUSEPORT (a single-process gateway
among them) is refused the port. (Before the first worker listens, or with
every worker dead at once, such a program could still take it.)
"""

from __future__ import annotations

import socket


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to (host, port) with SO_REUSEPORT, not listening; OSError if taken."""
    family, kind, protocol, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, kind, protocol)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(address)
    except BaseException:
        sock.close()
        raise
    return sock


def bound_port(sock: socket.socket) -> int:
    return int(sock.getsockname()[1])
