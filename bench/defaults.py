"""The gateway as people run it: the issue's wrk harness, every column in one run.

`make bench`'s tuned rows (`bench.scenarios`) measure a gateway with the access
log off (`[logging] level = "warning"`) and no credential (`shared_scope =
true`), against the example tool API. People run the defaults: the JSON access
log (`level = "info"`, a line per request on stderr), uvloop (`[server] loop`,
default "uvloop"), a credential per request. This is the issue's harness,
exactly, with both event loops and both log levels side by side:

- a bare aiohttp handler (`bench.defaults_servers bare`: 201 and a small JSON
  body to any POST) and a plain aiohttp reverse proxy in front of it
  (`bench.plain_proxy`'s app), both on asyncio's own loop as in the issue; the
  plain proxy once more as `python -m bench.plain_proxy` runs it (uvloop);
- four gateways (`python -m gateway serve`, the production path) in front of
  the bare handler, each on a fresh SQLite store, with a config built through
  the gateway's own `Settings`: one route (`require_key = true`), `[idempotency]
  scope_headers = ["Authorization"]` (`shared_scope` left false), everything
  else default. Columns: "defaults" (log info, uvloop), "access log off" (log
  warning, uvloop), "asyncio loop" (log info, `loop = "asyncio"`), "asyncio, log
  off". Their stderr, the access log, goes to a file (`bench.processes`);
- the load: wrk, one thread, `bench/wrk_defaults.lua`: a POST of one constant
  200-byte JSON body with `Authorization: Bearer bench-tenant` and a fresh
  `Idempotency-Key` per request (miss) or `replay-<n mod 50>` (replay; the 50
  keys are sent once beforehand, one after another, so the measured window is
  all replays). c=64 for throughput; c=1 for the latency a hop adds (the miss
  p50 minus the bare handler's).

Every row is measured `--runs` times (default 2), the rows of one run after
another, the order reversed every other run, each window after an unmeasured
warm-up. Ratios are within one run.

The constant body meets the similar-operation guard: a new key whose request
equals an unsettled one's is refused `409 similar-operation`
(docs/contract.md, "The same request under a new key"). At c=64 nearly every
miss is such a refusal (98% on the 2-core bench machine: one miss gets through
per round of all connections); they are counted apart (`409`), and `2xx/s` is
the misses that reached the upstream. So each gateway also runs a miss row
beyond the issue's harness, "miss, a body per key" (the same script with each
key written over the body's padding, as `bench.run` sends: no twins), and the
miss target is judged on it. `bench.defaults_factors` measures what moves the
figures from this harness to `bench.run`'s.

    python -m bench.defaults                       # 5 s windows, c=64, 2 runs
    python -m bench.defaults --only defaults --runs 1
    python -m bench.defaults --quick               # a smoke run of a few seconds a row
    python -m bench.defaults --write               # also (re)write its section of RESULTS.md
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import secrets
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

import aiohttp

from bench import defaults_servers, processes
from bench.gateway_config import LogLevel, sqlite_url
from bench.loadgen import JsonBodies, LoadResult
from bench.procstat import cpu_seconds
from bench.report import Table, machine_info, ms
from bench.wrk import _execute, _parse, _result, wrk_available, wrk_version
from gateway.config import Settings, render_effective

__all__ = [
    "AUTHORIZATION",
    "COLUMNS",
    "HEADING",
    "SCRIPT",
    "Column",
    "Defaults",
    "Load",
    "Window",
    "main",
    "measure_defaults",
    "run_window",
    "section",
    "warm_replay_keys",
    "write_config",
    "write_section",
]

SCRIPT = Path(__file__).resolve().with_name("wrk_defaults.lua")
RESULTS = Path(__file__).resolve().with_name("RESULTS.md")
HEADING = "## The defaults: the issue's harness"
"""The section's heading in bench/RESULTS.md (`--write` replaces the section under it)."""
ROUTE_PREFIX = "/tickets"
ISSUES = "/v1/issues"
AUTHORIZATION = "Bearer bench-tenant"
REPLAY_KEYS = 50
WAIT = 2.0
"""Seconds a warm-up request may take (the replay keys are sent one by one)."""

