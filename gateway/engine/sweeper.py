"""The background sweep: expired leases, expired receipts, forgotten tombstones, due probes.

It runs every `sweep_interval` in bounded batches, each its own short store
call, so requests are never queued behind a long sweep. `unknown` operations
are never swept away: they wait for reconciliation (and are probed here when
their route has a probe).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from gateway.engine.errors import StoreUnavailable

if TYPE_CHECKING:
    from gateway.engine.engine import IdempotencyEngine
    from gateway.store.base import Store

log = logging.getLogger("gateway.sweeper")

SWEEP_BATCH = 50
"""Rows a batch changes. A batch holds the store's writer (SQLite) or its rows' locks
until it commits, and a claim that arrives meanwhile waits for it: measured at a million
and at ten million stored operations on SQLite, a batch that expired 500 receipts took
about 200 ms, and claims made while a backlog was swept waited 400-500 ms at the median
(a claim and its receipt each queued behind one). Fifty keep each wait a tenth of that;
the pass keeps its pace with ten times the batches."""
MAX_BATCHES_PER_PASS = 2000
"""A pass stops after this many batches (100k records); the next pass continues."""


class SweepObserver(Protocol):
    """What a pass reports; the metrics layer implements it (`GatewayMetrics`)."""

    def lease_expired(self, count: int) -> None: ...

    def swept_records(self, receipts_expired: int, forgotten: int) -> None: ...


@dataclass(frozen=True, slots=True)
class SweepPass:
    """What one pass changed."""

    leases_expired: int
    receipts_expired: int
    forgotten: int
    probes_settled: int


class Sweeper:
    """Runs `run_once` every `interval` seconds until stopped.

    >>> # sweeper = Sweeper(store, engine, metrics, interval=60.0); await sweeper.start()
    """

    def __init__(
        self,
        store: Store,
        engine: IdempotencyEngine,
        metrics: SweepObserver,
        *,
        interval: float,
        batch: int = SWEEP_BATCH,
    ) -> None:
        self._store = store
        self._engine = engine
        self._metrics = metrics
        self._interval = interval
        self._batch = batch
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name="sweeper")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            try:
                await self.run_once()
            except StoreUnavailable as exc:
                log.warning("sweep skipped: %s", exc.internal or exc.detail)
            except Exception:
                log.exception("sweep failed")

    async def run_once(self) -> SweepPass:
        leases = await self._store.expire_orphans(owner=None)
        self._metrics.lease_expired(leases)
        receipts = forgotten = 0
        for _ in range(MAX_BATCHES_PER_PASS):
            report = await self._store.sweep(batch=self._batch)
            receipts += report.receipts_expired
            forgotten += report.forgotten
            if report.receipts_expired < self._batch and report.forgotten < self._batch:
                break
            await asyncio.sleep(0)  # let requests in between batches
        self._metrics.swept_records(receipts, forgotten)
        settled = await self._engine.reconcile_unknown()
        await self._engine.refresh_probe_metrics()
        return SweepPass(leases, receipts, forgotten, settled)
