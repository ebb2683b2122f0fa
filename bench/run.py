"""`make bench`: the gateway against a plain aiohttp proxy, and the store at scale, in one run.

First the headline section, the gateway as people run it (`bench.defaults`:
the issue's wrk harness, access log on, uvloop, a credential per request, in
front of a bare aiohttp handler, beside the same with the log off; one window
per row, wrk only). Then starts,
on 127.0.0.1 with OS-chosen ports: the example tool API, the plain
proxy, the gateway on a fresh SQLite file (beside it the same gateway with
`similar_guard = "off"`, for the guard's cost on the miss path; then again
with the info-level access log, for its cost), the gateway on a fresh
PostgreSQL schema (with its guard-off twin; skipped, with a note, when the
server is unreachable); then pre-fills SQLite stores for the
store-scale rows; then runs the plain proxy and the gateway as 1 and as 2
processes on one port (`bench.worker_rows`). Prints Markdown tables;
`--write` also writes them, with the machine's description, to
bench/RESULTS.md.

    python -m bench.run --write          # the full run, about 12 minutes on 2 cores
    python -m bench.run --quick          # a smoke run of well under a minute
    python -m bench.run --only mcp       # only the MCP rows (prints; never writes)
    python -m bench.run --only workers   # only the worker-process rows
    python -m bench.run --only defaults  # only the headline section (bench.defaults)

Every HTTP row's load comes from wrk when it is installed (`bench.wrk`), else
from the aiohttp generator (`bench.loadgen`); `--client` chooses. The MCP
rows (`bench.mcp_rows`: an official-SDK MCP server, direct and through a
gateway MCP route) always run on their own aiohttp generator, `bench.mcp_load`.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import processes
from bench.defaults import COLUMNS, Defaults, measure_defaults
from bench.defaults import section as defaults_section
from bench.large_mcp import LargeCalls, measure_large_calls
from bench.large_mcp import section as large_section
from bench.loadgen import Client
from bench.mcp_rows import (
    FORMS,
    McpRows,
    mcp_comparison,
    mcp_detail_table,
    mcp_summary_table,
    measure_mcp_rows,
)
from bench.plan import FULL, QUICK, Plan
from bench.report import machine_info, write_results
from bench.scale import ScalePoint, measure_scale_point, scale_table
from bench.scenarios import (
    DIRECT,
    Rows,
    guard_summary,
    latency_table,
    measure_http_rows,
    throughput_table,
)
from bench.worker_rows import WorkerRows, measure_worker_rows, worker_section
from bench.wrk import SCRIPT, add_client_option, chosen_client, wrk_available, wrk_version

__all__ = ["main"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"
HTTP_MISS = "gateway sqlite miss"
"""The HTTP row the MCP rows' added latency is compared with (`bench.scenarios`)."""
SECTIONS = ("defaults", "http", "scale", "workers", "mcp", "large")
"""What `--only` can pick: the defaults harness, the HTTP rows, the store-scale rows, the
worker-process rows, the MCP rows, the large-MCP-call row."""
DEFAULTS_SECONDS = 5.0
"""The defaults harness's window (the issue's `-d5s`; shorter if the plan's rows are)."""
DEFAULTS_COLUMNS = tuple(column for column in COLUMNS if column.loop == "uvloop")
"""The defaults harness's gateways in `make bench`: the defaults and the access log off
(the asyncio ones would take another minute of the run's 12)."""
_ON_HTTP = ("http", "scale", "workers")
"""The sections whose rows run on the tool API and the chosen HTTP load generator."""


