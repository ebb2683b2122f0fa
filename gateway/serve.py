"""Run the gateway until SIGTERM or SIGINT, then drain.

`web.run_app` would do, but it announces the configured port, not the one
the OS chose for port 0, and tests and supervisors need the real address.
On a signal the listener closes first (no new requests), then upstream calls
in progress finish and their receipts are recorded before the store closes.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from aiohttp import web

from gateway.app import create_app
from gateway.config import Settings
from gateway.errors import GatewayError
from gateway.logs import configure_logging

log = logging.getLogger("gateway.serve")


def _use_uvloop() -> None:
    try:
        import uvloop  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        return
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())


async def serve(settings: Settings) -> None:
    """Serve until a termination signal arrives."""
    app = create_app(settings)
    runner = web.AppRunner(app, access_log=None, handler_cancellation=False)
    await runner.setup()
    site = web.TCPSite(runner, settings.server.host, settings.server.port, reuse_address=True)
    await site.start()
    for address in runner.addresses:
        host, port = address[0], address[1]
        print(f"idempotency gateway listening on http://{host}:{port}", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
        log.info("shutting down: draining in-flight requests")
    finally:
        await runner.cleanup()


def run(settings: Settings) -> int:
    configure_logging(settings.logging)
    _use_uvloop()
    try:
        asyncio.run(serve(settings))
    except GatewayError as exc:
        print(f"idempotency-gateway: cannot start: {exc.detail}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"idempotency-gateway: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
