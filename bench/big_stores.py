"""Big stores, long days: the store at a thousand, a million and ten million operations.

`python -m bench.big_stores --store sqlite --sizes 1000,1000000,10000000`
(and `--store postgres`) prints one table per store; `--write FILE` also
writes it as Markdown. For each size, a fresh store is filled with a day of
realistic operations (`bench.prefill`, `bench.prefill_pg`: completed,
released and unknown, with histories and request logs), the disk is synced
(a just-written file is still being written back by the kernel, and every
fsync then waits behind it: measured right after a fill, a claim's p99 at a
million was 31 ms and its worst 516 ms; after `sync`, 18 and 49), and a
gateway process with the production defaults serves it. Measured, each after a
warm-up, against the bench's tool API:

- claim (POST, a new key), replay (POST, a key already completed) and lookup
  (`GET /operations/<key>` of a pre-filled key) at c=1 and c=64;
- admin search by key (`?key=`) and by the first 8 characters of a key
  (`?q=`), 200 requests each at c=1;
- the sweep: the batch time of the store's own `sweep` (500 rows, in process,
  before any gateway runs, while the fill's oldest 1% are past their
  retention), and the claim at c=1 again with the gateway sweeping every
  second;
- bytes per operation on disk, history, request log and indexes included.

The ratio column compares each size with the smallest; the issue's goal is a
claim p99 within 3x from a thousand to ten million.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import postgres, processes
from bench.fill_rows import fill_key
from bench.gateway_config import ROUTE_PREFIX, sqlite_url, write_gateway_config
from bench.loadgen import LoadResult, run_load
from bench.plan import Plan
from bench.prefill import EXACT_ROWS, FillReport, bytes_per_operation, prefill
from bench.prefill_pg import prefill_postgres
from bench.report import Table, ms, ratio
from gateway.engine.sweeper import SWEEP_BATCH
from gateway.store import Store

__all__ = ["BigStorePoint", "measure_point", "points_table"]

ADMIN_TOKEN = "bench-admin-token-0123456789abcdef"
_SEARCHES = 200
_SWEEP_BATCH = SWEEP_BATCH
_SWEEP_REPEATS = 5
_LOADS = (("claim", "new", "POST"), ("replay", "replay", "POST"), ("lookup", "lookup", "GET"))


@dataclass
class BigStorePoint:
    """Everything measured on one store of one size."""

    store: str
    fill: FillReport
    loads: dict[str, LoadResult] = field(default_factory=dict)
    """By row name: "claim c=1", "lookup c=64", "claim c=1, sweeping", ..."""
    searches: dict[str, tuple[float, float]] = field(default_factory=dict)
    """Admin search (p50, p99) ms, by "key" and "prefix"."""
    sweep_ms: float = 0.0
    """Median time of one sweep batch with receipts due."""
    swept: int = 0
    """Receipts the timed batches expired (0 would mean they had nothing to do)."""


def measure_point(
    plan: Plan,
    workdir: Path,
    api: processes.ServerProcess,
    store: str,
    rows: int,
    keep: Path | None = None,
) -> BigStorePoint:
    """Fill a fresh `store` ("sqlite" or "postgres") with `rows` operations and measure it
    (`keep`: `_fresh_store`'s)."""
    with _fresh_store(workdir, store, rows, keep) as (url, fill):
        point = BigStorePoint(store=store, fill=fill)
        print(
            f"  {store}: filled {rows:,} in {fill.seconds:.0f} s, "
            f"{fill.bytes_per_operation:,.0f} bytes an operation",
            file=sys.stderr,
            flush=True,
        )
        os.sync()  # nothing of the fill left for the kernel to write back
        # First, while the fill's oldest receipts are all still due.
        point.sweep_ms, point.swept = asyncio.run(_time_sweeps(store, url))
        for sweeping in (False, True):
            config = write_gateway_config(
                workdir / f"big-{store}-{rows}.toml",
                upstream=api.url,
                store_url=url,
                admin_token=ADMIN_TOKEN,
                sweep_interval="1s" if sweeping else None,
            )
            with processes.gateway(config, name=f"gateway on {rows:,}", admin=True) as gateway:
                target = gateway.url + ROUTE_PREFIX + "/v1/issues"
                if sweeping:
                    point.loads["claim c=1, sweeping every 1 s"] = _load(
                        plan, gateway, target, "new", 1
                    )
                    continue
                for name, mode, method in _LOADS:
                    url_of = gateway.url + "/operations/{key}" if mode == "lookup" else target
                    for concurrency in (1, plan.concurrency):
                        point.loads[f"{name} c={concurrency}"] = _load(
                            plan, gateway, url_of, mode, concurrency, method, fill.exact
                        )
                assert gateway.admin_url is not None
                point.searches = asyncio.run(_searches(gateway.admin_url, fill.exact))
        claim = point.loads["claim c=1"]
        print(
            f"  {store} {rows:,}: claim c=1 p50 {ms(claim.p50_ms)} p99 {ms(claim.p99_ms)} ms; "
            f"sweep batch {ms(point.sweep_ms)} ms ({point.swept} expired)",
            file=sys.stderr,
            flush=True,
        )
    return point


def _load(
    plan: Plan,
    gateway: processes.ServerProcess,
    url: str,
    mode: str,
    concurrency: int,
    method: str = "POST",
    lookup_keys: int = 0,
) -> LoadResult:
    return run_load(
        plan.spec(
            url,
            mode,  # type: ignore[arg-type]
            pids=(gateway.pid,),
            concurrency=concurrency,
            method=method,
            lookup_keys=lookup_keys if mode == "lookup" else 0,
        )
    )


def kept_sqlite(keep: Path, rows: int) -> tuple[Path, float]:
    """The kept SQLite file of `rows` operations in `keep` (`big-<rows>.db`), filled first
    if it is not there, and the seconds its fill took (kept beside it, `big-<rows>.fill`)."""
    path, fill = keep / f"big-{rows}.db", keep / f"big-{rows}.fill"
    if not path.exists():
        fill.write_text(f"{prefill(path, rows).seconds}\n")
    return path, float(fill.read_text())


@contextmanager
def _fresh_store(
    workdir: Path, store: str, rows: int, keep: Path | None = None
) -> Iterator[tuple[str, FillReport]]:
    """A store URL filled with `rows` operations; removed afterwards.

    With `keep` (SQLite only), the file is `keep/big-<rows>.db`, filled only if it is
    not there yet, and left for the next run: ten million take a while to write. A kept
    file has had one run's writes too (claims, sweeps); its fill time is the first's.
    """
    if store == "sqlite" and keep is not None:
        path, seconds = kept_sqlite(keep, rows)
        size = bytes_per_operation(path)[1]
        yield sqlite_url(path), FillReport(rows, min(rows, EXACT_ROWS), seconds, size)
        return
    if store == "sqlite":
        path = workdir / f"big-{rows}.db"
        try:
            yield sqlite_url(path), prefill(path, rows)
        finally:
            for leftover in path.parent.glob(path.name + "*"):
                leftover.unlink()
        return
    schema = postgres.create_schema()
    try:
        url = postgres.url_for(schema)
        yield url, prefill_postgres(url, rows)
    finally:
        postgres.drop_schema(schema)


async def _searches(admin_url: str, keys: int) -> dict[str, tuple[float, float]]:
    """Admin searches by a whole key and by its first 8 characters, one at a time."""
    rng = random.Random(7)
    found: dict[str, tuple[float, float]] = {}
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    queries: dict[str, Callable[[str], str]] = {
        "key": lambda key: f"key={key}",
        "prefix": lambda key: f"q={key[:8]}",
    }
    async with aiohttp.ClientSession(headers=headers) as session:
        for name, query in queries.items():
            times = []
            for _ in range(_SEARCHES):
                key = fill_key(rng.randrange(keys))
                started = time.perf_counter()
                async with session.get(f"{admin_url}/admin/operations?{query(key)}") as answer:
                    document = await answer.json()
                times.append((time.perf_counter() - started) * 1000)
                if answer.status != 200 or not document["items"]:
                    raise RuntimeError(f"admin search {query(key)}: {answer.status}")
            times.sort()
            found[name] = (statistics.median(times), times[int(len(times) * 0.99) - 1])
    return found


async def _time_sweeps(store: str, url: str) -> tuple[float, int]:
    """Median time of a sweep batch on the store, in process, and receipts expired."""
    from gateway.store.postgres import PostgresStore
    from gateway.store.sqlite import SqliteStore

    opened: Store = (
        SqliteStore(path=Path(url.removeprefix("sqlite:///")))
        if store == "sqlite"
        else PostgresStore(url)
    )
    await opened.open()
    times, expired = [], 0
    try:
        for _ in range(_SWEEP_REPEATS):
            started = time.perf_counter()
            report = await opened.sweep(batch=_SWEEP_BATCH)
            times.append((time.perf_counter() - started) * 1000)
            expired += report.receipts_expired
    finally:
        await opened.close()
    return statistics.median(times), expired


def points_table(points: list[BigStorePoint]) -> Table:
    """One row per figure, one column per size, and each size's ratio to the smallest."""
    first = points[0]
    header = (
        f"{first.store}",
        *(f"{point.fill.rows:,} stored" for point in points),
        *(f"{point.fill.rows:,} / {first.fill.rows:,}" for point in points[1:]),
    )

    def line(name: str, values: list[float], shown: Callable[[float], str] = ms) -> tuple[str, ...]:
        return (
            name,
            *(shown(value) for value in values),
            *(ratio(value, values[0]) for value in values[1:]),
        )

    body: list[tuple[str, ...]] = []
    for name in first.loads:
        body.append(line(f"{name} p50", [p.loads[name].p50_ms for p in points]))
        body.append(line(f"{name} p99", [p.loads[name].p99_ms for p in points]))
    for name in first.searches:
        for index, edge in enumerate(("p50", "p99")):
            label = f"admin search by {'key' if name == 'key' else 'key prefix (8 chars)'} {edge}"
            body.append(line(label, [p.searches[name][index] for p in points]))
    body.append(
        line(f"sweep batch of {_SWEEP_BATCH}, receipts due, median", [p.sweep_ms for p in points])
    )
    body.append(
        line(
            f"receipts those {_SWEEP_REPEATS} batches expired",
            [float(p.swept) for p in points],
            lambda value: f"{value:,.0f}",
        )
    )
    body.append(
        line(
            "bytes per operation (history, request log, indexes)",
            [p.fill.bytes_per_operation for p in points],
            lambda value: f"{value:,.0f}",
        )
    )
    body.append(
        line("fill seconds", [p.fill.seconds for p in points], lambda value: f"{value:,.0f}")
    )
    return Table(header, tuple(body))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--sizes", default="1000,1000000,10000000")
    parser.add_argument("--duration", type=float, default=5.0, help="measured seconds a row")
    parser.add_argument("--write", type=Path, help="also write the table (Markdown) here")
    parser.add_argument(
        "--keep", type=Path, help="SQLite: fill big-<rows>.db here once, and reuse it after"
    )
    args = parser.parse_args(argv)
    plan = Plan(duration=args.duration, warmup=1.0)
    sizes = [int(size) for size in args.sizes.split(",")]
    with tempfile.TemporaryDirectory(prefix="big-stores-") as scratch:
        workdir = Path(scratch)
        with processes.tool_api(workdir) as api:
            points = [
                measure_point(plan, workdir, api, args.store, rows, args.keep) for rows in sizes
            ]
    table = points_table(points).render()
    print(table)
    if args.write is not None:
        args.write.write_text(table + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
