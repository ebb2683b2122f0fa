"""`create_app(settings)`: wire the store, the forwarder, the engine and the handlers.

Everything with a lifetime (store connection, client sessions, lease
renewal) is set up and torn down in one `cleanup_ctx`, in dependency order.
On shutdown, engine tasks still running (their callers may be gone) are
awaited so their receipts are recorded before the store closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from aiohttp import web

from gateway import __version__
from gateway.config import Settings
from gateway.engine.checkpointer import Checkpointer
from gateway.engine.clock import SYSTEM_CLOCK
from gateway.engine.digests import Digests
from gateway.engine.engine import IdempotencyEngine
from gateway.engine.errors import StoreUnavailable
from gateway.engine.forwarded_key import ForwardedKeys
from gateway.engine.graces import GraceClock, start_witness
from gateway.engine.leases import LeaseKeeper
from gateway.engine.probes import Prober
from gateway.engine.quotas import ScopeQuotas
from gateway.engine.request_lines import RequestRecorder
from gateway.engine.scopes import ScopeResolver
from gateway.engine.sweeper import Sweeper
from gateway.mcp.cancellations import Cancellations
from gateway.mcp.derived_keys import DerivedKeys
from gateway.mcp.hints import ReadOnlyHints
from gateway.mcp.known_calls import KnownCalls
from gateway.mcp.probe import McpProbe
from gateway.mcp.reading import MessageReader
from gateway.mcp.sessions import SessionTags
from gateway.mcp.stdio_upstream import stdio_upstreams
from gateway.proxy.method_guard import method_guard_middleware
from gateway.proxy.routing import RouteTable
from gateway.store.base import Store
from gateway.store.factory import make_store
from gateway.store.rows import DERIVED_KEYS_KEYED_SINCE, SCOPES_NORMALISED_SINCE
from gateway.store.sqlite_connection import SharedDatabase
from gateway.telemetry.web import TRACER, open_tracer, tracing_middlewares
from gateway.upstream.forwarder import Forwarder
from gateway.upstream.spool import Spooler
from gateway.web.access_log import AccessLog, access_log_for
from gateway.web.admin_view import (
    attach_receipt,
    list_operations,
    operation_history,
    operation_requests,
    overview,
    probe_job,
    probe_operation,
    probe_route,
    redact_operation,
    resolve_operation,
    show_operation,
    verify_all,
    verify_operation,
)
from gateway.web.appkeys import (
    BACKGROUND,
    ENGINE,
    FORWARDER,
    MCP_CANCELLATIONS,
    MCP_DERIVED_KEYS,
    MCP_HINTS,
    MCP_KNOWN_CALLS,
    MCP_READER,
    MCP_SESSIONS,
    METRICS,
    OFFLOADER,
    PROBE_JOBS,
    QUOTAS,
    REQUESTS,
    ROUTES,
    SCOPES,
    SETTINGS,
    STDIO_UPSTREAMS,
    STORE,
    WORKER,
)
from gateway.web.background import in_background
from gateway.web.console_view import add_console_routes
from gateway.web.dispatch import proxy
from gateway.web.listeners import (
    LISTENERS,
    Listeners,
    admin_headers_middleware,
    listener_middleware,
)
from gateway.web.metrics import GatewayMetrics
from gateway.web.metrics_processes import SNAPSHOT_SECONDS, WorkerSnapshots
from gateway.web.offload import Offloader
from gateway.web.openapi import openapi_json
from gateway.web.operations_view import lookup, resolve
from gateway.web.probe_jobs import ProbeJobs
from gateway.web.probes_view import check_probe, show_probe, trust_probe
from gateway.web.problems import problem_middleware
from gateway.web.request_log import request_logging
from gateway.workers.role import RunningWorker

log = logging.getLogger("gateway.app")

_OPERATION_COUNT_TTL = 5.0
"""Seconds a state count is reused by /metrics: counting is a scan, scrapes are frequent."""

SHUTDOWN_GRACE = 60.0


def instance_id() -> str:
    """This process's lease-owner name: host, pid and a random suffix (pids get reused)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def create_app(settings: Settings, *, worker: RunningWorker | None = None) -> web.Application:
    """The gateway as an aiohttp application (`worker`: as one of a gateway's workers).

    >>> # web.run_app(create_app(load_settings("config/gateway.toml")))
    """
    access = access_log_for(settings.logging.level, settings.logging.format)
    app = web.Application(
        middlewares=[
            request_logging(access),
            # Only an enabled admin API has answers to mark; otherwise no layer per request.
            *([admin_headers_middleware] if settings.admin.enabled else []),
            # The server span, when tracing is on (docs/operations.md, "Tracing").
            *tracing_middlewares(),
            problem_middleware,
            method_guard_middleware,
            # Only an enabled admin API has a listener of its own to keep apart.
            *([listener_middleware] if settings.admin.enabled else []),
        ],
        client_max_size=1024**4,
    )
    app[LISTENERS] = Listeners()
    app[SETTINGS] = settings
    app[METRICS] = GatewayMetrics(version=__version__)
    app[ROUTES] = RouteTable(settings.routes)
    app[MCP_HINTS] = ReadOnlyHints()
    app[MCP_KNOWN_CALLS] = KnownCalls()
    app[MCP_CANCELLATIONS] = Cancellations(app[MCP_KNOWN_CALLS])
    app[OFFLOADER] = Offloader()
    app[MCP_READER] = MessageReader(app[OFFLOADER])
    app.on_cleanup.append(_close_reader)
    app[BACKGROUND] = set()
    if worker is not None:
        app[WORKER] = worker
    if access is not None:
        # First in, last out: the lines of every drained request are written.
        app.cleanup_ctx.append(functools.partial(_access_log, access))
    # A stdio route's upstream lives in this worker: its children, started at first use.
    app[STDIO_UPSTREAMS] = stdio_upstreams(settings.routes)
    app.cleanup_ctx.append(_services)

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/operations/{key:.+}", lookup)
    app.router.add_post("/operations/{key:.+}", resolve)
    add_console_routes(app)
    app.router.add_get("/admin/overview", overview)
    app.router.add_get("/admin/operations", list_operations)
    app.router.add_post("/admin/operations/probe", probe_route)
    app.router.add_get("/admin/operations/{id}", show_operation)
    app.router.add_get("/admin/operations/{id}/history", operation_history)
    app.router.add_get("/admin/operations/{id}/verify", verify_operation)
    app.router.add_post("/admin/operations/{id}/resolve", resolve_operation)
    app.router.add_post("/admin/operations/{id}/receipt", attach_receipt)
    app.router.add_get("/admin/operations/{id}/requests", operation_requests)
    app.router.add_post("/admin/operations/{id}/redact", redact_operation)
    app.router.add_post("/admin/operations/{id}/probe", probe_operation)
    app.router.add_get("/admin/probe-jobs/{route}", probe_job)
    app.router.add_get("/admin/probes/{route}", show_probe)
    app.router.add_post("/admin/probes/{route}/check", check_probe)
    app.router.add_post("/admin/probes/{route}/trust", trust_probe)
    app.router.add_get("/admin/verify", verify_all)
    app.router.add_get("/openapi.json", openapi_json)
    app.router.add_route("*", "/{tail:.*}", proxy)
    return app


