"""From the issue's harness to `bench.run`'s, one factor at a time, in one run.

`bench.defaults` (the issue's harness) and `bench.run`'s HTTP rows measure the
same gateway differently. Their configs differ in two keys only
(`shared_scope`, the route's `timeout`) beside the log level; their loads in
the credential, the body, the replay keys and the Lua script; their upstreams
and their ratios' denominators in what stands behind the gateway (a bare
handler; the example tool API). This starts every server once and measures a
chain of variants for the replay and the miss path, each changing one factor
of the one before, from the issue's harness (uvloop, access log off: the
settings the issue compares with RESULTS.md) to `bench.run`'s own row:

0. the issue's harness: `Authorization: Bearer bench-tenant`, `shared_scope`
   false, one constant body, replay keys `replay-<n mod 50>`, route timeout 30 s,
   the bare handler upstream, `bench/wrk_defaults.lua`, `wrk -t1`;
1. a body of its own per key (the key over the padding, `bench.loadgen.JsonBodies`);
2. no credential, `shared_scope = true` (no HMAC of the credential per request);
3. 1000 replay keys (`bench.plan.Plan.replay_keys`) instead of 50 (replay only);
4. `bench/wrk_keys.lua` through `bench.wrk.run_wrk` (its key names, its warm-up);
5. `bench.gateway_config.write_gateway_config` (`timeout = "10s"`): bench's config;
6. the example tool API as the upstream: `bench.run`'s row exactly.

Beside the chain, with the issue's load: a second gateway with the same config
(the spread between two processes alike, the yardstick for the steps), `wrk
-t2`, and `require_key = false`.
And the denominators: the bare handler and the tool API (`bench.run`'s
`direct`) each under both loads, and both plain proxies (the issue's on
asyncio in front of the bare handler, `bench.run`'s on uvloop in front of the
tool API). Then the miss chain at c=1, for the added p50.

Every variant runs `--rounds` times (default 2), the whole list reversed every
other round. Printed: one row per variant, every round's req/s, p50, CPU per
answer, 409s. Needs wrk.

    python -m bench.defaults_factors                # 5 s windows, c=64, 2 rounds
    python -m bench.defaults_factors --rounds 3 --seconds 4
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from bench import defaults_servers, processes
from bench.defaults import ISSUES, ROUTE_PREFIX, Load, Window, run_window, warm_replay_keys
from bench.defaults import write_config as write_issue_config
from bench.gateway_config import sqlite_url, write_gateway_config
from bench.loadgen import KeyMode, LoadSpec
from bench.report import Table, ms
from bench.wrk import run_wrk, wrk_available, wrk_version

__all__ = ["Variant", "main", "measure_factors", "variants"]

BENCH_REPLAY_KEYS = 1000
"""`bench.plan.FULL.replay_keys`."""


@dataclass(frozen=True, slots=True)
class Variant:
    """One row: what it changes, which server it runs against, with which load."""

    path: str
    """"replay", "miss", "miss c=1" or "denominator"."""
    name: str
    server: str
    """A key of the started servers."""
    load: Load | None = None
    """The issue's script's load (`bench/wrk_defaults.lua`), or None: `bench_mode`."""
    bench_mode: KeyMode | None = None
    """`bench/wrk_keys.lua`'s mode through `bench.wrk.run_wrk` (bench.run's load)."""
    connections: int = 0
    """`bench_mode`'s concurrency (0: the run's `--connections`)."""
    gateway: bool = True


def variants(seconds: float, warmup: float, connections: int) -> list[Variant]:
    """The chains and the rows beside them, in the order they run."""
    issue = Load("miss", connections, seconds, warmup)
    rows: list[Variant] = []
    for path in ("replay", "miss"):
        load = replace(issue, mode="replay") if path == "replay" else issue
        # Its own replay keys: a key sent with the constant body is another request's.
        distinct = replace(load, distinct=True, prefix="replay-d")
        anonymous = replace(distinct, auth="")
        rows += [
            Variant(path, "0 the issue's harness", "issue", load),
            Variant(path, "1 + a body per key", "issue", distinct),
            Variant(path, "2 + no credential, shared_scope", "shared", anonymous),
        ]
        if path == "replay":
            many = replace(anonymous, keys=BENCH_REPLAY_KEYS, prefix="replay1k-")
            rows.append(Variant(path, "3 + 1000 replay keys", "shared", many))
        bench_mode: KeyMode = "replay" if path == "replay" else "new"
        rows += [
            Variant(path, "4 + bench/wrk_keys.lua", "shared", bench_mode=bench_mode),
            Variant(path, '5 + timeout "10s" (bench\'s config)', "bench", bench_mode=bench_mode),
            Variant(path, "6 + tool API upstream (bench.run's row)", "bench-api", None, bench_mode),
            Variant(path, "beside 0: a second gateway, the same config", "issue-2", load),
            Variant(path, "beside 0: wrk -t2", "issue", replace(load, threads=2)),
            Variant(path, "beside 0: require_key = false", "no-require", load),
        ]
    rows += [
        Variant("denominator", "bare handler, the issue's request", "bare", issue, gateway=False),
        Variant("denominator", "bare handler, bench's request", "bare", None, "none",
                gateway=False),
        Variant("denominator", "tool API, bench's request (bench.run's direct)", "api", None,
                "none", gateway=False),
        Variant("denominator", "tool API, the issue's request", "api", issue, gateway=False),
        Variant("denominator", "plain proxy (asyncio) -> bare, the issue's", "plain", issue,
                gateway=False),
        Variant("denominator", "plain proxy (uvloop) -> tool API, bench.run's", "plain-api",
                None, "none", gateway=False),
    ]  # fmt: skip
    single = replace(issue, connections=1)
    rows += [
        Variant("miss c=1", "bare handler, the issue's request", "bare", single, gateway=False),
        Variant("miss c=1", "tool API, bench's request (bench.run's direct)", "api", None,
                "none", connections=1, gateway=False),
        Variant("miss c=1", "0 the issue's harness", "issue", single),
        Variant("miss c=1", "1 + a body per key", "issue", replace(single, distinct=True)),
        Variant("miss c=1", "2 + no credential, shared_scope", "shared",
                replace(single, distinct=True, auth="")),
        Variant("miss c=1", "4 + bench/wrk_keys.lua", "shared", None, "new", connections=1),
        Variant("miss c=1", '5 + timeout "10s" (bench\'s config)', "bench", None, "new",
                connections=1),
        Variant("miss c=1", "6 + tool API upstream (bench.run's row)", "bench-api", None, "new",
                connections=1),
    ]  # fmt: skip
    return rows


@dataclass
class Factors:
    rows: list[Variant]
    windows: dict[int, list[Window]]
    load_average: list[tuple[float, float, float]]
    minutes: float


def measure_factors(
    workdir: Path,
    *,
    seconds: float,
    warmup: float,
    connections: int,
    rounds: int,
    only: Sequence[str] = (),
) -> Factors:
    """Start every server, run every variant `rounds` times, stop them all."""
    started = time.monotonic()
    rows = [v for v in variants(seconds, warmup, connections) if not only or v.path in only]
    windows: dict[int, list[Window]] = {index: [] for index in range(len(rows))}
    loads: list[tuple[float, float, float]] = []
    with contextlib.ExitStack() as stack:
        enter: Callable[[processes.ServerProcess], processes.ServerProcess] = stack.enter_context
        bare = enter(defaults_servers.server(workdir, "bare", loop="asyncio"))
        api = enter(processes.tool_api(workdir))
        servers = {
            "bare": bare,
            "api": api,
            "plain": enter(
                defaults_servers.server(workdir, "proxy", loop="asyncio", upstream=bare.url)
            ),
            "plain-api": enter(processes.plain_proxy(workdir, api.url)),
        }

        def gateway(name: str, config: Path) -> None:
            servers[name] = enter(processes.gateway(config, name=f"gateway {name}"))

        def issue_config(name: str, **changes: object) -> Path:
            route = {"require_key": False} if changes.pop("open", False) else {}
            return write_issue_config(
                workdir / f"factors-{name}.toml",
                upstream=bare.url,
                store_url=sqlite_url(workdir / f"factors-{name}.db"),
                level="warning",
                loop="uvloop",
                route=route,
                idempotency=changes,
            )

        gateway("issue", issue_config("issue"))
        gateway("issue-2", issue_config("issue-2"))  # the control: process-to-process spread
        gateway("shared", issue_config("shared", shared_scope=True))
        gateway("no-require", issue_config("no-require", open=True))
        for name, upstream in (("bench", bare.url), ("bench-api", api.url)):
            config = write_gateway_config(
                workdir / f"factors-{name}.toml",
                upstream=upstream,
                store_url=sqlite_url(workdir / f"factors-{name}.db"),
            )
            gateway(name, config)
        warmed: set[tuple[str, str, bool, str]] = set()
        for index in range(rounds):
            loads.append(os.getloadavg())
            order = list(range(len(rows)))
            if index % 2:
                order.reverse()
            print(f"round {index + 1} of {rounds}:", file=sys.stderr, flush=True)
            for position in order:
                row = rows[position]
                server = servers[row.server]
                url = server.url + (ROUTE_PREFIX if row.gateway else "") + ISSUES
                if row.load is not None:
                    load = row.load
                    if load.mode == "replay":
                        mark = (row.server, load.prefix, load.distinct, load.auth)
                        if mark not in warmed:
                            warm_replay_keys(url, load)
                            warmed.add(mark)
                    window = run_window(url, load, pid=server.pid, workdir=workdir)
                else:
                    assert row.bench_mode is not None
                    spec = LoadSpec(
                        url=url,
                        mode=row.bench_mode,
                        concurrency=row.connections or connections,
                        duration=seconds,
                        warmup=warmup,
                        replay_keys=BENCH_REPLAY_KEYS,
                        cpu_pids=(server.pid,),
                        client="wrk",
                    )
                    result = run_wrk(spec)
                    window = Window(result, result.server_cpu[str(server.pid)], -1)
                windows[position].append(window)
                r = window.result
                print(
                    f"  {row.path} | {row.name}: {window.answers_per_s:,.0f}/s "
                    f"(2xx {window.ok_per_s:,.0f}/s, 409 {window.refused}), "
                    f"p50 {ms(r.p50_ms)} ms, CPU {window.cpu_us:,.0f} us",
                    file=sys.stderr,
                    flush=True,
                )
        loads.append(os.getloadavg())
    return Factors(rows, windows, loads, (time.monotonic() - started) / 60)


def _median(values: Sequence[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.median(finite) if finite else math.nan


def factor_table(found: Factors) -> Table:
    """One row per variant: every round's figures, the median, and vs the row before."""
    body = []
    previous: dict[str, float] = {}
    for index, row in enumerate(found.rows):
        windows = found.windows[index]
        rates = [w.ok_per_s for w in windows]
        median = _median(rates)
        before = previous.get(row.path)
        chained = row.name[:1].isdigit() and row.path != "denominator"
        step = (
            f"{median / before:.2f}x"
            if chained and before and row.name[0] != "0" and not math.isnan(median)
            else "-"
        )
        if chained:
            previous[row.path] = median
        body.append(
            (
                row.path,
                row.name,
                " / ".join(f"{w.answers_per_s:,.0f}" for w in windows),
                " / ".join(f"{w.ok_per_s:,.0f}" for w in windows),
                step,
                " / ".join(ms(w.result.p50_ms) for w in windows),
                " / ".join(f"{w.cpu_us:,.0f}" for w in windows),
                " / ".join(str(w.refused) for w in windows),
                " / ".join(f"{w.result.non_2xx}/{w.result.errors}" for w in windows),
            )
        )
    header = (
        "path",
        "variant",
        "answers/s",
        "2xx/s",
        "2xx/s median vs the step before",
        "p50 ms",
        "server CPU us/answer",
        "409/429",
        "other non-2xx / errors",
    )
    return Table(header, tuple(body))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.defaults_factors",
        description="From the issue's harness to bench.run's, one factor at a time.",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a window")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c of the c>1 rows")
    parser.add_argument("--rounds", type=int, default=2, help="times every variant runs")
    parser.add_argument(
        "--only",
        action="append",
        choices=("replay", "miss", "denominator", "miss c=1"),
        help="only these paths (repeatable)",
    )
    args = parser.parse_args(argv)
    if not wrk_available():
        parser.error("wrk is not installed (Debian package wrk)")
    if args.rounds < 1 or args.connections < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--rounds and --connections >= 1, --seconds > 0, --warmup >= 0")
    with tempfile.TemporaryDirectory(prefix="gateway-factors-") as tmp:
        found = measure_factors(
            Path(tmp),
            seconds=args.seconds,
            warmup=args.warmup,
            connections=args.connections,
            rounds=args.rounds,
            only=tuple(args.only or ()),
        )
    loads = "; ".join(f"{a:.2f} {b:.2f} {c:.2f}" for a, b, c in found.load_average)
    print(
        f"{wrk_version()}; c={args.connections} (c=1 where named), {args.seconds:g} s windows "
        f"after {args.warmup:g} s warm-up, {args.rounds} rounds (figures: round 1 / round 2 "
        f"...), {found.minutes:.1f} min; load average at each round's start and at the end: "
        f"{loads}\n"
    )
    print(factor_table(found).render(), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
