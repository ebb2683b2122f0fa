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

The two goals are read from one run, as the HTTP rows' ratios: the gateway's
added p50 at c=1 (goal < 2 ms) and its throughput over direct's at c=16 (goal
>= 0.5x). Each gateway row also says where the gateway's own time went,
from its /metrics read before and after the row (warm-up included): the wait
for the MCP server, the claim's and the receipt's durable commits, the rest.
"""

from __future__ import annotations

import math
import re
import sys
import urllib.request
from dataclasses import dataclass, field
from importlib import metadata, util
from pathlib import Path
from typing import Literal, get_args

from bench import processes
from bench.gateway_config import MCP_PREFIX, sqlite_url, write_mcp_gateway_config
from bench.loadgen import LoadResult
from bench.mcp_load import McpLoadSpec, Protocol, run_mcp_load
from bench.plan import Plan
from bench.report import Table, ms, ratio

__all__ = [
    "ADDED_P50_GOAL_MS",
    "FORMS",
    "THROUGHPUT_GOAL",
    "McpForm",
    "McpRows",
    "mcp_comparison",
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

DIRECT = "direct"
GATEWAY = "gateway miss"
PASS_THROUGH = "gateway, no key"
ADDED_P50_GOAL_MS = 2.0
THROUGHPUT_GOAL = 0.5

_METRICS_TIMEOUT = 5.0
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

    @property
    def name(self) -> str:
        return f"MCP {self.front} ({_FORM_SHORT[self.form]})"


@dataclass
class McpRows:
    """The MCP rows in the order they ran, plus notes."""

    plan: Plan
    measured: list[McpMeasured] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def find(self, form: str, front: str, concurrency: int) -> McpMeasured | None:
        for row in self.measured:
            if (row.form, row.front, row.concurrency) == (form, front, concurrency):
                return row
        return None


def measure_mcp_rows(plan: Plan, workdir: Path) -> McpRows:
    """Run the plan's MCP forms, each server and gateway started and stopped in turn."""
    rows = McpRows(plan)
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


def _form_rows(rows: McpRows, workdir: Path, server: processes.ServerProcess, form: str) -> None:
    plan = rows.plan
    concurrencies = (plan.mcp_concurrency, 1)
    for concurrency in concurrencies:
        _run(rows, form, DIRECT, server.url, concurrency, server)
    config = write_mcp_gateway_config(
        workdir / f"mcp-{form}.toml",
        upstream=server.url,
        store_url=sqlite_url(workdir / f"gateway-mcp-{form}.db"),
    )
    with processes.gateway(config, name=f"gateway (MCP, {form})") as gateway:
        url = gateway.url + MCP_PREFIX
        for concurrency in concurrencies:
            _run(rows, form, GATEWAY, url, concurrency, server, gateway)
        if plan.mcp_pass_through and form == plan.mcp_forms[0]:
            for concurrency in concurrencies:
                _run(rows, form, PASS_THROUGH, url, concurrency, server, gateway, keyed=False)


def _run(
    rows: McpRows,
    form: str,
    front: str,
    url: str,
    concurrency: int,
    server: processes.ServerProcess,
    gateway: processes.ServerProcess | None = None,
    *,
    keyed: bool = True,
) -> McpMeasured:
    plan = rows.plan
    pids = (server.pid,) if gateway is None else (server.pid, gateway.pid)
    spec = McpLoadSpec(
        url=url,
        protocol=_FORM_PROTOCOL[form],
        concurrency=concurrency,
        duration=plan.mcp_duration or plan.duration,
        warmup=plan.warmup,
        cpu_pids=pids,
        keyed=keyed,
    )
    before = _metrics(gateway.url) if gateway is not None else {}
    result = run_mcp_load(spec)
    split = _split(before, _metrics(gateway.url)) if gateway is not None else {}
    row = McpMeasured(
        form=form,
        front=front,
        concurrency=concurrency,
        result=result,
        server_pid=server.pid,
        gateway_pid=gateway.pid if gateway is not None else None,
        split_ms=split,
    )
    rows.measured.append(row)
    print(
        f"  {row.name} c={concurrency}: {result.throughput:,.0f} calls/s, "
        f"p50 {ms(result.p50_ms)} ms, p99 {ms(result.p99_ms)} ms"
        + ("" if result.ok == result.responses else f", answers {result.statuses}")
        + (f", {result.errors} errors" if result.errors else ""),
        file=sys.stderr,
        flush=True,
    )
    return row


def _metrics(base_url: str) -> dict[str, float]:
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


def _split(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Mean ms per observation of each series over the row (absent when nothing was seen)."""
    split: dict[str, float] = {}
    for name in _SERIES:
        count = after.get(f"{name}_count", 0.0) - before.get(f"{name}_count", 0.0)
        total = after.get(f"{name}_sum", 0.0) - before.get(f"{name}_sum", 0.0)
        if count > 0:
            split[name] = total / count * 1000
    return split


def _http_impl() -> str:
    """Which HTTP parser uvicorn's "auto" picks: httptools when installed, else h11."""
    return "httptools" if util.find_spec("httptools") is not None else "h11"


# -- tables ----------------------------------------------------------------------------


def mcp_summary_table(rows: McpRows) -> Table:
    """One line per form: p50 at c=1 and throughput at the MCP concurrency, with the goals."""
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
                ms(direct1.result.p50_ms),
                ms(gateway1.result.p50_ms),
                _verdict(f"{added:+.2f}", not math.isnan(added) and added < ADDED_P50_GOAL_MS),
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
        "p50 direct, c=1 (ms)",
        "p50 gateway, c=1 (ms)",
        f"added p50, ms (goal < {ADDED_P50_GOAL_MS:g})",
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