BARE = "bare handler"
PLAIN = "plain proxy"
PLAIN_UVLOOP = "plain proxy (uvloop)"
BASELINES = (BARE, PLAIN, PLAIN_UVLOOP)

MISS, REPLAY, MISS_C1 = "miss", "replay", "miss c=1"
MISS_OWN = "miss, a body per key"
"""Beyond the issue's harness: the miss row with each key's own body (the key over the
padding, as `bench.run` sends), so the guard finds no twin and every miss is one."""

TARGET_MISS = 0.6
"""The issue's targets: miss >= 0.6x the plain proxy, replay >= 0.5x the bare handler,
a miss at c=1 adding at most 1.2 ms of p50 to the bare handler's."""
TARGET_REPLAY = 0.5
TARGET_ADDED_MS = 1.2


@dataclass(frozen=True, slots=True)
class Column:
    """One gateway of the run: its `--only` name, its title, its log level and loop."""

    name: str
    title: str
    level: LogLevel
    loop: Literal["uvloop", "asyncio"]


COLUMNS = (
    Column("defaults", "defaults (access log, uvloop)", "info", "uvloop"),
    Column("log-off", "access log off (uvloop)", "warning", "uvloop"),
    Column("asyncio", "asyncio loop (access log)", "info", "asyncio"),
    Column("asyncio-log-off", "asyncio, log off", "warning", "asyncio"),
)


def write_config(
    path: Path,
    *,
    upstream: str,
    store_url: str,
    level: LogLevel = "info",
    loop: str = "uvloop",
    route: Mapping[str, object] | None = None,
    idempotency: Mapping[str, object] | None = None,
) -> Path:
    """The issue's gateway config, through the gateway's own `Settings`; returns `path`.

    One route "tickets" at /tickets with `require_key = true`, `scope_headers =
    ["Authorization"]`, everything else default; `route` and `idempotency` add or
    change keys of those two tables (the factors of `bench.defaults_factors`).

    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     text = write_config(Path(tmp) / "g.toml", upstream="http://127.0.0.1:1",
    ...                         store_url="sqlite:////tmp/x.db").read_text()
    >>> 'loop = "uvloop"' in text, 'level = "info"' in text, "shared_scope = false" in text
    (True, True, True)
    """
    settings = Settings.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": 0, "loop": loop},
            "store": {"url": store_url},
            "routes": [
                {
                    "name": "tickets",
                    "prefix": ROUTE_PREFIX,
                    "upstream": upstream,
                    "require_key": True,
                    **(route or {}),
                }
            ],
            "logging": {"level": level},
            "idempotency": {"scope_headers": ["Authorization"], **(idempotency or {})},
        }
    )
    path.write_text(render_effective(settings))
    return path


@dataclass(frozen=True, slots=True)
class Load:
    """What one window sends (`bench/wrk_defaults.lua`'s arguments) and for how long."""

    mode: Literal["miss", "replay"]
    connections: int
    seconds: float
    warmup: float
    threads: int = 1
    auth: str = AUTHORIZATION
    """The Authorization header ("": none)."""
    distinct: bool = False
    """A body of its own per key (the key over the padding), as `bench.run` sends."""
    keys: int = REPLAY_KEYS
    prefix: str = "replay-"

    def body(self, key: str) -> bytes:
        """The bytes the script sends under `key` (`bench.loadgen.JsonBodies`' template)."""
        bodies = JsonBodies(200)
        return bodies(key) if self.distinct else bodies.template

    def script_args(self, run: str) -> list[str]:
        return [
            f"mode={self.mode}",
            f"run={run}",
            f"auth={self.auth}",
            f"distinct={int(self.distinct)}",
            f"keys={self.keys}",
            f"prefix={self.prefix}",
        ]


