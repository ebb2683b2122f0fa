"""The HTTP rows: the tool API directly, the plain proxy, and the gateway on each store.

Every row targets the same tool API process, so the rows differ only in what
sits in front of it. The plain proxy is the yardstick: the gateway is an
aiohttp server and client like it, plus the idempotency work, so its
throughput over the proxy's (measured minutes apart, in the same run) is the
cost of that work. CPU is that of the front process only (the tool API for
"direct"); for PostgreSQL the database server's own CPU is not included.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench import postgres, processes
from bench.gateway_config import ROUTE_PREFIX, LogLevel, sqlite_url, write_gateway_config
from bench.loadgen import KeyMode, LoadResult, run_load
from bench.plan import Plan
from bench.report import Table, ms, ratio

__all__ = [
    "DIRECT",
    "PLAIN",
    "Measured",
    "Rows",
    "latency_table",
    "measure_http_rows",
    "throughput_table",
]

DIRECT = "direct"
PLAIN = "plain proxy"
_ISSUES = "/v1/issues"


@dataclass(frozen=True, slots=True)
class Measured:
    """One row: its name, its concurrency, what the load saw, whose CPU was charged."""

    name: str
    concurrency: int
    result: LoadResult
    pid: int


@dataclass
class Rows:
    """Rows in the order they ran, plus notes for anything skipped or odd."""

    plan: Plan
    measured: list[Measured] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def run(
        self, name: str, url: str, mode: KeyMode, *, pid: int, concurrency: int | None = None
    ) -> Measured:
        spec = self.plan.spec(url, mode, pids=(pid,), concurrency=concurrency)
        row = Measured(name, spec.concurrency, run_load(spec), pid)
        self.measured.append(row)
        result = row.result
        print(
            f"  {name} c={row.concurrency}: {result.throughput:,.0f} req/s, "
            f"p50 {ms(result.p50_ms)} ms, p99 {ms(result.p99_ms)} ms",
            file=sys.stderr,
            flush=True,
        )
        return row

    def find(self, name: str, concurrency: int) -> Measured | None:
        for row in self.measured:
            if row.name == name and row.concurrency == concurrency:
                return row
        return None


def measure_http_rows(plan: Plan, workdir: Path, api: processes.ServerProcess) -> Rows:
    """Run every HTTP row against `api`, each front server started and stopped in turn."""
    rows = Rows(plan)
    rows.run(DIRECT, api.url + _ISSUES, "none", pid=api.pid)
    rows.run(DIRECT, api.url + _ISSUES, "none", pid=api.pid, concurrency=1)
    with processes.plain_proxy(workdir, api.url) as proxy:
        rows.run(PLAIN, proxy.url + _ISSUES, "none", pid=proxy.pid)
        rows.run(PLAIN, proxy.url + _ISSUES, "none", pid=proxy.pid, concurrency=1)

    _gateway_rows(rows, workdir, api, "sqlite", sqlite_url(workdir / "gateway.db"))
    _gateway_rows(
        rows, workdir, api, "sqlite", sqlite_url(workdir / "gateway-info.db"), log_level="info"
    )
    if not plan.postgres:
        rows.notes.append("PostgreSQL rows not run (--quick or --no-postgres).")
        return rows
    try:
        schema = postgres.create_schema()
    except Exception as exc:  # refused, timed out, no such database: all mean "skip"
        rows.notes.append(f"PostgreSQL rows skipped: {postgres.PG_URL} unreachable ({exc}).")
        return rows
    try:
        rows.notes.append(
            f"PostgreSQL {postgres.server_version()} on loopback, a fresh schema; "
            "the gateway's default pool of 10 connections."
        )
        _gateway_rows(rows, workdir, api, "postgres", postgres.url_for(schema))
    finally:
        postgres.drop_schema(schema)
    return rows


def _gateway_rows(
    rows: Rows,
    workdir: Path,
    api: processes.ServerProcess,
    store: str,
    store_url: str,
    *,
    log_level: LogLevel = "warning",
) -> None:
    """The miss, replay and 10%-duplicate rows (only the miss row for the info-log run)."""
    label = f"gateway {store}"
    config = write_gateway_config(
        workdir / f"{store}-{log_level}.toml",
        upstream=api.url,
        store_url=store_url,
        log_level=log_level,
    )
    with processes.gateway(config, name=label) as gateway:
        url = gateway.url + ROUTE_PREFIX + _ISSUES
        if log_level == "info":
            rows.run(f"{label} miss, log info", url, "new", pid=gateway.pid)
            return
        rows.run(f"{label} miss", url, "new", pid=gateway.pid)
        rows.run(f"{label} replay", url, "replay", pid=gateway.pid)
        rows.run(f"{label} mix10", url, "mix10", pid=gateway.pid)
        rows.run(f"{label} miss", url, "new", pid=gateway.pid, concurrency=1)
        rows.run(f"{label} replay", url, "replay", pid=gateway.pid, concurrency=1)


def throughput_table(rows: Rows) -> Table:
    """The rows at the plan's concurrency, each against the plain proxy of the same run."""
    concurrency = rows.plan.concurrency
    plain = rows.find(PLAIN, concurrency)
    baseline = plain.result.throughput if plain else 0.0
    body = []
    for row in rows.measured:
        if row.concurrency != concurrency:
            continue
        result = row.result
        notes = []
        if result.client_bound:
            notes.append(f"client-bound (load generator {result.client_cpu / result.seconds:.0%})")
        body.append(
            (
                row.name,
                f"{result.throughput:,.0f}",
                ms(result.p50_ms),
                ms(result.p99_ms),
                f"{result.cpu_us_per_request(row.pid):,.0f}",
                ratio(result.throughput, baseline),
                str(result.duplicates),
                f"{result.non_2xx}/{result.errors}",
                "; ".join(notes),
            )
        )
    header = (
        f"row (c={concurrency})",
        "req/s",
        "p50 ms",
        "p99 ms",
        "server CPU us/req",
        "vs plain proxy",
        "409",
        "other non-2xx/errors",
        "notes",
    )
    return Table(header, tuple(body))


def latency_table(rows: Rows) -> Table:
    """The c=1 rows: the latency each front adds to the tool API's own."""
    direct = rows.find(DIRECT, 1)
    base = direct.result.p50_ms if direct else float("nan")
    body = []
    for row in rows.measured:
        if row.concurrency != 1:
            continue
        result = row.result
        added = result.p50_ms - base
        body.append(
            (
                row.name,
                ms(result.p50_ms),
                ms(result.p99_ms),
                "-" if row.name == DIRECT else "n/a" if math.isnan(added) else f"{added:+.2f}",
                f"{result.cpu_us_per_request(row.pid):,.0f}",
            )
        )
    header = ("row (c=1)", "p50 ms", "p99 ms", "p50 added vs direct, ms", "server CPU us/req")
    return Table(header, tuple(body))
