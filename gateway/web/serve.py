"""Run the gateway until SIGTERM or SIGINT, then drain.

`web.run_app` would do, but it announces the configured port, not the one
the OS chose for port 0, and tests and supervisors need the real address.
On a signal the listener closes first (no new requests), then upstream calls
in progress finish and their receipts are recorded before the store closes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
from pathlib import Path

from aiohttp import web

from gateway.config import Settings
from gateway.engine.errors import GatewayError
from gateway.web.app import SHUTDOWN_GRACE, create_app
from gateway.web.hardening import protect_secrets
from gateway.web.listeners import LISTENERS
from gateway.web.logs import configure_logging
from gateway.web.process import announce, listening_url, wait_for_termination
from gateway.workers.channel import WorkerChannel
from gateway.workers.role import RunningWorker, WorkerRole
from gateway.workers.supervisor import WorkersFailed, supervise

log = logging.getLogger("gateway.serve")


def use_event_loop(choice: str) -> str:
    """Install the event loop `[server] loop` names; return the one installed.

    uvloop is a dependency of the gateway where it installs (Linux, macOS); where it
    does not (Windows), "uvloop" falls back to asyncio's own loop, said at start."""
    if choice == "uvloop":
        try:
            import uvloop  # type: ignore[import-not-found, unused-ignore]
        except ImportError:
            log.warning("uvloop is not installed here: serving on asyncio's own event loop")
            return "asyncio"
        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
        return "uvloop"
    asyncio.set_event_loop_policy(None)
    return "asyncio"


GC_YOUNG_THRESHOLD = 50_000
"""Net new container objects between two young-generation collections (CPython's default: 700).

With 64 requests in flight about 10,000 young objects are alive at any moment,
so the default threshold ran a collection every millisecond or so that freed
next to nothing: reference counting frees a request's objects. Measured on
the miss path at c=64 with the defaults: 783 young, 71 middle and 7 full
collections in 7 s, about 70 us of CPU per request, and each full collection
stopped the loop for about 30 ms. With this threshold no collection ran in
35,000 requests, and the young generation stayed near 10,600 objects. Cycles,
if any appear, are still collected, every 50,000 new objects.
"""


def tune_garbage_collector() -> None:
    """Freeze what start-up built and collect the young generation rarely.

    Modules, settings, the app and its routes live as long as the process:
    `gc.freeze()` moves them out of every future collection, so a full
    collection scans only what requests left behind.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(GC_YOUNG_THRESHOLD, middle, old)


def make_runner(
    app: web.Application, settings: Settings, *, shutdown_timeout: float = SHUTDOWN_GRACE
) -> web.AppRunner:
    """The runner production and tests share: parser limits from `[server]`."""
    return web.AppRunner(
        app,
        access_log=None,
        handler_cancellation=False,
        max_line_size=settings.server.max_header_size,
        max_field_size=settings.server.max_header_size,
        max_headers=settings.server.max_headers,
        shutdown_timeout=shutdown_timeout,
        # A proxy forwards bodies as sent: never inflate a Content-Encoding.
        auto_decompress=False,
    )


async def start_sites(
    runner: web.AppRunner, settings: Settings, *, reuse_port: bool = False
) -> list[str]:
    """Listen on the main address (and the admin one, when the admin API is enabled);
    return their URLs, the main one first. `reuse_port`: as one of a gateway's
    workers, on ports the supervisor holds (`gateway.workers.ports`)."""
    server, admin_settings = settings.server, settings.admin
    main = web.TCPSite(
        runner, server.host, server.port, reuse_address=True, reuse_port=reuse_port or None
    )
    await main.start()
    urls = [_url(runner.addresses[-1])]
    if admin_settings.enabled:
        admin = web.TCPSite(
            runner,
            admin_settings.host,
            admin_settings.port,
            reuse_address=True,
            reuse_port=reuse_port or None,
        )
        await admin.start()
        address = runner.addresses[-1]
        runner.app[LISTENERS].admin_address = (str(address[0]), int(address[1]))
        urls.append(_url(address))
    return urls


def _url(address: object) -> str:
    host, port = address[0], address[1]  # type: ignore[index]
    return listening_url(str(host), int(port))


async def serve(settings: Settings, *, worker: WorkerRole | None = None) -> None:
    """Serve until a termination signal arrives (`worker`: as one of a gateway's workers,
    which reports to its supervisor instead of announcing the address)."""
    running = None
    if worker is not None:
        running = RunningWorker(worker, WorkerChannel(worker.channel_descriptor))
    runner = make_runner(create_app(settings, worker=running), settings)
    try:
        await runner.setup()
        urls = await start_sites(runner, settings, reuse_port=running is not None)
        tune_garbage_collector()
        if running is not None:
            running.channel.ready()
        else:
            announce(urls)
        await wait_for_termination()
        log.info("shutting down: draining in-flight requests")
    finally:
        await runner.cleanup()
        if running is not None:
            running.channel.close()


def run(
    settings: Settings, *, worker: WorkerRole | None = None, config_file: Path | None = None
) -> int:
    """Serve in this process, or as a supervisor of `[server] workers` processes."""
    configure_logging(settings.logging)
    protect_secrets(settings, config_file)
    loop = use_event_loop(settings.server.loop)
    log.info("event loop: %s", loop, extra={"event": "event_loop", "loop": loop})
    try:
        if worker is None and settings.server.workers > 1:
            asyncio.run(supervise(settings))
        else:
            asyncio.run(serve(settings, worker=worker))
    except (GatewayError, WorkersFailed) as exc:
        detail = exc.internal or exc.detail if isinstance(exc, GatewayError) else str(exc)
        print(f"idempotency-gateway: cannot start: {detail}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"idempotency-gateway: cannot listen: {exc}", file=sys.stderr)
        return 1
    return 0