@dataclass(frozen=True, slots=True)
class Window:
    """One measured window: what wrk saw, what the server used, the replays it flagged."""

    result: LoadResult
    cpu: float
    """The server's CPU seconds over the window (its process only)."""
    replayed: int
    """2xx answers that carried `Idempotent-Replayed: true`."""

    @property
    def answers_per_s(self) -> float:
        """Every answer, whatever its status (what wrk's own Requests/sec counts)."""
        r = self.result
        return r.responses / r.seconds if r.seconds > 0 else 0.0

    @property
    def ok_per_s(self) -> float:
        r = self.result
        return r.ok / r.seconds if r.seconds > 0 else 0.0

    @property
    def refused(self) -> int:
        return self.result.duplicates

    @property
    def cpu_us(self) -> float:
        """Server CPU per answer, microseconds."""
        return self.cpu / self.result.responses * 1e6 if self.result.responses else math.nan


def run_window(url: str, load: Load, *, pid: int, workdir: Path, script: Path = SCRIPT) -> Window:
    """An unmeasured warm-up of `load.warmup` seconds, then the measured window."""
    tag = secrets.token_hex(3)
    if load.warmup > 0:
        argv = _argv(url, load, load.warmup, f"{tag}w", script)
        _execute(argv, load.warmup, workdir / "warmup.out", interrupted_ok=True)
    argv = _argv(url, load, load.seconds, tag, script)
    before = cpu_seconds(pid)
    finished = _execute(argv, load.seconds, workdir / "measured.out", interrupted_ok=False)
    used = cpu_seconds(pid) - before
    document = _parse(finished.output)
    result = _result(
        document,
        client_cpu=finished.cpu,
        server_cpu={str(pid): used},
        server_processes={str(pid): 1},
    )
    return Window(result=result, cpu=used, replayed=int(document.get("replayed", 0)))


def _argv(url: str, load: Load, seconds: float, run: str, script: Path) -> list[str]:
    executable = shutil.which("wrk")
    if executable is None:
        raise RuntimeError("wrk is not installed (Debian package wrk)")
    return [
        executable,
        f"-t{load.threads}",
        f"-c{load.connections}",
        f"-d{max(1, math.ceil(seconds))}s",
        "--timeout", "30s",
        "--latency",
        "-s", str(script),
        url,
        "--",
        *load.script_args(run),
    ]  # fmt: skip


def warm_replay_keys(url: str, load: Load) -> dict[int, int]:
    """Send each replay key once, one after another (a constant body sent by several keys
    at once would meet the similar-operation guard), with the requests the window sends;
    raise unless every answer was 2xx. Returns the statuses seen."""

    async def send() -> dict[int, int]:
        statuses: dict[int, int] = {}
        timeout = aiohttp.ClientTimeout(total=WAIT * 5)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for index in range(load.keys):
                key = f"{load.prefix}{index}"
                headers = {"Content-Type": "application/json", "Idempotency-Key": key}
                if load.auth:
                    headers["Authorization"] = load.auth
                async with session.post(url, data=load.body(key), headers=headers) as answer:
                    await answer.read()
                    statuses[answer.status] = statuses.get(answer.status, 0) + 1
        return statuses

    statuses = asyncio.run(asyncio.wait_for(send(), WAIT * load.keys + 30))
    if any(not 200 <= status < 300 for status in statuses):
        raise RuntimeError(f"replay keys: not all sent ok: {statuses}")
    return statuses


@dataclass
class Defaults:
    """Every window of a run, by (server, load), in run order; and how it ran."""

    seconds: float
    connections: int
    runs: int
    warmup: float
    columns: tuple[Column, ...]
    windows: dict[tuple[str, str], list[Window]] = field(default_factory=dict)
    load_average: list[tuple[float, float, float]] = field(default_factory=list)
    """/proc/loadavg's three figures at the start of each run, and at the end."""
    minutes: float = 0.0
    notes: list[str] = field(default_factory=list)

    def add(self, server: str, load: str, window: Window) -> None:
        self.windows.setdefault((server, load), []).append(window)

    def get(self, server: str, load: str) -> list[Window]:
        return self.windows.get((server, load), [])


