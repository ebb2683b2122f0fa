"""`python -m bench.run --quick`: the benchmark still runs end to end and reports every row.

The full benchmark takes minutes and its numbers are the lead's to read; this
only pins that every server starts, every row is measured and printed, and
no request failed, so `make bench` does not rot between runs. The miss rows
must also see no refusal: a load whose new keys sent one body for all would
measure the similar-operation guard's 409s (MCP: `isError` results) instead
of misses. It always runs
the aiohttp load generator, so it behaves the same with or without wrk
installed (CI has none); tests/test_bench_wrk.py covers wrk.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from suite_profile import is_full

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
QUICK_RUN_SECONDS = 900
"""Bounds only a hung run: unloaded, a quick run takes well under a minute, but on 2 cores
shared with the rest of the suite (and other work) it has taken two."""

GUARD_OFF = "gateway sqlite miss, similar guard off"
"""The guard's cost: the miss row again, with the route's `similar_guard = "off"`."""
THROUGHPUT_ROWS = (
    "direct",
    "plain proxy",
    "gateway sqlite miss",
    GUARD_OFF,
    "gateway sqlite replay",
    "gateway sqlite mix10",
    "gateway sqlite miss, log info",
)
UNREFUSED_ROWS = tuple(name for name in THROUGHPUT_ROWS if not name.endswith("mix10"))
"""Rows that must see no 409: no key, a distinct body per new key, or replays of
completed keys (mix10 may reuse a key still in flight: a correct 409)."""
LATENCY_ROWS = (
    "direct",
    "plain proxy",
    "gateway sqlite miss",
    GUARD_OFF,
    "gateway sqlite replay",
)
WORKER_ROWS = (
    "plain proxy, 1 process",
    "plain proxy, 2 processes",
    "gateway sqlite miss, 1 worker",
    "gateway sqlite miss, 2 workers",
)
MCP_FORMS = ("2025-11-25 session, JSON answers", "2026-07-28 stateless")
"""The quick run's MCP forms: one of each protocol generation."""
SCALE_ROWS = (
    "claim (POST, new key) p50",
    "claim (POST, new key) p99",
    "lookup (GET /operations/<key>) p50",
    "lookup (GET /operations/<key>) p99",
    "sweep batch, nothing due (blocks the loop)",
    "bytes on disk per operation",
)


def _table_rows(output: str, heading: str) -> dict[str, list[str]]:
    """The rows of the first Markdown table after `heading`, by their first cell."""
    section = output.split(heading, 1)[1]
    rows: dict[str, list[str]] = {}
    for line in section.splitlines()[2:]:
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows.setdefault(cells[0], cells[1:])
    return rows


