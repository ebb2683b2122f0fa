"""Where the MCP miss path's added latency goes at c=1: variants run interleaved, round by round.

`make bench` says how much a gateway MCP miss adds over calling the server
directly; this says why, for bench/PROFILE.md ("MCP miss path at c=1"). Each
variant removes or adds one cost, and all of them run against the same MCP
server, in rounds, in a rotating order, so a neighbour's load on this shared
machine falls on every variant alike; each variant's added p50 is taken
against `direct` of the same round.

Variants (`--variant`, repeatable; default all but `worktree`):

- `direct`: the MCP server itself;
- `plain`: `bench.plain_proxy` in front of it (an aiohttp hop and nothing else);
- `no-key`: the gateway, calls without a key (passed through unrecorded: the
  gateway's own hop);
- `miss`: the gateway's miss path with the bench config (`bench.gateway_config`:
  store on disk, log level warning, uvloop);
- `miss-info`: the same at log level info (the production default: one JSON
  access-log line a call);
- `miss-tmpfs`: the store on /dev/shm (fsync is free: the durable commits'
  disk time taken out);
- `miss-asyncio`: without uvloop (asyncio's own loop);
- `worktree`: the miss path on the gateway code of `--worktree DIR` (a scratch
  copy with an experimental change, e.g. `git worktree add /tmp/perf-wt HEAD`;
  run from that directory), as it is;
- `--experiment NAME=VAR=VALUE[,VAR=VALUE]` (repeatable): the `--worktree`
  gateway again with these environment variables, for changes switched on by
  a variable there, so that several of them run in one interleaved series.

For a gateway variant it also reads, around each run, the gateway's CPU by
thread (event loop, SQLite commit thread), its context switches, and its
/metrics time split (wait for the server, claim and receipt commits), each
per call. Every run is bounded by `--calls` and by `--max-seconds`.

    python -m bench.mcp_profile --rounds 5 --calls 2000
    python -m bench.mcp_profile --form stateless --variant direct --variant miss \\
        --variant worktree --worktree /tmp/perf-wt --experiment onloop=GATEWAY_EXP_ONLOOP=1
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import get_args

from bench import processes
from bench.gateway_config import MCP_PREFIX, LogLevel, sqlite_url, write_mcp_gateway_config
from bench.mcp_load import McpLoadSpec, run_mcp_load
from bench.mcp_rows import FORMS, form_protocol, form_uses_sse, metrics_sample, metrics_split
from bench.procstat import context_switches, thread_cpu
from bench.report import Table, ms

__all__ = ["VARIANTS", "Variant", "main", "profile"]

TMPFS = Path("/dev/shm")
FSYNC_PROBES = 30
"""fdatasyncs timed on the store's disk before each run (`Run.fsync_us`)."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One way of reaching the MCP server."""

    name: str
    front: str  # "direct", "plain" or "gateway"
    keyed: bool = True
    log_level: LogLevel = "warning"
    tmpfs: bool = False
    uvloop: bool = True
    worktree: bool = False
    env: tuple[tuple[str, str], ...] = ()
    """Environment variables of a worktree gateway (`--experiment`)."""
    about: str = ""


VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("direct", "direct", about="the MCP server itself"),
        Variant("plain", "plain", about="bench.plain_proxy in front: an aiohttp hop, no more"),
        Variant("no-key", "gateway", keyed=False, about="gateway, no key: passed through"),
        Variant("miss", "gateway", about="gateway miss, bench config (disk, warning, uvloop)"),
        Variant("miss-info", "gateway", log_level="info", about="miss, log level info"),
        Variant("miss-tmpfs", "gateway", tmpfs=True, about="miss, store on tmpfs"),
        Variant("miss-asyncio", "gateway", uvloop=False, about="miss, asyncio loop"),
        Variant("worktree", "gateway", worktree=True, about="miss, --worktree's gateway code"),
    )
}
DEFAULT_VARIANTS = tuple(name for name in VARIANTS if name != "worktree")


@dataclass
class Run:
    """One variant's run in one round."""

    p50_ms: float
    p99_ms: float
    calls: int
    errors: int
    not_ok: int
    cpu_us: float | None = None
    """The gateway's (or plain proxy's) CPU per answered call, measured window."""
    server_cpu_us: float | None = None
    loop_us: float | None = None
    """Gateway CPU per call of its main thread, the event loop (whole run, warm-up
    included, per call counted in its /metrics)."""
    helpers_us: float | None = None
    """Likewise, of all its other threads (SQLite's commit thread among them)."""
    switches: float | None = None
    """Gateway context switches per call (whole run, per /metrics call)."""
    split_ms: dict[str, float] = field(default_factory=dict)
    load: float = 0.0
    """The machine's 1-minute load average when the run ended (others' work included)."""
    fsync_us: float = 0.0
    """p50 of `FSYNC_PROBES` fdatasyncs of a 4 KiB overwrite on the store's disk, just
    before the run: what a durable commit waited for the disk then."""


