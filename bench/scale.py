"""The store at scale: does a claim or a lookup slow down with a million operations stored?

Two SQLite files are pre-filled (`bench.prefill`), one small and one large,
and a gateway is run on each in turn at c=1, so each figure is the latency
of one request with nothing queued beside it:

- claim: `POST` with a new key (a unique-index probe and an insert, then the
  forward and the receipt);
- lookup: `GET /operations/<key>` of a random stored key.

Then, with the gateway stopped, one sweep batch (`SqliteStore.sweep`) is
timed in-process on the same file with nothing due. The SQLite store runs
its statements on the event loop (`gateway.store.sqlite_thread`), so the
time a sweep batch takes is time every request waits.

The pre-filled file was just written, so it is in the OS page cache: these
are hot-cache figures, which is what a busy gateway sees.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from bench import processes
from bench.gateway_config import ROUTE_PREFIX, sqlite_url, write_gateway_config
from bench.loadgen import LoadResult, run_load
from bench.plan import Plan
from bench.prefill import FillReport, prefill
from bench.report import Table, ms, ratio
from gateway.store.sqlite import SqliteStore

__all__ = ["ScalePoint", "measure_scale_point", "scale_table"]

_SWEEP_BATCH = 500  # gateway.engine.sweeper.SWEEP_BATCH
_SWEEP_REPEATS = 5


@dataclass(frozen=True, slots=True)
class ScalePoint:
    """Latencies measured with `fill.rows` operations already stored."""

    fill: FillReport
    claim: LoadResult
    lookup: LoadResult
    sweep_ms: float
    """Median time of one sweep batch with nothing due."""


def measure_scale_point(
    plan: Plan, workdir: Path, api: processes.ServerProcess, rows: int
) -> ScalePoint:
    """Pre-fill a fresh file with `rows` operations and measure on it; delete it afterwards."""
    path = workdir / f"scale-{rows}.db"
    try:
        fill = prefill(path, rows)
        print(
            f"  pre-filled {rows:,} operations in {fill.seconds:.1f} s "
            f"({fill.bytes_per_operation:.0f} bytes each on disk)",
            file=sys.stderr,
            flush=True,
        )
        # The kernel is still writing the fresh file back; every fsync would wait behind
        # it (this once made a million look 15x slower at p99: bench/big_stores.py).
        os.sync()
        config = write_gateway_config(
            workdir / f"scale-{rows}.toml", upstream=api.url, store_url=sqlite_url(path)
        )
        with processes.gateway(config, name=f"gateway on {rows:,} operations") as gateway:
            claim = run_load(
                plan.spec(
                    gateway.url + ROUTE_PREFIX + "/v1/issues",
                    "new",
                    pids=(gateway.pid,),
                    concurrency=1,
                )
            )
            lookup = run_load(
                plan.spec(
                    gateway.url + "/operations/{key}",
                    "lookup",
                    pids=(gateway.pid,),
                    concurrency=1,
                    method="GET",
                    lookup_keys=rows,
                )
            )
        sweep_ms = asyncio.run(_time_sweep(path))
    finally:
        for leftover in path.parent.glob(path.name + "*"):
            leftover.unlink()
    print(
        f"  {rows:,} stored: claim p50 {ms(claim.p50_ms)} ms, lookup p50 "
        f"{ms(lookup.p50_ms)} ms, sweep batch {ms(sweep_ms)} ms",
        file=sys.stderr,
        flush=True,
    )
    return ScalePoint(fill=fill, claim=claim, lookup=lookup, sweep_ms=sweep_ms)


async def _time_sweep(path: Path) -> float:
    store = SqliteStore(path=path)
    await store.open()
    try:
        times = []
        for _ in range(_SWEEP_REPEATS):
            started = time.perf_counter()
            await store.sweep(batch=_SWEEP_BATCH)
            times.append((time.perf_counter() - started) * 1000)
    finally:
        await store.close()
    return statistics.median(times)


def scale_table(small: ScalePoint, large: ScalePoint) -> Table:
    """Each figure with the small and the large store, and their ratio."""
    a, b = f"{small.fill.rows:,} stored", f"{large.fill.rows:,} stored"

    def line(name: str, x: float, y: float, unit: str = "ms") -> tuple[str, ...]:
        shown = ms if unit == "ms" else lambda v: f"{v:,.0f}"
        return (name, shown(x), shown(y), ratio(y, x))

    body = (
        line("claim (POST, new key) p50", small.claim.p50_ms, large.claim.p50_ms),
        line("claim (POST, new key) p99", small.claim.p99_ms, large.claim.p99_ms),
        line("lookup (GET /operations/<key>) p50", small.lookup.p50_ms, large.lookup.p50_ms),
        line("lookup (GET /operations/<key>) p99", small.lookup.p99_ms, large.lookup.p99_ms),
        line("sweep batch, nothing due (blocks the loop)", small.sweep_ms, large.sweep_ms),
        line(
            "bytes on disk per operation",
            small.fill.bytes_per_operation,
            large.fill.bytes_per_operation,
            unit="bytes",
        ),
    )
    return Table(("SQLite store, c=1", a, b, "ratio"), body)