def run(plan: Plan, sections: Sequence[str] = SECTIONS) -> str:
    """Run every row of `plan` in `sections` and return the results as Markdown."""
    started, machine = time.monotonic(), machine_info()
    if "workers" in sections and not plan.worker_counts:
        sections = tuple(section for section in sections if section != "workers")
    on_http = any(section in _ON_HTTP for section in sections)
    generator = _generator_note(plan.client) if on_http else None
    rows: Rows | None = None
    scale: tuple[ScalePoint, ScalePoint] | None = None
    workers: WorkerRows | None = None
    mcp: McpRows | None = None
    large: LargeCalls | None = None
    defaults: Defaults | None = None
    skipped: list[str] = []
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        workdir = Path(tmp)
        if "defaults" in sections and plan.client != "wrk":
            why = "wrk is not installed" if not wrk_available() else "--client aiohttp"
            skipped.append(f"The defaults section (the issue's wrk harness) not run: {why}.")
        elif "defaults" in sections:
            print("defaults (the issue's harness):", file=sys.stderr, flush=True)
            defaults = measure_defaults(
                workdir,
                seconds=min(DEFAULTS_SECONDS, plan.duration),
                connections=plan.concurrency,
                runs=1,
                warmup=plan.warmup,
                columns=DEFAULTS_COLUMNS,
            )
            defaults.notes.append(
                "`make bench` runs the uvloop columns only (its time); `python -m "
                "bench.defaults` adds the asyncio ones and measures every row twice."
            )
        if on_http:
            with processes.tool_api(workdir) as api:
                if "http" in sections:
                    print("HTTP rows:", file=sys.stderr, flush=True)
                    rows = measure_http_rows(plan, workdir, api)
                if "scale" in sections:
                    print("store-scale rows:", file=sys.stderr, flush=True)
                    small = measure_scale_point(plan, workdir, api, plan.small_store)
                    big = measure_scale_point(plan, workdir, api, plan.large_store)
                    scale = (small, big)
                if "workers" in sections:
                    print("worker-process rows:", file=sys.stderr, flush=True)
                    workers = measure_worker_rows(plan, workdir, api)
        if "mcp" in sections and plan.mcp_forms:
            print("MCP rows:", file=sys.stderr, flush=True)
            mcp = measure_mcp_rows(plan, workdir)
        if "large" in sections:
            print("large MCP calls:", file=sys.stderr, flush=True)
            large = measure_large_calls(workdir, seconds=plan.large_call_seconds)
    minutes = (time.monotonic() - started) / 60
    lines = [
        "# Benchmark results",
        "",
        "Written by `make bench` (`python -m bench.run --write`). Compare ratios "
        "within one run, not absolute numbers across runs: on a shared machine they "
        "move 15-25% between runs.",
        "",
        *machine,
    ]
    if generator is not None:
        lines += [
            f"- plan: c={plan.concurrency}, {plan.duration:g} s measured per row after "
            f"{plan.warmup:g} s warm-up, POST of a 200-byte JSON body (the key in its "
            f"padding: each new key a distinct request); whole run {minutes:.1f} min",
            f"- load generator: {generator}",
        ]
    else:
        lines.append(f"- plan: {', '.join(sections)} rows only; whole run {minutes:.1f} min")
    if defaults is not None:
        lines += ["", *defaults_section(defaults)]
    if rows is not None:
        guard = guard_summary(rows)
        lines += [
            "",
            "## Throughput",
            "",
            throughput_table(rows).render(),
            "",
            "Server CPU is the front process's only (the tool API for `direct`); "
            "PostgreSQL's own CPU is not in it. `409` are duplicate refusals "
            "(the key was in progress, or a new key for the same request as one in "
            "flight), not errors; the miss rows send a distinct body per key, so they "
            "should have none.",
            *(["", *guard] if guard else []),
            "",
            "## Latency at c=1",
            "",
            latency_table(rows).render(),
        ]
    if scale is not None:
        lines += ["", "## Store scale", "", scale_table(*scale).render()]
    if workers is not None:
        lines += ["", *worker_section(workers)]
    if mcp is not None and mcp.measured:
        lines += ["", *_mcp_section(plan, mcp, rows)]
    if large is not None:
        lines += ["", *large_section(large)]
    notes = [
        *skipped,
        *(rows.notes if rows else []),
        *(workers.notes if workers else []),
        *(mcp.notes if mcp else []),
    ]
    if notes:
        lines += ["", *(f"- {note}" for note in notes)]
    return "\n".join(lines)