@dataclass
class Profile:
    form: str
    variants: list[str]
    runs: dict[str, list[Run]] = field(default_factory=dict)
    direct: list[float] = field(default_factory=list)
    """Direct's p50 of each round (when it ran), for the per-round added p50."""


def experiment(spec: str) -> Variant:
    """`NAME=VAR=VALUE[,VAR=VALUE...]`: the worktree's gateway with these variables.

    `log_level=LEVEL` among them sets the gateway config's log level instead.

    >>> experiment("onloop=GATEWAY_EXP_ONLOOP=1").env
    (('GATEWAY_EXP_ONLOOP', '1'),)
    >>> experiment("fast=GATEWAY_EXP_FASTLOG=1,log_level=info").log_level
    'info'
    """
    name, _, assignments = spec.partition("=")
    pairs = []
    log_level: LogLevel = "warning"
    for assignment in assignments.split(","):
        variable, equals, value = assignment.partition("=")
        if not name or not variable or not equals:
            raise ValueError(f"--experiment: expected NAME=VAR=VALUE[,VAR=VALUE], got {spec!r}")
        if variable == "log_level":  # not a variable: the gateway config's [logging] level
            if value not in get_args(LogLevel):
                raise ValueError(f"--experiment: log_level must be one of {get_args(LogLevel)}")
            log_level = value  # type: ignore[assignment]
            continue
        pairs.append((variable, value))
    return Variant(
        name, "gateway", worktree=True, env=tuple(pairs), log_level=log_level, about=spec
    )


def profile(
    form: str,
    variants: Sequence[Variant],
    *,
    rounds: int,
    calls: int,
    max_seconds: float,
    workdir: Path,
    worktree: Path | None = None,
    on_run: Callable[[Profile], None] = lambda _: None,
) -> Profile:
    """Run `variants` in `rounds`, each run `calls` calls at c=1 (bounded by `max_seconds`);
    `on_run` sees the profile so far after every run."""
    result = Profile(form, [variant.name for variant in variants])
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(
            processes.mcp_server(workdir, json_response=not form_uses_sse(form))
        )
        fronts = {
            variant.name: stack.enter_context(_front(variant, form, server, workdir, worktree))
            for variant in variants
        }
        for number in range(rounds):
            shift = number % len(variants)
            for variant in [*variants[shift:], *variants[:shift]]:
                run = _measure(
                    variant, form, fronts[variant.name], server, calls, max_seconds, workdir
                )
                result.runs.setdefault(variant.name, []).append(run)
                on_run(result)
                print(
                    f"  {form} round {number + 1} {variant.name}: p50 {ms(run.p50_ms)} ms, "
                    f"p99 {ms(run.p99_ms)} ms"
                    + (f", CPU {run.cpu_us:,.0f} us/call" if run.cpu_us is not None else "")
                    + f", load {run.load:.1f}, disk fsync p50 {run.fsync_us:,.0f} us"
                    + (f", {run.errors} errors" if run.errors else "")
                    + (f", {run.not_ok} not ok" if run.not_ok else ""),
                    file=sys.stderr,
                    flush=True,
                )
    return result


@contextlib.contextmanager
def _front(
    variant: Variant,
    form: str,
    server: processes.ServerProcess,
    workdir: Path,
    worktree: Path | None,
) -> Iterator[processes.ServerProcess | None]:
    if variant.front == "direct":
        yield None
        return
    if variant.front == "plain":
        base = server.url.rsplit("/", 1)[0]
        with processes.plain_proxy(workdir, base) as proxy:
            yield proxy
        return
    if variant.worktree and worktree is None:
        raise ValueError("the worktree variant needs --worktree DIR")
    store_dir = Path(tempfile.mkdtemp(dir=TMPFS)) if variant.tmpfs else workdir
    config = write_mcp_gateway_config(
        workdir / f"profile-{form}-{variant.name}.toml",
        upstream=server.url,
        store_url=sqlite_url(store_dir / f"profile-{form}-{variant.name}.db"),
        log_level=variant.log_level,
    )
    env = dict(variant.env)
    if not variant.uvloop:
        env["PYTHONPATH"] = str(_no_uvloop(workdir))
    cwd = worktree if variant.worktree and worktree is not None else processes.ROOT
    try:
        with processes.gateway(
            config, name=f"gateway ({variant.name})", env=env or None, cwd=cwd
        ) as gateway:
            yield gateway
    finally:
        if variant.tmpfs:
            for path in store_dir.iterdir():
                path.unlink()
            store_dir.rmdir()


