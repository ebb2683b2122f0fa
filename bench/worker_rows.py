"""The worker-process rows: what more serving processes on one port buy, and what they cost.

The gateway's miss path (a new key every request, a fresh SQLite store)
runs with `[server] workers = 1` and then `= 2`; the yardstick is the plain
proxy run as as many processes on one port (`bench.plain_proxy --processes`,
SO_REUSEPORT), so "vs plain proxy" compares equal process counts. With more
than one process both servers are a supervisor plus workers, so CPU is read
over the whole process tree (`LoadSpec.cpu_tree`), supervisor included.

The load generator runs on the same 2 cores as the servers, so with 2
processes throughput is bounded by the machine more than by the server:
CPU per request is the scaling measure. Equal CPU per request at 1 and at 2
processes means the work splits without overhead (each core a worker gives
twice the throughput); more CPU per request with 2 is what the split costs
(two SQLite writers contending for one file's lock, two connection pools).

Each row's processes cell says how many processes the tree held at the end
of the measured window, so a gateway that ignored `workers` (it serves
alone in one process) shows it instead of passing as scaled.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from bench import processes
from bench.gateway_config import ROUTE_PREFIX, sqlite_url, write_gateway_config
from bench.loadgen import KeyMode, LoadResult, run_load
from bench.plan import Plan
from bench.report import Table, ms, ratio

__all__ = [
    "GATEWAY_MISS",
    "PLAIN",
    "WorkerRow",
    "WorkerRows",
    "measure_worker_rows",
    "scaling_summary",
    "worker_section",
    "worker_table",
]

PLAIN = "plain proxy"
GATEWAY_MISS = "gateway sqlite miss"
_ISSUES = "/v1/issues"
_PROCESS = ("process", "processes")


@dataclass(frozen=True, slots=True)
class WorkerRow:
    """One row: which server, with how many serving processes, what the load saw."""

    server: str
    """`PLAIN` or `GATEWAY_MISS`."""
    processes: int
    """Serving processes asked for (`--processes`, `[server] workers`)."""
    result: LoadResult
    pid: int
    """The supervisor's pid (the only process with 1): the root of the CPU tree."""

    @property
    def name(self) -> str:
        """The row's label, unique in the table, e.g. "gateway sqlite miss, 2 workers"."""
        one, many = ("worker", "workers") if self.server == GATEWAY_MISS else _PROCESS
        return f"{self.server}, {self.processes} {one if self.processes == 1 else many}"

    @property
    def tree(self) -> int:
        """Processes in the server's tree at the end of the measured window."""
        return self.result.server_processes.get(str(self.pid), 1)

    @property
    def cpu_us(self) -> float:
        """CPU microseconds of the whole tree per answered request."""
        return self.result.cpu_us_per_request(self.pid)


