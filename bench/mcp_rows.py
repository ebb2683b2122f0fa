"""The MCP rows: a side-effecting tool called directly and through a gateway MCP route.

`create_ticket` on `bench.mcp_server` (the official `mcp` SDK's `MCPServer`
over Streamable HTTP, uvicorn, one process), called by `bench.mcp_load` (a
plain-HTTP JSON-RPC client, one MCP session per concurrent agent) with a fresh
`params._meta.idempotencyKey` every call: the gateway's miss path (claim, send
with the forwarded key, record the receipt). Each answer form runs:

- direct (client -> MCP server) and through the gateway (client -> gateway
  route `kind = "mcp"` on a fresh SQLite store -> the same server process),
  each at c=1 (latency) and at the plan's MCP concurrency, 16 (throughput);
- for the first form of the full plan, also through the gateway with no key:
  a call the gateway passes on unrecorded, the cost of the hop alone.

The c=1 rows of a form are measured side by side: their time is cut into
`Plan.mcp_segments` windows that alternate between direct, the gateway and
(when it runs) the key-less row, so that a neighbour's load on a shared
machine falls on all of them alike; each row's p50 and p99 are over the
calls of all its windows, its CPU over all its windows.

The two goals are read from one run, as the HTTP rows' ratios: the gateway's
added p50 at c=1 (goal < 2 ms) and its throughput over direct's at c=16 (goal
>= 0.5x). Each gateway row also reports the gateway process's CPU per call
(/proc, over the measured windows) and says where the gateway's own time
went, from its /metrics read before and after each window (warm-ups
included): the wait for the MCP server, the claim's and the receipt's
durable commits, the rest. `bench.mcp_profile` breaks the c=1 miss down
further (bench/PROFILE.md).
"""

from __future__ import annotations

import math
import re
import sys
import urllib.request
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Literal, get_args

from bench import processes
from bench.gateway_config import MCP_PREFIX, sqlite_url, write_mcp_gateway_config
from bench.loadgen import LoadResult
from bench.mcp_load import McpLoadSpec, Protocol, merge_results, read_latencies, run_mcp_load
from bench.plan import Plan
from bench.report import Table, filesystem_of, ms, ratio

__all__ = [
    "ADDED_P50_GOAL_MS",
    "FORMS",
    "THROUGHPUT_GOAL",
    "McpForm",
    "McpRows",
    "mcp_comparison",
    "mcp_config_note",
    "mcp_detail_table",
    "mcp_summary_table",
    "measure_mcp_rows",
]

McpForm = Literal["session-json", "session-sse", "stateless"]
"""How the calls travel: a 2025-11-25 session answered as JSON or as an event
stream, or the stateless 2026-07-28 generation (no session, answered as JSON)."""
FORMS: tuple[str, ...] = get_args(McpForm)

_FORM_LABELS: dict[str, str] = {
    "session-json": "2025-11-25 session, JSON answers",
    "session-sse": "2025-11-25 session, SSE answers",
    "stateless": "2026-07-28 stateless",
}
_FORM_SHORT: dict[str, str] = {
    "session-json": "session, JSON",
    "session-sse": "session, SSE",
    "stateless": "2026-07-28",
}
_FORM_PROTOCOL: dict[str, Protocol] = {
    "session-json": "2025-11-25",
    "session-sse": "2025-11-25",
    "stateless": "2026-07-28",
}
_SSE_SERVER = frozenset({"session-sse"})
"""Forms whose server answers requests as event streams (the SDK's default)."""


def mcp_config_note(workdir: Path) -> str:
    """Which gateway configuration the MCP rows use, and where their store is, for the
    results (the store's filesystem decides what a durable commit costs)."""
    return (
        "`bench.gateway_config.write_mcp_gateway_config`, the production defaults (one "
        'route `kind = "mcp"`, every tool protected, SQLite in WAL mode with '
        f"`synchronous=FULL`, the store in the run's temporary directory, on "
        f"{filesystem_of(workdir)}; one serving process; uvloop (the default "
        "`[server] loop`), except two deliberate bench settings "
        "documented there: "
        "`shared_scope = true` (the load sends no credential) and log level `warning`, "
        "so no access-log line a call (the production default is `info`; the HTTP rows' "
        "`log info` row prices it, and bench/PROFILE.md does for MCP)."
    )


DIRECT = "direct"
GATEWAY = "gateway miss"
PASS_THROUGH = "gateway, no key"
ADDED_P50_GOAL_MS = 2.0
THROUGHPUT_GOAL = 0.5