def _quick_run(module: str, *options: str, quick: bool = True) -> subprocess.CompletedProcess[str]:
    """`python -m <module> --quick` (without `--quick` if not `quick`: `options` size the
    run), in a process group of its own: the servers it starts (tool API, plain proxy,
    gateways and their workers) are in it too, and all of them end with the test, even
    when the run is killed before it could stop them."""
    process = subprocess.Popen(
        [sys.executable, "-m", module, *(["--quick"] if quick else []), *options],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        output, errors = process.communicate(timeout=QUICK_RUN_SECONDS)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
    return subprocess.CompletedProcess(process.args, process.returncode, output, errors)


SMALLER_RUN = ("--duration", "0.2", "--rows", "2000")
"""`make test`'s quick run: every row and section as `--quick` has them, each row measured
for 0.2 s (not 0.5 s) and the large store-scale point at 2,000 operations (not 10,000).
`make test-full` runs `--quick` as it is."""

DEFAULTS_SMALLER_RUN = ("--seconds", "0.3", "--connections", "8", "--runs", "1", "--warmup", "0")
"""`make test`'s defaults run: `--quick`'s sizes (c=8, one run, no warm-up) with 0.3 s
windows instead of its 1 s. `make test-full` runs `--quick` itself."""


def test_quick_run_prints_every_row() -> None:
    """A quick run exits 0, prints every row, sees no failed request and writes no file."""
    before = RESULTS.read_bytes() if RESULTS.exists() else None
    smaller = () if is_full() else SMALLER_RUN
    completed = _quick_run("bench.run", "--client", "aiohttp", *smaller)
    assert completed.returncode == 0, completed.stderr[-3000:]
    output = completed.stdout
    assert "- load generator: aiohttp" in output, output

    throughput = _table_rows(output, "## Throughput")
    assert set(THROUGHPUT_ROWS) <= set(throughput), output
    for name in THROUGHPUT_ROWS:
        assert throughput[name][6] == "0/0", f"{name}: non-2xx/errors {throughput[name][6]}"
    for name in UNREFUSED_ROWS:
        assert throughput[name][5] == "0", f"{name}: {throughput[name][5]} refused (409)"
    assert set(LATENCY_ROWS) <= set(_table_rows(output, "## Latency at c=1")), output
    (guard,) = [line for line in output.splitlines() if "similar-operation guard on the" in line]
    assert "sqlite: c=8 " in guard, guard
    assert "c=1 p50 " in guard, guard
    assert set(SCALE_ROWS) <= set(_table_rows(output, "## Store scale")), output
    workers = _table_rows(output, "## Worker processes")
    assert set(WORKER_ROWS) <= set(workers), output
    for name in WORKER_ROWS:
        assert workers[name][8] == "0", f"{name}: {workers[name][8]} refused (409)"
        assert workers[name][9] == "0/0", f"{name}: non-2xx/errors {workers[name][9]}"
    assert "CPU per request, 2 processes vs 1: gateway sqlite miss" in output, output
    mcp = _table_rows(output, "## MCP tool calls")
    # Both protocol generations, each with direct and the gateway side by side at c=1.
    for form in MCP_FORMS:
        assert form in mcp, output
        direct, gateway, added, cpu = mcp[form][:4]
        assert " / " in direct, f"direct p50 / p99: {mcp[form]}"
        assert " / " in gateway, f"gateway p50 / p99: {mcp[form]}"
        assert added.startswith(("+", "-")), mcp[form]
        assert cpu.replace(",", "").isdigit(), f"gateway CPU per call: {mcp[form]}"
    assert "Gateway config: `bench.gateway_config.write_mcp_gateway_config`" in output, output
    for line in output.split("## MCP tool calls", 1)[1].splitlines():
        cells = line.split("|")
        if line.startswith(("| MCP direct", "| MCP gateway")):
            # isError (the guard's refusal among them) would count as not ok.
            assert cells[9].strip() == "0/0", f"failed MCP calls: {line}"
            assert "isError" not in line, f"refused MCP calls: {line}"
    large = _table_rows(output, "## Large MCP calls and everyone else")
    assert {"alone", "while 3 agents send large calls"} <= set(large), output
    after = RESULTS.read_bytes() if RESULTS.exists() else None
    assert after == before, "bench/RESULTS.md changed without --write"


def test_fairness_quick_run() -> None:
    """`python -m bench.fairness --quick`: noisy is refused `quota-exceeded` past its share
    of a route of 8 (4 streams, 4 calls), and quiet's calls, alone and while noisy holds
    that share, are all answered: none refused, none otherwise not ok."""
    completed = _quick_run("bench.fairness")
    output = completed.stdout
    assert completed.returncode == 0, output[-3000:] + completed.stderr[-3000:]
    rows = _table_rows(output, "## Fairness: one client holds its share of a route")
    shared = "quiet while noisy holds its share (4 streams, 4 calls)"
    assert {"quiet alone", shared} <= set(rows), output
    for name in ("quiet alone", shared):
        calls, _, _, not_ok, refused, _ = rows[name]
        assert int(calls) > 0, f"{name}: {rows[name]}"
        assert (not_ok, refused) == ("0", "0"), f"{name}: not ok / refused {rows[name]}"
    assert "(the next: HTTP 429 quota-exceeded)" in output, output
    assert "While noisy holds its share / alone: p50 " in output, output


DEFAULTS_COLUMNS = (
    "defaults (access log, uvloop)",
    "access log off (uvloop)",
    "asyncio loop (access log)",
    "asyncio, log off",
)
"""`bench.defaults`' gateways: the issue's harness with each log level and event loop."""


def test_defaults_quick_run() -> None:
    """`python -m bench.defaults --quick` (the issue's wrk harness, `make bench`'s headline
    section) prints its summary for all four gateways and every row, no answer failed,
    every replay was flagged `Idempotent-Replayed`, and it writes no file without --write.
    wrk drives it: skipped where wrk is missing, except in CI (`.ci/run` installs it)."""
    if shutil.which("wrk") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("wrk is not installed: .ci/run installs the Debian package wrk")
        pytest.skip("wrk is not installed (apt-get install wrk)")
    before = RESULTS.read_bytes() if RESULTS.exists() else None
    if is_full():
        completed = _quick_run("bench.defaults")
    else:
        completed = _quick_run("bench.defaults", *DEFAULTS_SMALLER_RUN, quick=False)
    output = completed.stdout
    assert completed.returncode == 0, output[-3000:] + completed.stderr[-3000:]
    summary = _table_rows(output, "## The defaults: the issue's harness")
    assert summary["gateway"] == list(DEFAULTS_COLUMNS), output
    for name in ("miss, a body per key, 2xx/s", "replay, answers/s"):
        assert all(cell.replace(",", "").isdigit() for cell in summary[name]), summary[name]
    targets = [name for name in summary if "target" in name]
    assert len(targets) == 3, summary
    for name in targets:
        assert all(cell.endswith(("(met)", "(**not met**)")) for cell in summary[name]), name
    assert "Baselines (same run, c=8): bare handler " in output, output
    details = [line for line in output.splitlines() if line.startswith("| ")]
    rows = [line.split("|")[1:-1] for line in details]
    loads = {(cells[0].strip(), cells[1].strip()) for cells in rows if len(cells) == 10}
    for server in ("bare handler", "plain proxy", "plain proxy (uvloop)", *DEFAULTS_COLUMNS):
        assert (server, "miss c=8") in loads, (server, output)
        assert (server, "miss c=1") in loads, (server, output)
    for server in DEFAULTS_COLUMNS:
        assert {(server, "miss, a body per key c=8"), (server, "replay")} <= loads, output
    for cells in rows:
        if len(cells) != 10 or cells[1].strip() == "load":
            continue
        assert cells[7].strip() == "0/0", f"failed answers: {cells}"
        if cells[1].strip().startswith(("miss, a body per key", "replay")):
            # No twins: each key its own body (replays never meet the guard).
            assert all(part.strip() == "0" for part in cells[6].split("/")), f"409: {cells}"
        if cells[1].strip() == "replay":
            assert cells[8].strip().startswith("all "), f"replays not flagged: {cells}"
            assert cells[8].strip() != "all 0", f"no replay answered: {cells}"
    after = RESULTS.read_bytes() if RESULTS.exists() else None
    assert after == before, "bench/RESULTS.md changed without --write"


@pytest.mark.parametrize(
    ("compare", "switch"), [("guard", "guard"), ("canonical", "canonical JSON")]
)
def test_guard_pair_alternates_windows(compare: str, switch: str) -> None:
    """`python -m bench.guard_pair` (a switch's cost in alternating windows: the similar
    guard, canonical JSON fingerprints) runs both gateways, prints the medians table,
    and no miss was refused."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.guard_pair", "--store", "sqlite", "--concurrency", "4",
         "--rounds", "2", "--seconds", "0.3", "--warmup", "0.1", "--client", "aiohttp",
         "--compare", compare],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=QUICK_RUN_SECONDS,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = _table_rows(completed.stdout, "| miss path, c=4, 2 windows each")
    assert {"req/s, median", "p50 ms, median", "server CPU us/req, median"} <= set(rows)
    assert rows["409, other non-2xx and errors, all windows"][:2] == ["0", "0"], rows
    assert completed.stderr.count(f"{switch} on: ") == completed.stderr.count(f"{switch} off: ")
    assert completed.stderr.count(f"{switch} on: ") == 2


def test_store_cpu_measures_durable_write_pairs(tmp_path: Path) -> None:
    """`python -m bench.store_cpu` (the store alone, for PROFILE.md) runs and reports."""
    from bench.store_cpu import measure

    rate, cpu_per_pair = asyncio.run(measure(tmp_path / "s.db", concurrency=4, duration=0.3))
    assert rate > 0
    assert 0 < cpu_per_pair < 1_000_000


@pytest.mark.parametrize(
    "module",
    [
        "bench.defaults",
        "bench.defaults_servers",
        "bench.fairness",
        "bench.jsonrpc_answers",
        "bench.large_mcp",
        "bench.loadgen",
        "bench.mcp_load",
        "bench.mcp_profile",
        "bench.prefill",
        "bench.procstat",
        "bench.report",
    ],
)
def test_bench_docstring_examples_run(module: str) -> None:
    """The examples in the benchmark helpers' docstrings run (the suite's doctest test
    covers `gateway` only)."""
    import doctest
    import importlib

    result = doctest.testmod(importlib.import_module(module), verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"


def test_mcp_profile_runs_its_variants(tmp_path: Path) -> None:
    """`python -m bench.mcp_profile` (bench/PROFILE.md's c=1 breakdown) runs a tiny
    series end to end: direct and the gateway's miss path, a table, every call ok."""
    out = tmp_path / "profile.json"
    completed = subprocess.run(
        [sys.executable, "-m", "bench.mcp_profile", "--form", "stateless", "--rounds", "1",
         "--calls", "20", "--variant", "direct", "--variant", "miss", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=QUICK_RUN_SECONDS,
        check=False,
    )  # fmt: skip
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = _table_rows(completed.stdout, "| stateless, c=1")
    assert {"direct", "miss"} <= set(rows), completed.stdout
    assert rows["miss"][-1] == "0", f"failed calls: {rows['miss']}"
    (profile,) = json.loads(out.read_text())
    assert [run["calls"] for run in profile["runs"]["miss"]] == [20]


def test_mcp_stdio_runs_its_four_rows() -> None:
    """`python -m bench.mcp_stdio` (HTTP and stdio MCP routes side by side, RESULTS.md)
    runs a tiny series end to end: four rows, every call ok, a split for each gateway."""
    completed = subprocess.run(
        [sys.executable, "-m", "bench.mcp_stdio", "--windows", "1", "--calls", "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=QUICK_RUN_SECONDS,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr[-3000:]
    rows = {
        line.split("|")[1].strip(): [cell.strip() for cell in line.split("|")[2:-1]]
        for line in completed.stdout.splitlines()
        if line.startswith("| ") and not line.startswith("| row")
    }
    assert set(rows) == {"HTTP direct", "HTTP gateway", "stdio direct", "stdio gateway"}
    for name, cells in rows.items():
        assert (cells[0], cells[-1]) == ("20", "0"), (name, cells)
    for name in ("HTTP gateway", "stdio gateway"):
        float(rows[name][3])  # the added p50, signed
        assert rows[name][4] != "-", rows[name]


def test_spool_quick_run() -> None:
    """`python -m bench.spool --quick` (spooled answers: the gateway's memory and disk while
    callers read large answers slowly) prints a row per phase and the series over time;
    every answer arrived intact, every gateway operation is `completed` with its body not
    kept, the slow readers' answers were seen in spool files, and the spool was back to
    no file and no byte at the end (else the run exits 1). Its docstring examples run."""
    import doctest

    import bench.spool

    result = doctest.testmod(bench.spool, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed"
    completed = _quick_run("bench.spool")
    output = completed.stdout
    assert completed.returncode == 0, output[-3000:] + completed.stderr[-3000:]
    rows = _table_rows(output, "## Spooled answers: memory and disk")
    gateways = (
        "gateway, slow readers",
        "gateway, slow readers, smaller answers",
        "gateway, full-speed readers",
    )
    phases = (*gateways, "plain proxy, slow readers")
    assert set(phases) <= set(rows), output
    for name in phases:
        assert rows[name][9] == "4/4", f"{name}: answers intact {rows[name][9]}"
    for name in gateways:
        assert rows[name][10] == "4/4", f"{name}: completed, body not kept {rows[name][10]}"
    slow = rows["gateway, slow readers"]
    assert int(slow[5]) >= 1, f"no spool file seen: {slow}"
    size, disk = (float(value) for value in slow[4].split(" / "))
    assert size > 0, f"spool peak, st_size: {slow}"
    assert disk > 0, f"spool peak, st_blocks: {slow}"
    series = _table_rows(output, "### gateway, slow readers: over time")
    *_, last = series.values()
    assert last[1:4] == ["0.0", "0.0", "0"], f"the spool at the end: {last}"
    assert last[4] == "4/4", f"callers done at the end: {last}"