def measure_defaults(
    workdir: Path,
    *,
    seconds: float = 5.0,
    connections: int = 64,
    runs: int = 2,
    warmup: float = 1.0,
    columns: Sequence[Column] = COLUMNS,
) -> Defaults:
    """Start every server, measure every row `runs` times, stop them all."""
    started = time.monotonic()
    found = Defaults(seconds, connections, runs, warmup, tuple(columns))
    with contextlib.ExitStack() as stack:
        bare = stack.enter_context(defaults_servers.server(workdir, "bare", loop="asyncio"))
        servers = {
            BARE: bare,
            PLAIN: stack.enter_context(
                defaults_servers.server(workdir, "proxy", loop="asyncio", upstream=bare.url)
            ),
            PLAIN_UVLOOP: stack.enter_context(processes.plain_proxy(workdir, bare.url)),
        }
        for column in columns:
            config = write_config(
                workdir / f"defaults-{column.name}.toml",
                upstream=bare.url,
                store_url=sqlite_url(workdir / f"defaults-{column.name}.db"),
                level=column.level,
                loop=column.loop,
            )
            name = f"gateway, {column.title}"
            servers[column.title] = stack.enter_context(processes.gateway(config, name=name))
        throughput = Load("miss", connections, seconds, warmup)
        replay = replace(throughput, mode="replay")
        own = replace(throughput, distinct=True)
        single = replace(throughput, connections=1)
        for column in columns:
            gateway = servers[column.title]
            warm_replay_keys(gateway.url + ROUTE_PREFIX + ISSUES, replay)
        for index in range(runs):
            found.load_average.append(os.getloadavg())
            order = list(servers)
            if index % 2:
                order.reverse()
            print(f"run {index + 1} of {runs}:", file=sys.stderr, flush=True)
            for name in order:
                server = servers[name]
                url = server.url + ("" if name in BASELINES else ROUTE_PREFIX) + ISSUES
                found.add(name, MISS, _window(name, MISS, url, throughput, server, workdir))
                if name not in BASELINES:
                    found.add(name, MISS_OWN, _window(name, MISS_OWN, url, own, server, workdir))
                    found.add(name, REPLAY, _window(name, REPLAY, url, replay, server, workdir))
            for name in order:
                server = servers[name]
                url = server.url + ("" if name in BASELINES else ROUTE_PREFIX) + ISSUES
                found.add(name, MISS_C1, _window(name, MISS_C1, url, single, server, workdir))
        found.load_average.append(os.getloadavg())
    found.minutes = (time.monotonic() - started) / 60
    return found


def _window(
    name: str, label: str, url: str, load: Load, server: processes.ServerProcess, workdir: Path
) -> Window:
    """Measure one window and say what it saw (on stderr)."""
    window = run_window(url, load, pid=server.pid, workdir=workdir)
    r = window.result
    print(
        f"  {name} {label}: {window.answers_per_s:,.0f} answers/s ({window.ok_per_s:,.0f} 2xx/s, "
        f"409 {window.refused}), p50 {ms(r.p50_ms)} ms, p99 {ms(r.p99_ms)} ms, "
        f"CPU {window.cpu_us:,.0f} us/answer",
        file=sys.stderr,
        flush=True,
    )
    return window


# -- tables ---------------------------------------------------------------------------


def _cells(values: Sequence[float], form: str) -> str:
    """One figure per run, " / " between them ("n/a" for NaN)."""
    return " / ".join("n/a" if math.isnan(v) else format(v, form) for v in values)


def _ms_cells(values: Sequence[float]) -> str:
    return " / ".join(ms(v) for v in values)


def _per_run_ratio(top: Sequence[Window], bottom: Sequence[Window], *, ok: bool) -> list[float]:
    """top's 2xx/s (`ok`) or answers/s over bottom's answers/s, run by run."""
    ratios = []
    for a, b in zip(top, bottom, strict=False):
        numerator = a.ok_per_s if ok else a.answers_per_s
        ratios.append(numerator / b.answers_per_s if b.answers_per_s > 0 else math.nan)
    return ratios


def _added(top: Sequence[Window], base: Sequence[Window]) -> list[float]:
    return [a.result.p50_ms - b.result.p50_ms for a, b in zip(top, base, strict=False)]