_METRICS_TIMEOUT = 5.0
_SEGMENT_WARMUP = 0.3
"""Unmeasured seconds before each c=1 window after the first (a new client process opens
its connection, and its session, again)."""
_SERIES = {
    "request": 'idempotency_gateway_request_seconds_{}{{route="tools"}}',
    "upstream": 'idempotency_gateway_upstream_seconds_{}{{route="tools"}}',
    "claim": 'idempotency_gateway_store_seconds_{}{{operation="claim"}}',
    "receipt": 'idempotency_gateway_store_seconds_{}{{operation="complete"}}',
}
"""The gateway's histograms a row's time split is read from (sum and count of each)."""
_SAMPLE = re.compile(r"^(\S+\})\s+(\S+)$")


@dataclass(frozen=True, slots=True)
class McpMeasured:
    """One MCP row: which form, which front, how many at once, what the load saw."""

    form: str
    front: str
    concurrency: int
    result: LoadResult
    server_pid: int
    gateway_pid: int | None = None
    split_ms: dict[str, float] = field(default_factory=dict)
    """Mean ms per call in the gateway: request, upstream, claim, receipt (gateway rows)."""
    segments: int = 1
    """Windows the row was measured in, alternating with the form's other fronts (c=1)."""

    @property
    def name(self) -> str:
        return f"MCP {self.front} ({_FORM_SHORT[self.form]})"


@dataclass
class McpRows:
    """The MCP rows in the order they ran, plus notes."""

    plan: Plan
    measured: list[McpMeasured] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    config: str = ""
    """Which gateway configuration the rows used (`mcp_config_note`)."""

    def find(self, form: str, front: str, concurrency: int) -> McpMeasured | None:
        for row in self.measured:
            if (row.form, row.front, row.concurrency) == (form, front, concurrency):
                return row
        return None


def measure_mcp_rows(plan: Plan, workdir: Path) -> McpRows:
    """Run the plan's MCP forms, each server and gateway started and stopped in turn."""
    rows = McpRows(plan, config=mcp_config_note(workdir))
    if util.find_spec("mcp") is None or util.find_spec("uvicorn") is None:
        rows.notes.append("MCP rows skipped: the `mcp` SDK is not installed (pip install mcp).")
        return rows
    rows.notes.append(
        f"MCP rows: mcp {metadata.version('mcp')} `MCPServer` on uvicorn "
        f"{metadata.version('uvicorn')} ({_http_impl()}), one process; "
        "load from `bench.mcp_load` (aiohttp, JSON-RPC over plain HTTP, one MCP session "
        "per concurrent agent), whatever `--client` says."
    )
    for json_response in (True, False):
        forms = [f for f in plan.mcp_forms if (f not in _SSE_SERVER) == json_response]
        if not forms:
            continue
        with processes.mcp_server(workdir, json_response=json_response) as server:
            for form in forms:
                _form_rows(rows, workdir, server, form)
    return rows


@dataclass(frozen=True, slots=True)
class _Front:
    """One way the load reaches the MCP server in a form's rows."""

    name: str
    url: str
    gateway: processes.ServerProcess | None
    keyed: bool = True


def _form_rows(rows: McpRows, workdir: Path, server: processes.ServerProcess, form: str) -> None:
    plan = rows.plan
    config = write_mcp_gateway_config(
        workdir / f"mcp-{form}.toml",
        upstream=server.url,
        store_url=sqlite_url(workdir / f"gateway-mcp-{form}.db"),
    )
    with processes.gateway(config, name=f"gateway (MCP, {form})") as gateway:
        url = gateway.url + MCP_PREFIX
        fronts = [_Front(DIRECT, server.url, None), _Front(GATEWAY, url, gateway)]
        if plan.mcp_pass_through and form == plan.mcp_forms[0]:
            fronts.append(_Front(PASS_THROUGH, url, gateway, keyed=False))
        for front in fronts:
            _run(rows, form, front, plan.mcp_concurrency, server)
        _latency_rows(rows, workdir, form, server, fronts)


