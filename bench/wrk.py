"""Drive a row with wrk and a Lua script; the same `LoadResult` as `bench.loadgen`.

The aiohttp generator costs 100 us or more of CPU a request, so on this
2-core machine it, not the server, often sets the pace (the `direct` row is
client-bound). wrk, a C event loop, costs a few microseconds a request, so
when it is installed (`wrk_available()`) every HTTP row runs on it and the
servers' throughput is their own. It is optional: the benchmark falls back
to the aiohttp generator without it, and CI has none.

wrk knows no idempotency keys, so `bench/wrk_keys.lua` makes them, in the
modes of `bench.loadgen` (new, replay, mix10, none, lookup), gives each
request its key's body (the bytes `bench.loadgen.JsonBodies` makes for that
key, built from the same template and offset: a new key is a distinct
request, a replayed key sends what the warm-up sent), counts the responses
by status (409s and 429s are refusals, as there) and prints one JSON line at the
end. A row is:

1. for replay, every replay key sent once with aiohttp
   (`bench.loadgen.warm_replay_keys`, the aiohttp generator's own warm-up);
2. an unmeasured wrk run of `spec.warmup` seconds;
3. the measured wrk run of `spec.duration` seconds, with the servers' CPU
   time (`spec.cpu_pids`, their whole process trees with `spec.cpu_tree`)
   read just before it starts and right after it exits.

Unlike the aiohttp generator, the measured run opens its own connections (so
its first milliseconds include the connects); the warm-up run has warmed the
servers by then.

`seconds` is the duration wrk reports, from its threads' start to their end:
the window in which the counted responses arrived, without the process's own
start-up and exit. `client_cpu` is the wrk process's whole user + system CPU
(`os.wait4`), start-up included, so a client-bound flag errs on the safe side.

wrk's `-d` takes whole seconds, so a run of a fractional length (the quick
plan's 0.3 s warm-up) is given the next whole second and stopped early with
SIGINT, on which wrk stops and reports as at the end of `-d`. wrk stops on
time only: a spec with a `requests` cap is refused (`LoadSpec` refuses
`client="wrk"` with one; `run_wrk` refuses it too).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from bench.loadgen import (
    BODY_METHODS,
    REQUEST_TIMEOUT,
    Client,
    JsonBodies,
    LoadResult,
    LoadSpec,
    sample_server_cpu,
    server_cpu_since,
    warm_replay_keys,
)
from bench.prefill import fill_key

__all__ = ["SCRIPT", "run_wrk", "wrk_available", "wrk_version"]

SCRIPT = Path(__file__).resolve().with_name("wrk_keys.lua")
"""The Lua script that makes each request's key and counts the statuses."""
_MARKER = "WRK_RESULT "
"""The start of the one line of JSON the script's done() prints."""
_LOOKUP_SAMPLE = 100_000
"""lookup draws its keys from at most this many pre-filled keys (see `_lookup_keys`)."""
_EXIT_GRACE = REQUEST_TIMEOUT + 30.0
"""How long past its planned end wrk may run before it is killed."""
_POLL = 0.005
"""Seconds between checks for wrk's exit (a blocking wait could not time out)."""


def wrk_available() -> bool:
    """Whether `wrk` is on PATH: the benchmark's `--client auto` uses it if so."""
    return shutil.which("wrk") is not None