def _verdict(values: Sequence[float], met: bool) -> str:
    if not values or any(math.isnan(v) for v in values):
        return "n/a"
    return "met" if met else "**not met**"


def _range(values: Sequence[float], form: str, suffix: str = "") -> str:
    """`low-high` over the runs (one figure when they agree or there is one run; "low to
    high" for signed figures)."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return "n/a"
    low, high = format(min(finite), form), format(max(finite), form)
    if low == high:
        return low + suffix
    return (f"{low} to {high}" if form.startswith("+") else f"{low}-{high}") + suffix


def summary_table(found: Defaults) -> Table:
    """The issue's table: a column per gateway, its rows and targets (ranges over runs).

    The miss target is judged on the misses of `MISS_OWN` (every one a miss): the
    issue's constant body has the guard refuse nearly all of them at c>1."""
    bare, plain = found.get(BARE, MISS), found.get(PLAIN, MISS)
    bare_c1 = found.get(BARE, MISS_C1)
    names = (
        "miss (the issue's constant body), answers/s (409/429 among them)",
        "miss (the issue's constant body), 2xx/s",
        "miss, a body per key, 2xx/s",
        "replay, answers/s",
        f"miss (a body per key) vs plain proxy (target >= {TARGET_MISS}x)",
        "miss (the issue's constant body), 2xx/s vs plain proxy",
        f"replay vs bare handler (target >= {TARGET_REPLAY}x)",
        f"added p50 at c=1, ms (target <= +{TARGET_ADDED_MS})",
    )
    cells: list[list[str]] = [[] for _ in names]
    for column in found.columns:
        miss = found.get(column.title, MISS)
        own = found.get(column.title, MISS_OWN)
        replay = found.get(column.title, REPLAY)
        refused = sum(w.refused for w in miss)
        answers = sum(w.result.responses for w in miss)
        share = f"{refused / answers:.0%}" if answers else "n/a"
        own_ratio = _per_run_ratio(own, plain, ok=True)
        replay_ratio = _per_run_ratio(replay, bare, ok=True)
        added = _added(found.get(column.title, MISS_C1), bare_c1)
        figures = (
            f"{_range([w.answers_per_s for w in miss], ',.0f')} ({share})",
            _range([w.ok_per_s for w in miss], ",.0f"),
            _range([w.ok_per_s for w in own], ",.0f"),
            _range([w.answers_per_s for w in replay], ",.0f"),
            f"{_range(own_ratio, '.2f', 'x')} "
            f"({_verdict(own_ratio, all(v >= TARGET_MISS for v in own_ratio))})",
            _range(_per_run_ratio(miss, plain, ok=True), ".2f", "x"),
            f"{_range(replay_ratio, '.2f', 'x')} "
            f"({_verdict(replay_ratio, all(v >= TARGET_REPLAY for v in replay_ratio))})",
            f"{_range(added, '+.2f')} "
            f"({_verdict(added, all(v <= TARGET_ADDED_MS for v in added))})",
        )
        for cell, figure in zip(cells, figures, strict=True):
            cell.append(figure)
    header = ("gateway", *(column.title for column in found.columns))
    return Table(header, tuple((name, *cell) for name, cell in zip(names, cells, strict=True)))


def detail_table(found: Defaults) -> Table:
    """Every row, one figure per run ("run 1 / run 2")."""
    header = (
        "server",
        "load",
        "answers/s",
        "2xx/s",
        "p50 ms",
        "p99 ms",
        "409/429",
        "other non-2xx/errors, all runs",
        "replays flagged, all runs",
        "server CPU us/answer",
    )
    body = []
    order = [*BASELINES, *(column.title for column in found.columns)]
    for load in (MISS, MISS_OWN, REPLAY, MISS_C1):
        for server in order:
            windows = found.get(server, load)
            if not windows:
                continue
            results = [w.result for w in windows]
            flagged = "-"
            if load == REPLAY:
                replayed, ok = sum(w.replayed for w in windows), sum(r.ok for r in results)
                flagged = f"all {ok:,}" if replayed == ok else f"{replayed:,} of {ok:,}"
            body.append(
                (
                    server,
                    f"{load} c={found.connections}" if load in (MISS, MISS_OWN) else load,
                    _cells([w.answers_per_s for w in windows], ",.0f"),
                    _cells([w.ok_per_s for w in windows], ",.0f"),
                    _ms_cells([r.p50_ms for r in results]),
                    _ms_cells([r.p99_ms for r in results]),
                    " / ".join(str(w.refused) for w in windows),
                    f"{sum(r.non_2xx for r in results)}/{sum(r.errors for r in results)}",
                    flagged,
                    _cells([w.cpu_us for w in windows], ",.0f"),
                )
            )
    return Table(header, tuple(body))