def _latency_rows(
    rows: McpRows,
    workdir: Path,
    form: str,
    server: processes.ServerProcess,
    fronts: list[_Front],
) -> None:
    """The c=1 rows of a form, side by side: the row's time is cut into `mcp_segments`
    windows that alternate between the fronts (direct, gateway, ..., then back in
    reverse order), so that a neighbour's load on a shared machine, or its drift,
    falls on direct and the gateway alike; each row merges its windows."""
    plan = rows.plan
    segments = max(1, plan.mcp_segments)
    duration = (plan.mcp_duration or plan.duration) / segments
    parts: dict[str, list[tuple[LoadResult, Sequence[float]]]] = {f.name: [] for f in fronts}
    metrics: dict[str, Counter[str]] = {f.name: Counter() for f in fronts}
    for number in range(segments):
        for front in fronts if number % 2 == 0 else fronts[::-1]:
            spec = _spec(
                plan,
                form,
                front,
                1,
                server,
                duration=duration,
                warmup=plan.warmup if number == 0 else min(plan.warmup, _SEGMENT_WARMUP),
            )
            path = workdir / f"latencies-{form}-{number}.bin"
            before = metrics_sample(front.gateway.url) if front.gateway is not None else {}
            result = run_mcp_load(spec, latencies=path)
            if front.gateway is not None:
                after = metrics_sample(front.gateway.url)
                metrics[front.name].update({k: after[k] - before.get(k, 0.0) for k in after})
            parts[front.name].append((result, read_latencies(path)))
            path.unlink()
    for front in fronts:
        _record(
            rows,
            form,
            front,
            1,
            server,
            merge_results(parts[front.name]),
            metrics_split({}, dict(metrics[front.name])) if front.gateway is not None else {},
            segments=segments,
        )


def _spec(
    plan: Plan,
    form: str,
    front: _Front,
    concurrency: int,
    server: processes.ServerProcess,
    *,
    duration: float,
    warmup: float,
) -> McpLoadSpec:
    gateway = front.gateway
    return McpLoadSpec(
        url=front.url,
        protocol=_FORM_PROTOCOL[form],
        concurrency=concurrency,
        duration=duration,
        warmup=warmup,
        cpu_pids=(server.pid,) if gateway is None else (server.pid, gateway.pid),
        keyed=front.keyed,
    )


def _run(
    rows: McpRows, form: str, front: _Front, concurrency: int, server: processes.ServerProcess
) -> McpMeasured:
    """One row in one window (the throughput rows)."""
    plan = rows.plan
    spec = _spec(
        plan,
        form,
        front,
        concurrency,
        server,
        duration=plan.mcp_duration or plan.duration,
        warmup=plan.warmup,
    )
    gateway = front.gateway
    before = metrics_sample(gateway.url) if gateway is not None else {}
    result = run_mcp_load(spec)
    split = metrics_split(before, metrics_sample(gateway.url)) if gateway is not None else {}
    return _record(rows, form, front, concurrency, server, result, split)


def _record(
    rows: McpRows,
    form: str,
    front: _Front,
    concurrency: int,
    server: processes.ServerProcess,
    result: LoadResult,
    split: dict[str, float],
    *,
    segments: int = 1,
) -> McpMeasured:
    row = McpMeasured(
        form=form,
        front=front.name,
        concurrency=concurrency,
        result=result,
        server_pid=server.pid,
        gateway_pid=front.gateway.pid if front.gateway is not None else None,
        split_ms=split,
        segments=segments,
    )
    rows.measured.append(row)
    print(
        f"  {row.name} c={concurrency}: {result.throughput:,.0f} calls/s, "
        f"p50 {ms(result.p50_ms)} ms, p99 {ms(result.p99_ms)} ms"
        + (f" ({segments} alternating windows)" if segments > 1 else "")
        + ("" if result.ok == result.responses else f", answers {result.statuses}")
        + (f", {result.errors} errors" if result.errors else ""),
        file=sys.stderr,
        flush=True,
    )
    return row


def metrics_sample(base_url: str) -> dict[str, float]:
    """The sums and counts of the gateway's time histograms (`_SERIES`), by name."""
    with urllib.request.urlopen(base_url + "/metrics", timeout=_METRICS_TIMEOUT) as response:
        text = response.read().decode()
    wanted = {
        _SERIES[name].format(part): f"{name}_{part}"
        for name in _SERIES
        for part in ("sum", "count")
    }
    values: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match and match.group(1) in wanted:
            values[wanted[match.group(1)]] = float(match.group(2))
    return values


def metrics_split(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean ms per observation of each series over the row (absent when nothing was seen)."""
    split: dict[str, float] = {}
    for name in _SERIES:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        if count > 0:
            split[name] = total / count * 1000
    return split


def form_protocol(form: str) -> Protocol:
    """The protocol generation a form speaks."""
    return _FORM_PROTOCOL[form]


def form_uses_sse(form: str) -> bool:
    """Whether a form's server answers requests as event streams (the SDK's default)."""
    return form in _SSE_SERVER


def _http_impl() -> str:
    """Which HTTP parser uvicorn's "auto" picks: httptools when installed, else h11."""
    return "httptools" if util.find_spec("httptools") is not None else "h11"


# -- tables ----------------------------------------------------------------------------


