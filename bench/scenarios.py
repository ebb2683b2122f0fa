"""The HTTP rows: the tool API directly, the plain proxy, and the gateway on each store.

Every row targets the same tool API process, so the rows differ only in what
sits in front of it. The plain proxy is the yardstick: the gateway is an
aiohttp server and client like it, plus the idempotency work, so its
throughput over the proxy's (measured minutes apart, in the same run) is the
cost of that work. CPU is that of the front process only (the tool API for
"direct"); for PostgreSQL the database server's own CPU is not included.

The similar-operation guard (a new key for the same request as one in flight
is refused) is on in every gateway row, as by default. What it costs on the
miss path is measured on each store by a second gateway, the same config
with `similar_guard = "off"` on a store of its own, started beside the first:
its miss rows ("..., similar guard off") run right after the first's, at the
same concurrency (`guard_summary` puts each pair side by side). That is one
window each, seconds apart: on a shared machine one pair can still differ by
noise alone, so `bench.guard_pair` measures the same two configs in
alternating windows for a steadier figure. Every miss sends a body of its own
(`bench.loadgen.JsonBodies`), so the guard looks for a twin and finds none,
which is its whole cost on this path.
"""

from __future__ import annotations

import contextlib
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
    "GUARD_OFF",
    "PLAIN",
    "Measured",
    "Rows",
    "guard_summary",
    "latency_table",
    "measure_http_rows",
    "throughput_table",
]

DIRECT = "direct"
PLAIN = "plain proxy"
GUARD_OFF = "similar guard off"
"""The suffix of the miss rows of the gateway with `similar_guard = "off"`."""
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

    _gateway_rows(
        rows,
        workdir,
        api,
        "sqlite",
        sqlite_url(workdir / "gateway.db"),
        guard_off_url=sqlite_url(workdir / "gateway-guard-off.db"),
    )
    _gateway_rows(
        rows, workdir, api, "sqlite", sqlite_url(workdir / "gateway-info.db"), log_level="info"
    )
    if not plan.postgres:
        rows.notes.append("PostgreSQL rows not run (--quick or --no-postgres).")
        return rows
    schemas: list[str] = []
    try:
        try:
            # One for each gateway: the guard's on and off pair never share a store.
            for _ in range(2):
                schemas.append(postgres.create_schema())
        except Exception as exc:  # refused, timed out, no such database: all mean "skip"
            rows.notes.append(f"PostgreSQL rows skipped: {postgres.PG_URL} unreachable ({exc}).")
            return rows
        rows.notes.append(
            f"PostgreSQL {postgres.server_version()} on loopback, a fresh schema for each "
            "gateway; the gateway's default pool of 10 connections."
        )
        guard_on, guard_off = schemas
        _gateway_rows(
            rows,
            workdir,
            api,
            "postgres",
            postgres.url_for(guard_on),
            guard_off_url=postgres.url_for(guard_off),
        )
    finally:
        for schema in schemas:
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
    guard_off_url: str | None = None,
) -> None:
    """The miss, replay and 10%-duplicate rows (only the miss row for the info-log run);
    with `guard_off_url`, each miss row is followed by the same row against a gateway
    with `similar_guard = "off"` on that store (started beside the first)."""
    label = f"gateway {store}"
    config = write_gateway_config(
        workdir / f"{store}-{log_level}.toml",
        upstream=api.url,
        store_url=store_url,
        log_level=log_level,
    )
    with contextlib.ExitStack() as stack:
        gateway = stack.enter_context(processes.gateway(config, name=label))
        url = gateway.url + ROUTE_PREFIX + _ISSUES
        if log_level == "info":
            rows.run(f"{label} miss, log info", url, "new", pid=gateway.pid)
            return
        unguarded: processes.ServerProcess | None = None
        if guard_off_url is not None:
            off_config = write_gateway_config(
                workdir / f"{store}-{log_level}-guard-off.toml",
                upstream=api.url,
                store_url=guard_off_url,
                log_level=log_level,
                similar_guard="off",
            )
            name = f"{label}, {GUARD_OFF}"
            unguarded = stack.enter_context(processes.gateway(off_config, name=name))

        def miss(concurrency: int | None = None) -> None:
            rows.run(f"{label} miss", url, "new", pid=gateway.pid, concurrency=concurrency)
            if unguarded is not None:
                off_url = unguarded.url + ROUTE_PREFIX + _ISSUES
                name = f"{label} miss, {GUARD_OFF}"
                rows.run(name, off_url, "new", pid=unguarded.pid, concurrency=concurrency)

        miss()
        rows.run(f"{label} replay", url, "replay", pid=gateway.pid)
        rows.run(f"{label} mix10", url, "mix10", pid=gateway.pid)
        miss(concurrency=1)
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
        "409/429",
        "other non-2xx/errors",
        "notes",
    )
    return Table(header, tuple(body))


def guard_summary(rows: Rows) -> list[str]:
    """One sentence per store whose guard pair ran: the miss rows with the guard on
    over the same rows with it off (req/s at the plan's concurrency, p50 at c=1)."""
    parts = []
    for store in ("sqlite", "postgres"):
        miss = f"gateway {store} miss"
        figures = []
        for concurrency in dict.fromkeys((rows.plan.concurrency, 1)):
            on, off = rows.find(miss, concurrency), rows.find(f"{miss}, {GUARD_OFF}", concurrency)
            if on is None or off is None:
                continue
            a, b = on.result, off.result
            if concurrency != 1:
                figures.append(
                    f"c={concurrency} {a.throughput:,.0f} / {b.throughput:,.0f} req/s "
                    f"= {ratio(a.throughput, b.throughput)}, "
                    f"p50 {ms(a.p50_ms)} / {ms(b.p50_ms)} ms"
                )
            else:
                added = a.p50_ms - b.p50_ms
                shown = "n/a" if math.isnan(added) else f"{added:+.2f} ms"
                figures.append(f"c=1 p50 {ms(a.p50_ms)} / {ms(b.p50_ms)} ms ({shown})")
        if figures:
            parts.append(f"{store}: {'; '.join(figures)}")
    if not parts:
        return []
    return [
        "The similar-operation guard on the miss path, on / off (the same config with "
        f'`similar_guard = "off"`, measured right after, one window each): {" | ".join(parts)}. '
        "A single pair of windows can differ by the machine's noise alone; "
        "`python -m bench.guard_pair` alternates several."
    ]


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