def baseline_sentence(found: Defaults) -> str:
    bare, plain = found.get(BARE, MISS), found.get(PLAIN, MISS)
    plain_uv = found.get(PLAIN_UVLOOP, MISS)
    added_plain = _added(found.get(PLAIN, MISS_C1), found.get(BARE, MISS_C1))
    added_uv = _added(found.get(PLAIN_UVLOOP, MISS_C1), found.get(BARE, MISS_C1))
    return (
        f"Baselines (same run, c={found.connections}): bare handler "
        f"{_range([w.answers_per_s for w in bare], ',.0f')} req/s, plain proxy "
        f"{_range([w.answers_per_s for w in plain], ',.0f')} req/s (asyncio), "
        f"{_range([w.answers_per_s for w in plain_uv], ',.0f')} req/s (uvloop); "
        f"at c=1 the plain proxy adds {_range(added_plain, '+.2f')} ms of p50 "
        f"({_range(added_uv, '+.2f')} ms with uvloop) to the bare handler's "
        f"{_range([w.result.p50_ms for w in found.get(BARE, MISS_C1)], '.2f')} ms."
    )


def section(found: Defaults, *, header: bool = True) -> list[str]:
    """The results as a Markdown section of bench/RESULTS.md (`HEADING` first)."""
    marks = [f"run {i + 1}" for i in range(len(found.load_average) - 1)] + ["at the end"]
    loads = "; ".join(
        f"{mark}: {a:.2f}, {b:.2f}, {c:.2f}"
        for mark, (a, b, c) in zip(marks, found.load_average, strict=True)
    )
    repeats = (
        "every row once"
        if found.runs == 1
        else f"every row {found.runs} times, the runs one after the other, the order reversed "
        "every other run (figures: run 1 / run 2 ...)"
    )
    lines = [HEADING, ""] if header else []
    lines += [
        "The configuration a user gets from `pip install` and config/gateway.toml: the JSON "
        'access log on (`[logging] level = "info"`, a line per request, here to a file), '
        "uvloop (`[server] loop`), a credential per request (`Authorization`, hashed into "
        "the scope; config/gateway.toml's `shared_scope = true` changes nothing for requests "
        "that carry one). The tuned rows further down run with the log at `warning`. The issue's "
        "harness exactly (`python -m bench.defaults`): one route, `require_key = true`, "
        '`scope_headers = ["Authorization"]`, `shared_scope` false, everything else the '
        "production default (SQLite in the run's temporary directory), in front of a bare "
        "aiohttp handler (201, a small JSON body); wrk, one thread, "
        f"c={found.connections}, `bench/wrk_defaults.lua`: a POST of one constant 200-byte "
        "JSON body with `Authorization: Bearer bench-tenant`, a fresh `Idempotency-Key` per "
        f"request (miss) or `replay-<n mod {REPLAY_KEYS}>` (replay, every key sent once "
        f"beforehand). {found.seconds:g} s per window after {found.warmup:g} s of warm-up, "
        f"{repeats}; the baselines on asyncio's own loop, as in the issue. Whole harness "
        f"{found.minutes:.1f} min; load average (1, 5, 15 min) at the start of {loads}.",
        "",
        summary_table(found).render(),
        "",
        baseline_sentence(found),
        "",
        detail_table(found).render(),
        "",
        f"`{MISS_OWN}` is beyond the issue's harness: the same script with `distinct=1`, the "
        "key written over the body's padding (as `bench.run` sends), so that no miss has a "
        "twin; the miss target is judged on it. "
        "`409/429` are refusals: `409 similar-operation`, since with one constant body "
        "every new key is the same request as the miss in flight, so at c>1 the similar-"
        'operation guard (docs/contract.md, "The same request under a new key") refuses '
        "nearly every miss: never forwarded, the refused key bound to its twin in the "
        "store; past the scope's `max_bindings` (1,000) such refusals are `429 quota-"
        "exceeded`. `2xx/s` are the misses that reached the upstream, about one per round"
        " of all connections; the miss ratio uses them. `replays flagged`: 2xx replay "
        "answers that carried `Idempotent-Replayed: true` (all: every one did). CPU is "
        "the server process's own "
        "per answer (a gateway's includes writing its access log). `make bench`'s other "
        "HTTP rows (below) are tuned: access log off, no credential (`shared_scope = "
        "true`), a distinct body per key, the example tool API upstream; "
        "`python -m bench.defaults_factors` measures each difference.",
    ]
    if found.notes:
        lines += ["", *(f"- {note}" for note in found.notes)]
    return lines