def _mcp_section(plan: Plan, mcp: McpRows, http: Rows | None) -> list[str]:
    duration = plan.mcp_duration or plan.duration
    compare = mcp_comparison(mcp)
    direct, miss = (http.find(DIRECT, 1), http.find(HTTP_MISS, 1)) if http else (None, None)
    if direct is not None and miss is not None:
        added = miss.result.p50_ms - direct.result.p50_ms
        compare.append(f"the HTTP miss row of this run added {added:+.2f} ms at c=1")
    return [
        "## MCP tool calls",
        "",
        "`create_ticket` (a side effect, answered as structured content) on an "
        "official-SDK MCP server over Streamable HTTP, called directly and through a "
        "gateway MCP route (SQLite store), with a fresh `params._meta.idempotencyKey` "
        "every call (the miss path) and the key in its arguments (each call a distinct "
        "request, so the similar-operation guard finds no twin); c=1 for latency, "
        f"c={plan.mcp_concurrency} for throughput, {duration:g} s measured per row after "
        f"{plan.warmup:g} s warm-up. "
        f"Each c=1 row is measured in {plan.mcp_segments} windows that alternate with "
        "direct's (and the key-less row's) against the same server process, so both "
        "see the machine alike; its p50 and p99 are over all its windows' calls.",
        "",
        f"Gateway config: {mcp.config}",
        "",
        mcp_summary_table(mcp).render(),
        *(["", "For comparison: " + "; ".join(compare) + "."] if compare else []),
        "",
        mcp_detail_table(mcp).render(),
        "",
        "CPU is per answered call, over the measured window. The gateway's time split "
        "is its own /metrics over the whole row (warm-up included): the whole request, "
        "the wait for the MCP server's answer, and the claim's and the receipt's "
        "durable commits (each including its wait for a group commit). `not ok` are "
        "answers other than the tool's own success (counted by kind in the notes); "
        '"gateway, no key" is a call the gateway passes on unrecorded (the hop alone).',
    ]


def _generator_note(client: Client) -> str:
    """What drove every row, for the results header (read before the run: it runs wrk)."""
    if client == "wrk":
        script = SCRIPT.relative_to(processes.ROOT)
        return (
            f"{wrk_version()}, one thread, closed loop, Lua script {script} "
            "(replay keys sent once beforehand with aiohttp)"
        )
    why = "wrk is not installed" if not wrk_available() else "chosen with --client aiohttp"
    return f"aiohttp, closed loop, in its own process ({why})"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description="Benchmark the gateway against a plain proxy."
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (c=8, 0.5 s rows)")
    parser.add_argument("--write", action="store_true", help=f"write the results to {RESULTS}")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL rows")
    parser.add_argument("--concurrency", type=int, help="concurrency of the throughput rows")
    parser.add_argument("--duration", type=float, help="measured seconds per row")
    parser.add_argument("--rows", type=int, help="operations stored for the large scale run")
    parser.add_argument(
        "--only",
        action="append",
        choices=SECTIONS,
        help="run only these rows (repeatable; prints, cannot --write)",
    )
    parser.add_argument(
        "--mcp-form",
        action="append",
        choices=FORMS,
        help="MCP answer forms to measure (repeatable; default: the plan's)",
    )
    add_client_option(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the tables; write RESULTS.md with `--write`."""
    parser = _parser()
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    overrides: dict[str, object] = {"client": chosen_client(args.client, parser)}
    if args.no_postgres:
        overrides["postgres"] = False
    if args.concurrency is not None:
        overrides["concurrency"] = args.concurrency
    if args.duration is not None:
        overrides["duration"] = overrides["mcp_duration"] = args.duration
    if args.rows is not None:
        overrides["large_store"] = args.rows
    if args.mcp_form:
        overrides["mcp_forms"] = tuple(dict.fromkeys(args.mcp_form))
    if args.only and args.write:
        parser.error("--only: a partial run cannot --write (RESULTS.md holds the whole run)")
    text = run(plan.with_overrides(**overrides), tuple(args.only or SECTIONS))
    print(text, flush=True)
    if args.write:
        write_results(RESULTS, text)
        print(f"written to {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
