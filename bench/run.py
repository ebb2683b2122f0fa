"""`make bench`: the gateway against a plain aiohttp proxy, and the store at scale, in one run.

Starts, on 127.0.0.1 with OS-chosen ports: the example tool API, the plain
proxy, the gateway on a fresh SQLite file (again with the info-level access
log, for its cost), the gateway on a fresh PostgreSQL schema (skipped, with a
note, when the server is unreachable); then pre-fills SQLite stores for the
store-scale rows. Prints Markdown tables; `--write` also writes them, with
the machine's description, to bench/RESULTS.md.

    python -m bench.run --write      # the full run, under 10 minutes on 2 cores
    python -m bench.run --quick      # a smoke run of well under a minute

Every row's load comes from wrk when it is installed (`bench.wrk`), else
from the aiohttp generator (`bench.loadgen`); `--client` chooses.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from bench import processes
from bench.loadgen import Client
from bench.plan import FULL, QUICK, Plan
from bench.report import machine_info, write_results
from bench.scale import measure_scale_point, scale_table
from bench.scenarios import latency_table, measure_http_rows, throughput_table
from bench.wrk import SCRIPT, wrk_available, wrk_version

__all__ = ["main"]

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def run(plan: Plan) -> str:
    """Run every row of `plan` and return the results as Markdown."""
    started, machine = time.monotonic(), machine_info()
    generator = _generator_note(plan.client)
    with tempfile.TemporaryDirectory(prefix="gateway-bench-") as tmp:
        workdir = Path(tmp)
        with processes.tool_api(workdir) as api:
            print("HTTP rows:", file=sys.stderr, flush=True)
            rows = measure_http_rows(plan, workdir, api)
            print("store-scale rows:", file=sys.stderr, flush=True)
            small = measure_scale_point(plan, workdir, api, plan.small_store)
            large = measure_scale_point(plan, workdir, api, plan.large_store)
    minutes = (time.monotonic() - started) / 60
    return "\n".join(
        [
            "# Benchmark results",
            "",
            "Written by `make bench` (`python -m bench.run --write`). Compare ratios "
            "within one run, not absolute numbers across runs (PERF-NOTES).",
            "",
            *machine,
            f"- plan: c={plan.concurrency}, {plan.duration:g} s measured per row after "
            f"{plan.warmup:g} s warm-up, POST of a 200-byte JSON body; whole run "
            f"{minutes:.1f} min",
            f"- load generator: {generator}",
            "",
            "## Throughput",
            "",
            throughput_table(rows).render(),
            "",
            "Server CPU is the front process's only (the tool API for `direct`); "
            "PostgreSQL's own CPU is not in it. `409` are duplicate refusals "
            "(the key was in progress), not errors.",
            "",
            "## Latency at c=1",
            "",
            latency_table(rows).render(),
            "",
            "## Store scale",
            "",
            scale_table(small, large).render(),
            "",
            *(f"- {note}" for note in rows.notes),
        ]
    )


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


def _client(choice: str, parser: argparse.ArgumentParser) -> Client:
    """`--client`: auto is wrk when it is installed, else aiohttp."""
    if choice == "aiohttp":
        return "aiohttp"
    if wrk_available():
        return "wrk"
    if choice == "wrk":
        parser.error("--client wrk: wrk is not installed (Debian package wrk)")
    return "aiohttp"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.run", description="Benchmark the gateway against a plain proxy."
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run (c=8, 2 s rows)")
    parser.add_argument("--write", action="store_true", help=f"write the results to {RESULTS}")
    parser.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL rows")
    parser.add_argument("--concurrency", type=int, help="concurrency of the throughput rows")
    parser.add_argument("--duration", type=float, help="measured seconds per row")
    parser.add_argument("--rows", type=int, help="operations stored for the large scale run")
    parser.add_argument(
        "--client",
        choices=("auto", "wrk", "aiohttp"),
        default="auto",
        help="load generator (default auto: wrk if installed, else aiohttp)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark; print the tables; write RESULTS.md with `--write`."""
    parser = _parser()
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL
    overrides: dict[str, object] = {"client": _client(args.client, parser)}
    if args.no_postgres:
        overrides["postgres"] = False
    if args.concurrency is not None:
        overrides["concurrency"] = args.concurrency
    if args.duration is not None:
        overrides["duration"] = args.duration
    if args.rows is not None:
        overrides["large_store"] = args.rows
    text = run(plan.with_overrides(**overrides))
    print(text, flush=True)
    if args.write:
        write_results(RESULTS, text)
        print(f"written to {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
