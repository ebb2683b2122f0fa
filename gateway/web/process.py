"""What a gateway process does the same way whether it serves or supervises workers:
say where it listens, and wait for the signal to stop."""

from __future__ import annotations

import asyncio
import signal


def listening_url(host: str, port: int) -> str:
    """`http://host:port`, with an IPv6 host in brackets."""
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def announce(urls: list[str]) -> None:
    """The lines tests, supervisors and operators read for the real address (port 0 is
    only known once listening): the main listener, then the admin one if any."""
    print(f"idempotency gateway listening on {urls[0]}", flush=True)
    if len(urls) > 1:
        print(f"idempotency gateway admin listening on {urls[1]}", flush=True)


async def wait_for_termination() -> None:
    """Return once SIGTERM or SIGINT arrives (the caller then drains)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