async def _close_reader(app: web.Application) -> None:
    """The helper processes that read large MCP messages end with the app."""
    app[OFFLOADER].close()


async def _services(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    metrics = app[METRICS]
    worker = app.get(WORKER)
    store = make_store(settings.store, on_batch=metrics.commit, shared=_shared_database(worker))
    await store.open()
    # Open is a readiness check passed: with workers, the `ready` gauge is the least
    # over live workers, and a worker no probe or scrape has reached yet is ready.
    metrics.ready.set(1)
    publisher: asyncio.Task[None] | None = None
    if worker is not None:
        await _expire_dead_workers_claims(store, worker.role.dead_owners, metrics)
        metrics.share(WorkerSnapshots(Path(worker.role.metrics_directory)))
        app[MCP_KNOWN_CALLS].share(worker.channel)
        worker.channel.follow_workers()
        publisher = asyncio.create_task(_publish_metrics(metrics), name="metrics-snapshots")
    tracer = open_tracer()
    forwarder = Forwarder(
        settings.routes,
        tracer=tracer,
        tenant_routes=settings.tenant_routes,
        stdio=app[STDIO_UPSTREAMS],
    )
    await forwarder.start()
    graces = GraceClock(SYSTEM_CLOCK)
    keeper = LeaseKeeper(
        store,
        owner=instance_id() if worker is None else worker.role.owner,
        lease_seconds=settings.idempotency.lease,
        tombstone_seconds=settings.idempotency.tombstone_retention,
        graces=graces,
    )
    await keeper.start()
    scope_secret = await store.scope_secret()
    quotas = ScopeQuotas(settings.quotas, workers=settings.server.workers)
    engine = IdempotencyEngine(
        store=store,
        forwarder=forwarder,
        keeper=keeper,
        prober=Prober(forwarder, dialects={"mcp": McpProbe()}),
        forwarded_keys=ForwardedKeys(scope_secret),
        quotas=quotas,
        settings=settings.idempotency,
        routes=settings.routes,
        observer=tracer.observing(metrics),
        tracer=tracer,
        fault=settings.testing.fault,
        graces=graces,
        sight_observer=metrics,
        digests=Digests(scope_secret),
        spooler=Spooler(total=settings.server.max_spool_total, directory=settings.server.spool_dir),
    )
    engine.cross_process_signals = await store.subscribe(engine.notify_settled)
    witness = await start_witness(store, engine.graces)
    sweeper = Sweeper(store, engine, metrics, interval=settings.idempotency.sweep_interval)
    await sweeper.start()
    checkpointer = Checkpointer(store)
    await checkpointer.start()
    requests = app[REQUESTS] = RequestRecorder(store)
    await requests.start()
    app[STORE] = store
    app[FORWARDER] = forwarder
    app[ENGINE] = engine
    # A held-back cancellation is written by the worker that handles its call.
    app[MCP_KNOWN_CALLS].on_held_back(
        lambda ref: in_background(app, engine.cancellation_held(*ref))
    )
    app[QUOTAS] = quotas
    app[TRACER] = tracer
    normalised_since = await store.upgraded_since(SCOPES_NORMALISED_SINCE)
    app[SCOPES] = ScopeResolver(
        clients=settings.clients,
        scope_headers=settings.idempotency.scope_headers,
        shared_scope=settings.idempotency.shared_scope,
        secret=scope_secret,
        # Keys made before credentials were normalised live under the exact bytes' scope
        # until their receipts expire: looked up there too until then.
        legacy_until=(
            0.0 if normalised_since is None else normalised_since + settings.idempotency.retention
        ),
    )
    app[MCP_SESSIONS] = SessionTags(scope_secret)
    app[MCP_DERIVED_KEYS] = DerivedKeys(
        engine.digests, plain_since=await store.upgraded_since(DERIVED_KEYS_KEYED_SINCE)
    )
    app[PROBE_JOBS] = ProbeJobs()
    try:
        yield
    finally:
        await app[PROBE_JOBS].close()
        await app[MCP_CANCELLATIONS].close()  # held cancellations are dropped, never sent late
        await _drain(app[BACKGROUND])
        if publisher is not None:
            publisher.cancel()
            await asyncio.gather(publisher, return_exceptions=True)
            metrics.publish()  # the last counts of a worker that stops
        await sweeper.stop()
        await engine.close()
        witness.cancel()
        await asyncio.gather(witness, return_exceptions=True)
        await keeper.stop()
        await forwarder.close()
        # The stdio children after the engine: a call still being recorded keeps its child.
        await asyncio.gather(*(up.close() for up in app[STDIO_UPSTREAMS].values()))
        await requests.stop()  # the lines of the drained requests too
        await checkpointer.stop()  # last before the store: the heads of everything above
        await store.close()
        await tracer.close()  # last: the drained calls' spans are flushed too


async def _access_log(access: AccessLog, app: web.Application) -> AsyncIterator[None]:
    access.start()
    try:
        yield
    finally:
        await access.close()


def _shared_database(worker: RunningWorker | None) -> SharedDatabase | None:
    """How this worker shares an SQLite file with the others (None: the file is its own)."""
    if worker is None or worker.role.lock_descriptor is None:
        return None
    return SharedDatabase(
        lock_descriptor=worker.role.lock_descriptor,
        first=worker.role.first,
        signal=worker.channel,
    )


async def _publish_metrics(metrics: GatewayMetrics) -> None:
    """A worker's counts reach the other workers' scrapes at most this late."""
    while True:
        await asyncio.sleep(SNAPSHOT_SECONDS)
        try:
            metrics.publish()
        except OSError as exc:  # a full disk must not stop the serving
            log.warning("cannot publish this worker's metrics: %s", exc)


async def _expire_dead_workers_claims(
    store: Store, owners: tuple[str, ...], metrics: GatewayMetrics
) -> None:
    """A replaced worker's claims turn `unknown` before its replacement serves: it may
    have sent them, so they are never released, and nobody waits out their leases."""
    for owner in owners:
        expired = await store.expire_orphans(owner=owner)
        metrics.lease_expired(expired)
        if expired:
            log.warning(
                "%d in-flight operations of dead worker %s are now unknown",
                expired,
                owner,
                extra={"event": "orphans", "count": expired},
            )


async def _drain(background: set[asyncio.Task[Any]]) -> None:
    if not background:
        return
    log.info("waiting for %d upstream calls to finish", len(background))
    await asyncio.wait(set(background), timeout=SHUTDOWN_GRACE)


async def healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    """200 `ready` when the store answers. With workers, also how many of them serve, and
    503 `degraded` once fewer than all have for a while (`DEGRADED_SECONDS`): a gateway
    left with one worker of many still answers, but a load balancer should know."""
    await _check_ready(request.app)
    worker = request.app.get(WORKER)
    report = None if worker is None else worker.channel.workers
    if report is None:  # one process, or no report from the supervisor yet
        return web.json_response({"status": "ready"})
    body = {
        "status": "degraded" if report.degraded else "ready",
        "serving_workers": report.serving,
        "workers": report.workers,
    }
    return web.json_response(body, status=503 if report.degraded else 200)


async def _check_ready(app: web.Application) -> None:
    try:
        await app[STORE].ping()
    except StoreUnavailable:
        app[METRICS].ready.set(0)
        raise
    app[METRICS].ready.set(1)


async def metrics(request: web.Request) -> web.Response:
    app = request.app
    with contextlib.suppress(StoreUnavailable):
        await _check_ready(app)
    if app[METRICS].operation_counts_stale(time.monotonic(), _OPERATION_COUNT_TTL):
        # On a store outage the last known counts stay; /readyz reports the outage.
        with contextlib.suppress(StoreUnavailable):
            app[METRICS].set_operation_counts(await app[STORE].count_by_state(), time.monotonic())
    return web.Response(
        body=app[METRICS].render(),
        headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"},
    )