def wrk_version() -> str:
    """`wrk --version`'s first line without its copyright, e.g. "wrk debian/4.1.0-3+b2 [epoll]"."""
    executable = _executable()
    # wrk prints its version line and its usage, and exits 1: only the first line matters.
    completed = subprocess.run(
        [executable, "--version"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    first = (completed.stdout or completed.stderr).strip().splitlines()[:1]
    if not first:
        return "wrk (version unknown)"
    return first[0].split(" Copyright", 1)[0].strip()


def run_wrk(spec: LoadSpec) -> LoadResult:
    """Run `spec` with wrk (warm-up, then the measured run) and return what it saw."""
    if spec.requests is not None:
        raise ValueError("wrk stops on time only: a spec with a requests cap needs aiohttp")
    executable = _executable()
    run = f"bench-{secrets.token_hex(4)}"
    with tempfile.TemporaryDirectory(prefix="bench-wrk-") as tmp:
        workdir = Path(tmp)
        options = _script_options(spec, workdir)
        if spec.mode == "replay":
            warm_replay_keys(spec, [f"{run}-r{i}" for i in range(spec.replay_keys)])
        if spec.warmup > 0:
            # Keys must not repeat between the two runs: replay's are meant to.
            warm_run = run if spec.mode == "replay" else f"{run}-w"
            argv = _argv(executable, spec, spec.warmup, {**options, "run": warm_run})
            _execute(argv, spec.warmup, workdir / "warmup.out", interrupted_ok=True)
        argv = _argv(executable, spec, spec.duration, {**options, "run": run})
        before = sample_server_cpu(spec)
        finished = _execute(argv, spec.duration, workdir / "measured.out", interrupted_ok=False)
        server_cpu, server_processes = server_cpu_since(spec, before)
    return _result(
        _parse(finished.output),
        client_cpu=finished.cpu,
        server_cpu=server_cpu,
        server_processes=server_processes,
    )


def _executable() -> str:
    executable = shutil.which("wrk")
    if executable is None:
        raise RuntimeError("wrk is not installed (Debian package wrk); use the aiohttp client")
    return executable


def _script_options(spec: LoadSpec, workdir: Path) -> dict[str, str]:
    """The Lua script's arguments but `run`; writes the files it reads into `workdir`."""
    options = {
        "mode": spec.mode,
        "method": spec.method,
        "replay": str(spec.replay_keys),
        # mix10 reuses keys sent this many new keys earlier: with one request in
        # flight per connection, 4 rounds of all connections have almost surely
        # let it complete (a 409, if not, is counted as a duplicate).
        "lag": str(4 * spec.concurrency),
    }
    if spec.method in BODY_METHODS:  # as bench.loadgen: a body for these only
        bodies = JsonBodies(spec.body_size)
        body = workdir / "body.json"
        body.write_bytes(bodies.template)
        options["body"] = str(body)
        # Where the script writes each request's key over the template, and how much fits.
        options["tag_at"], options["tag_room"] = str(bodies.offset), str(bodies.room)
    if spec.mode == "lookup":
        target = urlsplit(spec.url)
        path = target.path + (f"?{target.query}" if target.query else "")
        options["head"], _, options["tail"] = path.partition("{key}")
        keys = workdir / "keys.txt"
        keys.write_text("".join(f"{key}\n" for key in _lookup_keys(spec.lookup_keys)))
        options["keys"] = str(keys)
    return options


def _lookup_keys(count: int) -> list[str]:
    """The keys a lookup row draws from: all pre-filled keys, or a random sample of them.

    A sample bounds the file and the script's memory for a million-row store.
    The rows look up far fewer keys than the sample holds, and 100,000 random
    keys of a million touch nearly every page of the key index, so the access
    pattern is that of drawing from all of them.
    """
    indexes = (
        range(count)
        if count <= _LOOKUP_SAMPLE
        else random.Random(0x1DE).sample(range(count), _LOOKUP_SAMPLE)
    )
    return [fill_key(index) for index in indexes]


def _argv(executable: str, spec: LoadSpec, seconds: float, options: dict[str, str]) -> list[str]:
    """The wrk command line for a run of `seconds` (rounded up: `-d` takes whole seconds)."""
    # One thread: this machine has 2 cores, and one wrk thread drives tens of
    # thousands of requests a second; the other core is left to the servers
    # under test, which would otherwise compete with the client for it.
    url = spec.url.replace("{key}", "key") if spec.mode == "lookup" else spec.url
    return [
        executable,
        "-t1",
        f"-c{spec.concurrency}",
        f"-d{max(1, math.ceil(seconds))}s",
        "--timeout", f"{math.ceil(REQUEST_TIMEOUT)}s",
        "--latency",
        "-s", str(SCRIPT),
        url,
        "--",
        *(f"{name}={value}" for name, value in options.items()),
    ]  # fmt: skip


@dataclass(frozen=True, slots=True)
class _Finished:
    """A wrk run that exited: its output and its own CPU seconds."""

    output: str
    cpu: float


def _execute(argv: list[str], seconds: float, output: Path, *, interrupted_ok: bool) -> _Finished:
    """Run wrk for `seconds`, killing it `_EXIT_GRACE` past that; raise if it failed.

    Its output goes to a file (a pipe could fill up while nobody reads it).
    `os.wait4` reaps it, for its CPU time; polled, so that the deadline holds.
    `interrupted_ok`: for the unmeasured warm-up, a SIGINT that came before
    wrk installed its handler (and so killed it) is no failure.
    """
    started = time.monotonic()
    interrupt_at = started + seconds if seconds < math.ceil(seconds) else math.inf
    deadline = started + math.ceil(seconds) + _EXIT_GRACE
    with open(output, "w") as sink:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=sink)
    cpu = 0.0
    try:
        while True:
            pid, status, usage = os.wait4(process.pid, os.WNOHANG)
            if pid:
                process.returncode = os.waitstatus_to_exitcode(status)
                cpu = usage.ru_utime + usage.ru_stime
                break
            now = time.monotonic()
            if now >= deadline:
                raise RuntimeError(f"wrk ran past its {deadline - started:.0f} s budget")
            if now >= interrupt_at:
                process.send_signal(signal.SIGINT)
                interrupt_at = math.inf
            time.sleep(_POLL)
    finally:
        if process.returncode is None:  # the deadline, or an exception such as Ctrl-C
            process.kill()
            process.wait()
    text = output.read_text(errors="replace")
    if process.returncode != 0 and not (interrupted_ok and process.returncode == -signal.SIGINT):
        raise RuntimeError(f"wrk failed ({process.returncode}): {' '.join(argv)}\n{text[-2000:]}")
    return _Finished(output=text, cpu=cpu)


def _parse(output: str) -> dict[str, Any]:
    """The JSON the script's done() printed."""
    for line in output.splitlines():
        if line.startswith(_MARKER):
            document: dict[str, Any] = json.loads(line[len(_MARKER) :])
            return document
    raise RuntimeError(f"wrk printed no {_MARKER.strip()} line:\n{output[-2000:]}")


def _result(
    document: dict[str, Any],
    *,
    client_cpu: float,
    server_cpu: dict[str, float],
    server_processes: dict[str, int],
) -> LoadResult:
    """`document` (counts, microseconds) as a `LoadResult` (milliseconds)."""
    statuses = {int(status): int(count) for status, count in document["statuses"].items()}
    responses = sum(statuses.values())
    ok = sum(count for status, count in statuses.items() if 200 <= status < 300)
    # Refused, never forwarded: 409 (similar-operation, in-progress), and 429 once a scope
    # holds `max_bindings` keys refused as the same request (a constant body under new keys
    # makes one binding per refusal: past the default 1,000 they are 429 quota-exceeded).
    duplicates = statuses.get(409, 0) + statuses.get(429, 0)

    def ms(name: str) -> float:
        return float(document[name]) / 1000 if responses else math.nan

    return LoadResult(
        seconds=float(document["duration_us"]) / 1e6,
        responses=responses,
        ok=ok,
        duplicates=duplicates,
        non_2xx=responses - ok - duplicates,
        # wrk's own "status" errors are its count of statuses >= 400: not errors here.
        errors=sum(int(document[name]) for name in ("connect", "read", "write", "timeout")),
        p50_ms=ms("p50_us"),
        p99_ms=ms("p99_us"),
        max_ms=ms("max_us"),
        client_cpu=client_cpu,
        server_cpu=server_cpu,
        statuses={str(status): count for status, count in sorted(statuses.items())},
        server_processes=server_processes,
    )


def add_client_option(parser: argparse.ArgumentParser) -> None:
    """`--client auto|wrk|aiohttp`, the load generator of a benchmark's gateway rows."""
    parser.add_argument(
        "--client",
        choices=("auto", "wrk", "aiohttp"),
        default="auto",
        help="load generator (default auto: wrk if installed, else aiohttp)",
    )


def chosen_client(choice: str, parser: argparse.ArgumentParser) -> Client:
    """`--client`: auto is wrk when it is installed, else aiohttp; wrk that is missing is
    a usage error."""
    if choice == "aiohttp":
        return "aiohttp"
    if wrk_available():
        return "wrk"
    if choice == "wrk":
        parser.error("--client wrk: wrk is not installed (Debian package wrk)")
    return "aiohttp"