def mcp_summary_table(rows: McpRows) -> Table:
    """One line per form: c=1 latency direct and through the gateway (p50, p99, the
    added p50 against its goal, the gateway's CPU a call), then throughput at the MCP
    concurrency against its goal."""
    concurrency = rows.plan.mcp_concurrency
    body = []
    for form in rows.plan.mcp_forms:
        direct1, gateway1 = rows.find(form, DIRECT, 1), rows.find(form, GATEWAY, 1)
        direct_n = rows.find(form, DIRECT, concurrency)
        gateway_n = rows.find(form, GATEWAY, concurrency)
        if direct1 is None or gateway1 is None or direct_n is None or gateway_n is None:
            continue
        added = gateway1.result.p50_ms - direct1.result.p50_ms
        share = (
            gateway_n.result.throughput / direct_n.result.throughput
            if direct_n.result.throughput > 0
            else math.nan
        )
        body.append(
            (
                _FORM_LABELS[form],
                f"{ms(direct1.result.p50_ms)} / {ms(direct1.result.p99_ms)}",
                f"{ms(gateway1.result.p50_ms)} / {ms(gateway1.result.p99_ms)}",
                _verdict(f"{added:+.2f}", not math.isnan(added) and added < ADDED_P50_GOAL_MS),
                _cpu(gateway1.result, gateway1.gateway_pid),
                _cpu(direct1.result, direct1.server_pid),
                f"{direct_n.result.throughput:,.0f}",
                f"{gateway_n.result.throughput:,.0f}",
                _verdict(
                    ratio(gateway_n.result.throughput, direct_n.result.throughput),
                    not math.isnan(share) and share >= THROUGHPUT_GOAL,
                ),
            )
        )
    header = (
        "MCP tools/call, new key each call",
        "direct, c=1: p50 / p99 ms",
        "gateway, c=1: p50 / p99 ms",
        f"added p50, ms (goal < {ADDED_P50_GOAL_MS:g})",
        "gateway CPU us/call, c=1",
        "MCP server CPU us/call, direct, c=1",
        f"calls/s direct, c={concurrency}",
        f"calls/s gateway, c={concurrency}",
        f"gateway / direct (goal >= {THROUGHPUT_GOAL:g}x)",
    )
    return Table(header, tuple(body))


def mcp_comparison(rows: McpRows) -> list[str]:
    """What the key-less hop alone added at c=1, for each form that ran it."""
    parts = []
    for form in rows.plan.mcp_forms:
        direct, hop = rows.find(form, DIRECT, 1), rows.find(form, PASS_THROUGH, 1)
        if direct is not None and hop is not None:
            added = hop.result.p50_ms - direct.result.p50_ms
            parts.append(
                f"the gateway's key-less pass-through ({_FORM_SHORT[form]}) added "
                f"{added:+.2f} ms at c=1 (the hop alone)"
            )
    return parts


def mcp_detail_table(rows: McpRows) -> Table:
    """Every MCP row: throughput, latency, CPU by process, and the gateway's time split."""
    body = []
    for row in rows.measured:
        result = row.result
        notes = []
        if result.client_bound:
            notes.append(f"client-bound (load generator {result.client_cpu / result.seconds:.0%})")
        failed = {k: n for k, n in result.statuses.items() if k != "ok"}
        if failed:
            notes.append("; ".join(f"{k}: {n}" for k, n in failed.items()))
        body.append(
            (
                row.name,
                str(row.concurrency),
                f"{result.throughput:,.0f}",
                ms(result.p50_ms),
                ms(result.p99_ms),
                _cpu(result, row.gateway_pid),
                _cpu(result, row.server_pid),
                _split_cell(row.split_ms),
                f"{result.non_2xx}/{result.errors}",
                "; ".join(notes),
            )
        )
    header = (
        "row",
        "c",
        "calls/s",
        "p50 ms",
        "p99 ms",
        "gateway CPU us/call",
        "MCP server CPU us/call",
        "in the gateway, mean ms: whole / server / claim / receipt",
        "not ok/errors",
        "notes",
    )
    return Table(header, tuple(body))


def _cpu(result: LoadResult, pid: int | None) -> str:
    if pid is None:
        return "-"
    value = result.cpu_us_per_request(pid)
    return "n/a" if math.isnan(value) else f"{value:,.0f}"


def _split_cell(split: dict[str, float]) -> str:
    if not split:
        return "-"
    return " / ".join(
        f"{split[name]:.2f}" if name in split else "-"
        for name in ("request", "upstream", "claim", "receipt")
    )


def _verdict(value: str, met: bool) -> str:
    return f"{value} (met)" if met else f"{value} (**missed**)"