def _no_uvloop(workdir: Path) -> Path:
    """A directory whose `uvloop` fails to import: the gateway then runs asyncio's loop."""
    shim = workdir / "no-uvloop"
    (shim / "uvloop").mkdir(parents=True, exist_ok=True)
    (shim / "uvloop" / "__init__.py").write_text("raise ImportError('uvloop hidden')\n")
    return shim


def fsync_p50(directory: Path, probes: int = 0) -> float:
    """p50 microseconds of `probes` (default `FSYNC_PROBES`) fdatasyncs, each after a
    4 KiB overwrite of a file in `directory` (a few ms when the disk is idle).

    >>> fsync_p50(Path(tempfile.gettempdir()), 3) > 0
    True
    """
    path = directory / f"fsync-probe-{os.getpid()}"
    timings = []
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.pwrite(descriptor, bytes(4096 * 8), 0)
        os.fsync(descriptor)
        for number in range(probes or FSYNC_PROBES):
            os.pwrite(descriptor, os.urandom(4096), (number % 8) * 4096)
            started = time.perf_counter()
            os.fdatasync(descriptor)
            timings.append((time.perf_counter() - started) * 1e6)
    finally:
        os.close(descriptor)
        path.unlink()
    return statistics.median(timings)


def _measure(
    variant: Variant,
    form: str,
    front: processes.ServerProcess | None,
    server: processes.ServerProcess,
    calls: int,
    max_seconds: float,
    workdir: Path,
) -> Run:
    if front is None:
        url, pids = server.url, (server.pid,)
    elif variant.front == "plain":
        url, pids = front.url + "/" + server.url.split("/", 3)[3], (front.pid, server.pid)
    else:
        url, pids = front.url + MCP_PREFIX, (front.pid, server.pid)
    gateway = front if variant.front == "gateway" else None
    spec = McpLoadSpec(
        url=url,
        protocol=form_protocol(form),
        concurrency=1,
        duration=max_seconds,
        warmup=0.3,
        requests=calls,
        cpu_pids=pids,
        keyed=variant.keyed,
    )
    disk = fsync_p50(workdir)
    before = _gateway_sample(gateway) if gateway is not None else None
    result = run_mcp_load(spec)
    after = _gateway_sample(gateway) if gateway is not None else None
    run = Run(
        p50_ms=result.p50_ms,
        p99_ms=result.p99_ms,
        calls=result.responses,
        errors=result.errors,
        not_ok=result.non_2xx,
        server_cpu_us=result.cpu_us_per_request(server.pid),
        load=float(Path("/proc/loadavg").read_text().split()[0]),
        fsync_us=disk,
    )
    if front is not None:
        run.cpu_us = result.cpu_us_per_request(front.pid)
    if before is not None and after is not None:
        count = after.metrics.get("request_count", 0.0) - before.metrics.get("request_count", 0.0)
        if count > 0:
            pid = gateway.pid if gateway is not None else 0
            used = {tid: cpu - before.threads.get(tid, 0.0) for tid, cpu in after.threads.items()}
            run.loop_us = used.pop(pid, 0.0) / count * 1e6
            run.helpers_us = sum(used.values()) / count * 1e6
            run.switches = (after.switches - before.switches) / count
        run.split_ms = metrics_split(before.metrics, after.metrics)
    return run


@dataclass
class _Sample:
    metrics: dict[str, float]
    threads: dict[int, float]
    switches: int


def _gateway_sample(gateway: processes.ServerProcess) -> _Sample:
    metrics = metrics_sample(gateway.url)  # first: its own request is not in the thread CPU
    return _Sample(metrics, thread_cpu(gateway.pid), context_switches(gateway.pid))


# -- the table ---------------------------------------------------------------------------


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