@dataclass
class WorkerRows:
    """The rows in the order they ran, plus notes for anything odd."""

    plan: Plan
    measured: list[WorkerRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def run(self, server: str, count: int, url: str, mode: KeyMode, *, pid: int) -> WorkerRow:
        spec = self.plan.spec(url, mode, pids=(pid,), cpu_tree=True)
        row = WorkerRow(server, count, run_load(spec), pid)
        self.measured.append(row)
        result = row.result
        print(
            f"  {row.name} c={spec.concurrency}: {result.throughput:,.0f} req/s, "
            f"{row.cpu_us:,.0f} us CPU/request over {row.tree} "
            f"{_PROCESS[0] if row.tree == 1 else _PROCESS[1]}",
            file=sys.stderr,
            flush=True,
        )
        if count > 1 and row.tree == 1:
            self.notes.append(
                f"{row.name}: served by one process (the tree held no other), so this "
                "row measured a single process."
            )
        return row

    def find(self, server: str, count: int) -> WorkerRow | None:
        for row in self.measured:
            if row.server == server and row.processes == count:
                return row
        return None


def measure_worker_rows(plan: Plan, workdir: Path, api: processes.ServerProcess) -> WorkerRows:
    """The plain proxy, then the gateway, with each of `plan.worker_counts` processes.

    Each server's rows run back to back, so its "vs 1 process" ratio compares
    windows seconds apart; each gateway gets a fresh SQLite file.
    """
    rows = WorkerRows(plan)
    for count in plan.worker_counts:
        with processes.plain_proxy(workdir, api.url, processes=count) as proxy:
            rows.run(PLAIN, count, proxy.url + _ISSUES, "none", pid=proxy.pid)
    for count in plan.worker_counts:
        config = write_gateway_config(
            workdir / f"sqlite-workers-{count}.toml",
            upstream=api.url,
            store_url=sqlite_url(workdir / f"gateway-workers-{count}.db"),
            workers=count,
        )
        with processes.gateway(config, name=f"gateway sqlite, {count} workers") as gateway:
            url = gateway.url + ROUTE_PREFIX + _ISSUES
            rows.run(GATEWAY_MISS, count, url, "new", pid=gateway.pid)
    return rows


def worker_table(rows: WorkerRows) -> Table:
    """Each row against the plain proxy with as many processes, and against itself with 1."""
    body = []
    for row in rows.measured:
        result = row.result
        plain = rows.find(PLAIN, row.processes)
        single = rows.find(row.server, 1)
        notes = []
        if result.client_bound:
            notes.append(f"client-bound (load generator {result.client_cpu / result.seconds:.0%})")
        in_tree = "" if row.tree == row.processes else f" ({row.tree} in tree)"
        body.append(
            (
                row.name,
                f"{row.processes}{in_tree}",
                f"{result.throughput:,.0f}",
                ms(result.p50_ms),
                ms(result.p99_ms),
                ratio(result.throughput, plain.result.throughput) if plain else "n/a",
                f"{row.cpu_us:,.0f}",
                ratio(row.cpu_us, single.cpu_us) if single else "n/a",
                ratio(result.throughput, single.result.throughput) if single else "n/a",
                str(result.duplicates),
                f"{result.non_2xx}/{result.errors}",
                "; ".join(notes),
            )
        )
    header = (
        f"row (c={rows.plan.concurrency})",
        "processes",
        "req/s",
        "p50 ms",
        "p99 ms",
        "vs plain proxy (same processes)",
        "CPU us/req (process tree)",
        "CPU/req vs 1 process",
        "req/s vs 1 process",
        "409/429",
        "other non-2xx/errors",
        "notes",
    )
    return Table(header, tuple(body))


def scaling_summary(rows: WorkerRows) -> list[str]:
    """One sentence per process count above 1: CPU per request over 1 process's, per server."""
    sentences = []
    for count in rows.plan.worker_counts:
        if count == 1:
            continue
        parts = []
        for server in (GATEWAY_MISS, PLAIN):
            many, single = rows.find(server, count), rows.find(server, 1)
            if many is not None and single is not None:
                parts.append(f"{server} {ratio(many.cpu_us, single.cpu_us)}")
        if parts:
            sentences.append(
                f"CPU per request, {count} processes vs 1: {', '.join(parts)} "
                "(1.00x: the work splits at no extra cost)."
            )
    return sentences


def worker_section(rows: WorkerRows) -> list[str]:
    """The "Worker processes" section of the results, as Markdown lines."""
    plan = rows.plan
    counts = " and ".join(str(count) for count in plan.worker_counts)
    return [
        "## Worker processes",
        "",
        "The gateway's miss path (a new key every request, SQLite store) with "
        f"`[server] workers` = {counts}, beside the plain proxy run as as many processes on "
        "one port (`bench.plain_proxy --processes`, SO_REUSEPORT); "
        f"c={plan.concurrency}, {plan.duration:g} s measured per row after "
        f"{plan.warmup:g} s warm-up.",
        "",
        worker_table(rows).render(),
        "",
        *scaling_summary(rows),
        "",
        "CPU is the whole server process tree's (a supervisor and all its workers, "
        "summed, read from /proc at the edges of the measured window; a worker that "
        "exited within it is not counted). The load generator shares this machine's "
        "cores with the servers, so req/s with more processes is bounded by the "
        "machine: CPU per request is the scaling measure. `processes` also gives the "
        "tree's size at the window's end where it differs (a supervisor adds one). "
        "`409` are refusals, counted in req/s as answered: a miss row (a distinct "
        "body per key) should have none.",
    ]