def write_section(path: Path, lines: Sequence[str]) -> None:
    """Replace the section under `HEADING` in `path`, or insert it before the first
    other `## ` section (after the file's header), or append it."""
    text = "\n".join(lines).rstrip("\n")
    old = path.read_text() if path.exists() else ""
    start = old.find(f"\n{HEADING}\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        tail = old[end:] if end >= 0 else "\n"
        new = old[: start + 1] + text + "\n" + tail
    else:
        first = old.find("\n## ")
        if first >= 0:
            new = old[: first + 1] + text + "\n" + old[first:]
        else:
            new = old.rstrip("\n") + "\n\n" + text + "\n"
    path.write_text(new)


@contextlib.contextmanager
def _workdir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="gateway-defaults-") as tmp:
        yield Path(tmp)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.defaults",
        description="The gateway with its defaults, in the issue's wrk harness.",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="measured seconds a window")
    parser.add_argument("--connections", type=int, default=64, help="wrk -c of the c>1 rows")
    parser.add_argument("--runs", type=int, default=2, help="times every row is measured")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument(
        "--only",
        action="append",
        choices=[column.name for column in COLUMNS],
        help="only these gateway columns (repeatable; the baselines always run)",
    )
    parser.add_argument("--quick", action="store_true", help="a tiny smoke run")
    parser.add_argument("--write", action="store_true", help=f"write the section to {RESULTS}")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the harness; print the section; with `--write`, put it in RESULTS.md."""
    parser = _parser()
    args = parser.parse_args(argv)
    if not wrk_available():
        parser.error("wrk is not installed (Debian package wrk): the issue's harness is wrk's")
    if args.runs < 1 or args.connections < 1 or args.seconds <= 0 or args.warmup < 0:
        parser.error("--runs and --connections >= 1, --seconds > 0, --warmup >= 0")
    if args.quick:
        args.seconds, args.connections, args.runs, args.warmup = 1.0, 8, 1, 0.0
    columns = [c for c in COLUMNS if not args.only or c.name in args.only]
    machine = machine_info()  # now: its load average is the one before the run
    with _workdir() as workdir:
        found = measure_defaults(
            workdir,
            seconds=args.seconds,
            connections=args.connections,
            runs=args.runs,
            warmup=args.warmup,
            columns=columns,
        )
    found.notes.append(f"load generator: {wrk_version()}, `wrk -t1`, bench/{SCRIPT.name}")
    if args.write:
        # Written apart from `make bench`: say when and where, beside the other runs' rows.
        found.notes.append(
            "written by `python -m bench.defaults --write`, not by `make bench`: the rows "
            "of the other sections come from their own run (see the header)"
        )
        found.notes += [line.removeprefix("- ") for line in machine]
    lines = section(found)
    print("\n".join(lines), flush=True)
    if args.write:
        write_section(RESULTS, lines)
        print(f"written to {RESULTS}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