def _spread(values: Sequence[float], digits: int = 2) -> str:
    if not values:
        return "-"
    middle = _median(values)
    if len(values) == 1:
        return f"{middle:.{digits}f}"
    return f"{middle:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def profile_table(result: Profile) -> Table:
    """One line per variant: medians over the rounds, with the range in parentheses."""
    direct = [run.p50_ms for run in result.runs.get("direct", [])]
    body = []
    for name in result.variants:
        runs = result.runs.get(name, [])
        added = (
            [run.p50_ms - base for run, base in zip(runs, direct, strict=False)]
            if direct and name != "direct"
            else []
        )
        loop = [r.loop_us for r in runs if r.loop_us is not None]
        commit = [r.helpers_us for r in runs if r.helpers_us is not None]
        switches = [r.switches for r in runs if r.switches is not None]
        split = [r.split_ms for r in runs if r.split_ms]
        body.append(
            (
                name,
                _spread([r.p50_ms for r in runs]),
                _spread([r.p99_ms for r in runs], 1),
                _spread(added) if added else "-",
                _spread([r.cpu_us for r in runs if r.cpu_us is not None], 0) or "-",
                (f"{_median(loop):,.0f} / {_median(commit):,.0f}" if loop else "-"),
                f"{_median(switches):.1f}" if switches else "-",
                _split_cell(split),
                _spread([r.server_cpu_us for r in runs if r.server_cpu_us is not None], 0),
                _spread([r.fsync_us for r in runs], 0),
                str(sum(r.errors + r.not_ok for r in runs)),
            )
        )
    header = (
        f"{result.form}, c=1",
        "p50 ms",
        "p99 ms",
        "added p50 vs direct, ms",
        "front CPU us/call",
        "loop / other threads us/call",
        "ctx switches/call",
        "gateway mean ms: server / claim / receipt",
        "MCP server CPU us/call",
        "disk fsync p50 us, before the run",
        "failed",
    )
    return Table(header, tuple(body))


def _split_cell(splits: Sequence[dict[str, float]]) -> str:
    if not splits:
        return "-"
    parts = []
    for name in ("upstream", "claim", "receipt"):
        values = [s[name] for s in splits if name in s]
        parts.append(f"{_median(values):.2f}" if values else "-")
    return " / ".join(parts)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mcp_profile",
        description="Interleaved c=1 runs of gateway variants against one MCP server.",
    )
    parser.add_argument(
        "--form",
        action="append",
        choices=FORMS,
        help="MCP answer form (repeatable; default: session-sse and stateless)",
    )
    parser.add_argument(
        "--variant", action="append", choices=tuple(VARIANTS), help="variant (repeatable)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--calls", type=int, default=1500, help="measured calls a run")
    parser.add_argument(
        "--max-seconds", type=float, default=30.0, help="bound on a run's measured window"
    )
    parser.add_argument("--worktree", type=Path, help="a repository copy (the worktree variant)")
    parser.add_argument(
        "--experiment",
        action="append",
        default=[],
        metavar="NAME=VAR=VALUE[,VAR=VALUE]",
        help="the --worktree gateway with these environment variables (repeatable); "
        "log_level=LEVEL among them sets its config's log level",
    )
    parser.add_argument("--json", type=Path, help="also write every run's numbers here")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    forms = tuple(dict.fromkeys(args.form or ("session-sse", "stateless")))
    parser = _parser()
    names = tuple(dict.fromkeys(args.variant or DEFAULT_VARIANTS))
    try:
        variants = [VARIANTS[name] for name in names] + [experiment(e) for e in args.experiment]
    except ValueError as exc:
        parser.error(str(exc))
    if any(variant.worktree for variant in variants) and args.worktree is None:
        parser.error("the worktree variant and --experiment need --worktree DIR")
    if len({variant.name for variant in variants}) != len(variants):
        parser.error("two variants have one name")
    if args.rounds < 1 or args.calls < 1 or args.max_seconds <= 0:
        parser.error("--rounds and --calls must be >= 1, --max-seconds > 0")
    started = time.monotonic()
    results: list[Profile] = []

    def save(current: Profile) -> None:
        if args.json is not None:
            done = [r for r in results if r is not current]
            args.json.write_text(json.dumps([asdict(r) for r in [*done, current]], indent=1))

    with tempfile.TemporaryDirectory(prefix="gateway-mcp-profile-") as tmp:
        for form in forms:
            result = profile(
                form,
                variants,
                rounds=args.rounds,
                calls=args.calls,
                max_seconds=args.max_seconds,
                workdir=Path(tmp),
                worktree=args.worktree.resolve() if args.worktree else None,
                on_run=save,
            )
            results.append(result)
            print(profile_table(result).render(), end="\n\n", flush=True)
    print(
        f"{args.rounds} rounds of {args.calls} calls a variant, "
        f"{(time.monotonic() - started) / 60:.1f} min; medians, (min-max) over the rounds."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
