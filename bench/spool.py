"""Spooled answers: the gateway's memory and disk while many callers read large answers slowly.

An upstream answer larger than the route's `max_stored_response` (1 MiB by
default) is read to its end at the upstream's pace into a spool file of its
own (`gateway.upstream.spool`: unlinked at once, 0600, AES-GCM) and relayed
to its caller from there at the caller's pace. So the gateway's memory should
be bounded by the chunks in flight, not by the answers' sizes, and its disk
by the answers being relayed (at most `max_spool` each, `max_spool_total` in
all), back to nothing once the relays end.

This runs `--readers` callers at once, each a POST with its own
`Idempotency-Key` whose answer is `--size` bytes (with `Content-Length`,
from a minimal upstream in its own process), read `--chunk` bytes at a time
at a pace that takes `--read-seconds` for the whole answer. Every
`--interval` seconds it samples the gateway process's VmRSS and its spool
files: the descriptors in /proc/<pid>/fd whose target is in the gateway's
`spool_dir` (unlinked files, shown "(deleted)"), their sizes (`st_size`) and
the blocks they hold (`st_blocks`).

Phases, each on a fresh process (so no phase inherits another's high-water
mark), each with its idle RSS measured before its load:

- the gateway (`python -m gateway serve`, config/gateway.toml's settings but
  for its address, one route in front of the upstream, an SQLite store and a
  `spool_dir` in the run's temporary directory), slow readers;
- the same with answers `--smaller-size` bytes (does memory follow the size?);
- the same with readers at full speed (no pause);
- the plain proxy (`bench.plain_proxy`, which holds each answer in memory),
  slow readers: the baseline for memory.

Every answer is checked byte for byte (its first line names its caller's key;
the rest is 16-byte lines holding their own offset, so a lost, repeated or
misplaced chunk shows), and afterwards every gateway operation is looked up
(`GET /operations/<key>`): it must be `completed` with `body_retained: false`.

The last few MB of each answer are in the kernel's socket buffers, not the
gateway's memory or its spool: the gateway's send buffer grows up to
`net.ipv4.tcp_wmem`'s maximum (4 MiB here) and the caller's receive buffer
holds some more, so a relay writes its last byte (and its spool goes) that
much before its caller has read it. An answer smaller than that is never in
a spool for long, however slowly it is read.

    python -m bench.spool                      # 16 readers x 20,000,000 bytes, 10 s each
    python -m bench.spool --readers 16 --size 20000000 --read-seconds 10
    python -m bench.spool --quick              # a smoke run of a few seconds a phase
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import math
import secrets
import statistics
import sys
import tempfile
import threading
import time
import tomllib
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from bench import processes
from bench.gateway_config import sqlite_url
from bench.procstat import rss_bytes
from bench.report import Table, machine_info, ratio
from gateway.config import Settings, render_effective

__all__ = ["Phase", "Sample", "main", "measure", "pattern", "section", "spool_use"]

PRODUCT_CONFIG = processes.ROOT / "config" / "gateway.toml"
"""The configuration the product ships: every setting this bench does not need to change."""
HEAD = 64
"""Bytes of an answer's first line, which names the caller's key (padded with '#')."""
PATH = "/v1/issues"
"""What the callers POST to, under the route's prefix."""
_MIB = 1024 * 1024
_IDLE_SAMPLES = 5
_SETTLE_SECONDS = 1.0
"""How long a fresh server is left alone before its idle RSS is read."""
QUICK_READERS = 4
QUICK_SIZE = 12_000_000
"""`--quick`'s answers: well past what the sockets' kernel buffers hold (about 4.5 MB a
connection on loopback here), so the spool holds each answer for a while even there."""
_DRAIN_SECONDS = 15.0
"""How long, after the last caller, the spool may take to return to nothing."""


@functools.lru_cache(maxsize=4)
def pattern(size: int) -> bytes:
    """`size` bytes of 16-byte lines, each holding its own offset (15 digits and a newline).

    >>> pattern(40)
    b'000000000000000\\n000000000000016\\n00000000'
    """
    return b"".join(b"%015d\n" % offset for offset in range(0, size, 16))[:size]


def head(ref: str) -> bytes:
    """An answer's first `HEAD` bytes: the caller's key, then '#' up to the newline.

    >>> head("k-1")[:6], len(head("k-1"))
    (b'k-1\\n##', 64)
    """
    return (ref.encode() + b"\n").ljust(HEAD - 1, b"#") + b"\n"


# -- the upstream (its own process) ---------------------------------------------------


async def _answer(request: web.Request) -> web.StreamResponse:
    """Any POST `{"ref": key, "size": n}`: `head(ref)` then `pattern(n)` past it, n bytes
    in all, with Content-Length, as fast as the reader takes them."""
    asked = json.loads(await request.read())
    size = int(asked["size"])
    body = memoryview(pattern(size))
    response = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
    response.content_length = size
    await response.prepare(request)
    await response.write(head(str(asked["ref"]))[:size])
    for start in range(HEAD, size, _MIB):
        await response.write(body[start : min(size, start + _MIB)])
    await response.write_eof()
    return response


async def _serve_upstream() -> None:
    app = web.Application()
    app.router.add_post("/{tail:.*}", _answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    print(f"sized-answer upstream listening on http://127.0.0.1:{port}", flush=True)
    await asyncio.Event().wait()


def upstream(log_dir: Path) -> processes.ServerProcess:
    argv = [sys.executable, "-m", "bench.spool", "--serve-upstream"]
    return processes.ServerProcess("sized-answer upstream", argv, log_path=log_dir / "up.log")


# -- the gateway's configuration --------------------------------------------------------


def write_config(path: Path, *, upstream: str, store_url: str, spool_dir: Path) -> Path:
    """config/gateway.toml as shipped, but for: 127.0.0.1 on an OS-chosen port, the store
    at `store_url`, `spool_dir`, and its first route ("tickets") alone, in front of
    `upstream` (the MCP route's server is not here). Returns `path`.

    >>> with tempfile.TemporaryDirectory() as tmp:
    ...     text = write_config(Path(tmp) / "g.toml", upstream="http://127.0.0.1:1",
    ...                         store_url="sqlite:////tmp/x.db", spool_dir=Path(tmp)).read_text()
    >>> 'max_spool = "64MiB"' in text, 'write_timeout = "30s"' in text, 'level = "info"' in text
    (True, True, True)
    """
    document = tomllib.loads(PRODUCT_CONFIG.read_text())
    document["server"].update(host="127.0.0.1", port=0, spool_dir=str(spool_dir))
    document["store"]["url"] = store_url
    route = {**document["routes"][0], "upstream": upstream}
    document["routes"] = [route]
    path.write_text(render_effective(Settings.model_validate(document)))
    return path


# -- what the server holds: sampled from /proc -------------------------------------------


@dataclass(frozen=True, slots=True)
class Sample:
    """The server `seconds` after its load started."""

    seconds: float
    rss: int
    spool_bytes: int
    """The sum of the spool files' sizes (`st_size`): what they hold."""
    spool_disk: int
    """The sum of their `st_blocks * 512`: the disk they take."""
    spool_files: int
    done: int
    """Callers whose answer had ended by then."""


def spool_use(pid: int, directory: Path) -> tuple[int, int, int]:
    """Files of `pid` open in `directory` (by /proc/<pid>/fd): their count, sizes and blocks
    in bytes. A descriptor closed while this reads is left out.

    >>> import os
    >>> with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile(dir=tmp) as spool:
    ...     _ = spool.write(b"x" * 5000); spool.flush()
    ...     files, size, disk = spool_use(os.getpid(), Path(tmp))
    >>> files, size, disk >= 4096
    (1, 5000, True)
    """
    prefix = str(directory.resolve()) + "/"
    files = size = disk = 0
    fds = Path(f"/proc/{pid}/fd")
    for fd in fds.iterdir():
        try:
            if not str(fd.readlink()).startswith(prefix):
                continue
            status = fd.stat()
        except (FileNotFoundError, ProcessLookupError):
            continue
        files += 1
        size += status.st_size
        disk += status.st_blocks * 512
    return files, size, disk


class Sampler:
    """A thread that samples a server every `interval` seconds (at most `limit` samples):
    the load's event loop being busy never delays a sample."""

    def __init__(self, pid: int, spool_dir: Path | None, *, interval: float, limit: int) -> None:
        self.pid = pid
        self.spool_dir = spool_dir
        self.interval = interval
        self.limit = limit
        self.samples: list[Sample] = []
        self.done = 0
        """Set by the load: callers finished so far."""
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def sample(self) -> Sample:
        files = size = disk = 0
        if self.spool_dir is not None:
            files, size, disk = spool_use(self.pid, self.spool_dir)
        seconds = time.monotonic() - self.started
        return Sample(seconds, rss_bytes(self.pid), size, disk, files, self.done)

    def _run(self) -> None:
        while len(self.samples) < self.limit:
            try:
                self.samples.append(self.sample())
            except (FileNotFoundError, ProcessLookupError):
                return  # the server is gone: the phase fails on its callers
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> Sampler:
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


# -- the callers -------------------------------------------------------------------------


@dataclass(slots=True)
class Caller:
    """What one caller got."""

    key: str
    status: int = 0
    received: int = 0
    intact: bool = False
    seconds: float = math.nan
    """From the load's start to this caller's last byte."""
    state_header: str = ""
    """The answer's `Idempotency-Status` (the gateway's only)."""
    error: str = ""


async def _call(
    session: aiohttp.ClientSession,
    url: str,
    caller: Caller,
    *,
    size: int,
    read_seconds: float,
    chunk: int,
    started: float,
    bound: float,
    sampler: Sampler,
) -> None:
    """POST, then read the answer `chunk` bytes at a time, pacing the reads so the whole
    answer takes `read_seconds` (0: as fast as it comes), checking every byte."""
    expected_head, body = head(caller.key)[:size], memoryview(pattern(size))
    loop = asyncio.get_running_loop()
    payload = json.dumps({"ref": caller.key, "size": size}).encode()
    headers = {"Idempotency-Key": caller.key, "Content-Type": "application/json"}
    try:
        async with asyncio.timeout(bound):
            async with session.post(url, data=payload, headers=headers) as answer:
                caller.status = answer.status
                caller.state_header = answer.headers.get("Idempotency-Status", "")
                reading, intact = loop.time(), True
                while True:
                    data = await answer.content.read(chunk)
                    if not data:
                        break
                    offset, caller.received = caller.received, caller.received + len(data)
                    if intact and caller.received <= size:
                        expected = bytes(body[offset : caller.received])
                        if offset < HEAD:
                            end = min(HEAD, caller.received)
                            expected = expected_head[offset:end] + expected[end - offset :]
                        intact = data == expected
                    if read_seconds > 0:
                        due = reading + read_seconds * caller.received / size
                        await asyncio.sleep(max(0.0, due - loop.time()))
                caller.intact = intact and caller.received == size and answer.status == 200
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        caller.error = f"{type(exc).__name__}: {exc}"
    finally:
        caller.seconds = loop.time() - started
        sampler.done += 1


async def _load(
    url: str,
    keys: Sequence[str],
    *,
    size: int,
    read_seconds: float,
    chunk: int,
    bound: float,
    sampler: Sampler,
) -> list[Caller]:
    callers = [Caller(key) for key in keys]
    connector = aiohttp.TCPConnector(limit=len(keys))
    timeout = aiohttp.ClientTimeout(total=bound + 5)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, auto_decompress=False
    ) as session:
        started = asyncio.get_running_loop().time()
        await asyncio.gather(
            *(
                _call(
                    session,
                    url,
                    caller,
                    size=size,
                    read_seconds=read_seconds,
                    chunk=chunk,
                    started=started,
                    bound=bound,
                    sampler=sampler,
                )
                for caller in callers
            )
        )
    return callers


async def _lookups(gateway_url: str, keys: Sequence[str]) -> list[dict[str, object]]:
    """`GET /operations/<key>` of every key (the shared scope: no credential)."""
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout) as session:

        async def one(key: str) -> dict[str, object]:
            async with session.get(f"{gateway_url}/operations/{key}") as answer:
                found: dict[str, object] = await answer.json(content_type=None)
                return found

        return list(await asyncio.gather(*(one(key) for key in keys)))


# -- one phase ---------------------------------------------------------------------------


@dataclass(slots=True)
class Phase:
    """One server under one load, and what was seen."""

    name: str
    server: str
    readers: int
    size: int
    read_seconds: float
    idle_rss: int = 0
    samples: list[Sample] = field(default_factory=list)
    callers: list[Caller] = field(default_factory=list)
    operations: list[dict[str, object]] = field(default_factory=list)
    drained_at: float = math.nan
    """When, after the last caller, the spool was found back to no file and no byte
    (seconds after the load started; NaN: not within `_DRAIN_SECONDS`)."""

    @property
    def gateway(self) -> bool:
        return self.server == "gateway"

    @property
    def peak_rss(self) -> int:
        return max((s.rss for s in self.samples), default=0)

    @property
    def peak_spool(self) -> Sample | None:
        return max(self.samples, key=lambda s: s.spool_bytes, default=None)

    @property
    def emptied(self) -> float:
        """The first sample after the last one that saw a spool file (0: none seen)."""
        seen = [
            i for i, sample in enumerate(self.samples) if sample.spool_files or sample.spool_bytes
        ]
        if not seen:
            return 0.0
        after = seen[-1] + 1
        return self.samples[after].seconds if after < len(self.samples) else self.drained_at

    @property
    def finished(self) -> float:
        return max((caller.seconds for caller in self.callers), default=math.nan)

    @property
    def intact(self) -> int:
        return sum(caller.intact for caller in self.callers)

    @property
    def recorded(self) -> int:
        """Operations `completed` with `body_retained: false`."""
        return sum(
            op.get("state") == "completed" and op.get("body_retained") is False
            for op in self.operations
        )

    @property
    def ok(self) -> bool:
        if self.intact != self.readers:
            return False
        return not self.gateway or (self.recorded == self.readers and self.drained_at >= 0)


def run_phase(
    phase: Phase, workdir: Path, upstream_url: str, *, chunk: int, interval: float, bound: float
) -> Phase:
    """Start the phase's server, read its idle RSS, run the load, sample throughout and
    until the spool is empty again (bounded), look the operations up, stop the server."""
    slug = phase.name.replace(",", "").replace(" ", "-")
    here = workdir / slug
    spool_dir = here / "spool"
    spool_dir.mkdir(parents=True)
    if phase.gateway:
        config = write_config(
            here / "gateway.toml",
            upstream=upstream_url,
            store_url=sqlite_url(here / "gateway.db"),
            spool_dir=spool_dir,
        )
        server = processes.gateway(config)
    else:
        server = processes.plain_proxy(here, upstream_url)
    token = secrets.token_hex(3)
    keys = [f"spool-{token}-{slug}-{index}" for index in range(phase.readers)]
    limit = int((bound + _DRAIN_SECONDS + 5) / interval) + 10
    print(f"{phase.name}:", file=sys.stderr, flush=True)
    with server:
        time.sleep(_SETTLE_SECONDS)
        idle = []
        for _ in range(_IDLE_SAMPLES):
            idle.append(rss_bytes(server.pid))
            time.sleep(interval)
        phase.idle_rss = int(statistics.median(idle))
        sampler = Sampler(
            server.pid, spool_dir if phase.gateway else None, interval=interval, limit=limit
        )
        with sampler:
            url = server.url + _route_prefix() + PATH
            phase.callers = asyncio.run(
                _load(
                    url,
                    keys,
                    size=phase.size,
                    read_seconds=phase.read_seconds,
                    chunk=chunk,
                    bound=bound,
                    sampler=sampler,
                )
            )
            until = time.monotonic() + _DRAIN_SECONDS
            while phase.gateway and time.monotonic() < until:
                now = sampler.sample()
                if now.spool_files == 0 and now.spool_bytes == 0:
                    phase.drained_at = now.seconds
                    break
                time.sleep(interval / 5)
            time.sleep(2 * interval)  # a last sample or two of the settled server
        phase.samples = sampler.samples
        if phase.gateway:
            phase.operations = asyncio.run(_lookups(server.url, keys))
    return phase


@functools.cache
def _route_prefix() -> str:
    prefix: str = tomllib.loads(PRODUCT_CONFIG.read_text())["routes"][0]["prefix"]
    return prefix


def measure(
    workdir: Path,
    *,
    readers: int,
    size: int,
    smaller_size: int,
    read_seconds: float,
    chunk: int,
    interval: float,
    plain_proxy: bool = True,
) -> list[Phase]:
    """Every phase, one after another, against one upstream."""
    bound = 3 * read_seconds + 60  # seconds a phase's load may take (a hung one fails)
    phases = [Phase("gateway, slow readers", "gateway", readers, size, read_seconds)]
    if smaller_size:
        name = "gateway, slow readers, smaller answers"
        phases.append(Phase(name, "gateway", readers, smaller_size, read_seconds))
    phases.append(Phase("gateway, full-speed readers", "gateway", readers, size, 0.0))
    if plain_proxy:
        phases.append(
            Phase("plain proxy, slow readers", "plain proxy", readers, size, read_seconds)
        )
    for phase in phases:
        pattern(phase.size)  # built before any load: the callers compare against it
    with upstream(workdir) as served:
        for phase in phases:
            run_phase(phase, workdir, served.url, chunk=chunk, interval=interval, bound=bound)
    return phases


# -- the report --------------------------------------------------------------------------


def _mib(value: float) -> str:
    return f"{value / _MIB:,.1f}"


def _seconds(value: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.1f}"


def summary_table(phases: Sequence[Phase]) -> Table:
    """A row per phase: memory (VmRSS), the spool (files in `spool_dir`), time, checks."""
    rows = []
    for phase in phases:
        peak = phase.peak_spool if phase.gateway else None
        spool = ("-", "-", "-", "-")
        if peak is not None:
            spool = (
                f"{_mib(peak.spool_bytes)} / {_mib(peak.spool_disk)}",
                str(max(s.spool_files for s in phase.samples)),
                _seconds(peak.seconds),
                _seconds(phase.emptied),
            )
        end = phase.samples[-1].rss if phase.samples else 0
        rows.append(
            (
                phase.name,
                f"{phase.readers} x {phase.size:,}",
                _mib(phase.idle_rss),
                f"{_mib(phase.peak_rss)} (+{_mib(phase.peak_rss - phase.idle_rss)})",
                _mib(end),
                *spool,
                _seconds(phase.finished),
                f"{phase.intact}/{phase.readers}",
                f"{phase.recorded}/{phase.readers}" if phase.gateway else "-",
            )
        )
    return Table(
        (
            "phase",
            "callers x bytes",
            "idle RSS MiB",
            "peak RSS MiB (over idle)",
            "RSS at the end MiB",
            "spool peak MiB: st_size / st_blocks",
            "spool files, peak",
            "spool peak at, s",
            "spool back to 0, s",
            "all callers done, s",
            "answers intact",
            "completed, body_retained false",
        ),
        tuple(rows),
    )


def series_table(phase: Phase, *, every: float = 1.0) -> Table:
    """The phase's samples about `every` seconds apart from the load's start, the ones of
    its peak RSS and its peak spool, and the last (the settled server)."""
    samples = phase.samples
    chosen: set[int] = set()
    for index, sample in enumerate(samples):
        if not chosen or sample.seconds >= samples[max(chosen)].seconds + every - 1e-3:
            chosen.add(index)
    if samples:
        chosen.add(len(samples) - 1)
        chosen.add(max(range(len(samples)), key=lambda i: samples[i].rss))
        chosen.add(max(range(len(samples)), key=lambda i: samples[i].spool_bytes))
    kept = [samples[index] for index in sorted(chosen)]
    rows = tuple(
        (
            f"{s.seconds:.2f}",
            _mib(s.rss),
            _mib(s.spool_bytes) if phase.gateway else "-",
            _mib(s.spool_disk) if phase.gateway else "-",
            str(s.spool_files) if phase.gateway else "-",
            f"{s.done}/{phase.readers}",
        )
        for s in kept
    )
    header = ("t s", "RSS MiB", "spool MiB", "spool MiB on disk", "spool files", "callers done")
    return Table(header, rows)


def section(
    phases: Sequence[Phase], *, chunk: int, interval: float, machine: Sequence[str] = ()
) -> list[str]:
    """The run as a Markdown section: the summary table, ratios, then each phase over time."""
    first = phases[0]
    lines = [
        "## Spooled answers: memory and disk",
        "",
        *machine,
        *([""] if machine else []),
        f"{first.readers} callers at once, each a POST with its own key whose answer is "
        f"{first.size:,} bytes (Content-Length) from a minimal upstream in its own process; "
        f"slow readers take {chunk // 1024} KiB at a time, paced to {first.read_seconds:g} s "
        "per answer; full-speed readers read as fast as it comes. Each phase on a fresh "
        "server process (the gateway: config/gateway.toml's settings, SQLite, `spool_dir` "
        f"in the run's temporary directory); samples every {interval:g} s of its VmRSS and "
        "of its open files in `spool_dir`. Idle RSS: the median of "
        f"{_IDLE_SAMPLES} samples before the load; RSS at the end: the last sample, once "
        "every caller was done and the spool empty; spool back to 0: the first sample "
        "after the last one that saw a spool file.",
        "",
        summary_table(phases).render(),
    ]
    by_name = {phase.name: phase for phase in phases}
    slow, fast = by_name.get("gateway, slow readers"), by_name.get("gateway, full-speed readers")
    smaller = by_name.get("gateway, slow readers, smaller answers")
    plain = by_name.get("plain proxy, slow readers")
    notes = []
    if slow is not None:
        over = slow.peak_rss - slow.idle_rss
        peak = slow.peak_spool
        if peak is not None:
            expected = slow.readers * slow.size
            notes.append(
                f"spool peak / (callers x answer size): {ratio(peak.spool_bytes, expected)} "
                f"(reached at {peak.seconds:.2f} s)"
            )
        if smaller is not None:
            notes.append(
                f"RSS over idle, {slow.size:,}-byte / {smaller.size:,}-byte answers: "
                f"{ratio(over, smaller.peak_rss - smaller.idle_rss)} "
                f"(answer sizes {ratio(slow.size, smaller.size)})"
            )
        if fast is not None:
            notes.append(
                f"RSS over idle, slow / full-speed readers: "
                f"{ratio(over, fast.peak_rss - fast.idle_rss)}"
            )
        if plain is not None:
            notes.append(
                f"RSS over idle, gateway / plain proxy (slow readers): "
                f"{ratio(over, plain.peak_rss - plain.idle_rss)}"
            )
        states = Counter(caller.state_header or "(none)" for caller in slow.callers)
        notes.append(
            "`Idempotency-Status` of the slow readers' answers (sent with the first bytes): "
            + ", ".join(f"{value} {count}" for value, count in sorted(states.items()))
        )
    notes.append(_socket_buffers())
    errors = [f"{p.name}: {c.key}: {c.error}" for p in phases for c in p.callers if c.error]
    notes += errors[:10]
    lines += ["", *(f"- {note}" for note in notes)]
    for phase in phases:
        lines += ["", f"### {phase.name}: over time", "", series_table(phase).render()]
    return lines


def _socket_buffers() -> str:
    """The kernel's TCP buffer sizes (min, default, max bytes): where the last MB of each
    answer wait for their caller, outside the gateway's RSS and its spool."""
    found = []
    for name in ("tcp_wmem", "tcp_rmem"):
        try:
            values = Path(f"/proc/sys/net/ipv4/{name}").read_text().split()
        except OSError:
            values = ["unknown"]
        found.append(f"`net.ipv4.{name}` {' '.join(values)}")
    return "kernel socket buffers (min default max bytes): " + ", ".join(found)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.spool", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--readers", type=int, default=16, help="callers at once (default 16)")
    parser.add_argument(
        "--size", type=int, default=20_000_000, help="bytes of each answer (default 20,000,000)"
    )
    parser.add_argument(
        "--smaller-size",
        type=int,
        default=None,
        help="answer size of the smaller-answers phase (default half of --size; 0: skip)",
    )
    parser.add_argument(
        "--read-seconds", type=float, default=10.0, help="a slow reader's time per answer"
    )
    parser.add_argument("--chunk", type=int, default=64 * 1024, help="bytes a read takes")
    parser.add_argument("--interval", type=float, default=0.25, help="seconds between samples")
    parser.add_argument("--no-plain-proxy", action="store_true", help="skip the baseline proxy")
    parser.add_argument(
        "--quick",
        action="store_true",
        help=f"a smoke run: {QUICK_READERS} readers of {QUICK_SIZE:,} bytes, 1.5 s each",
    )
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run every phase, print the section; exit 1 if an answer or a record was wrong, or
    the spool did not empty."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.serve_upstream:
        asyncio.run(_serve_upstream())
        return 0
    if args.quick:
        args.readers, args.size, args.read_seconds = QUICK_READERS, QUICK_SIZE, 1.5
        args.smaller_size = QUICK_SIZE // 2 if args.smaller_size is None else args.smaller_size
    if args.smaller_size is None:
        args.smaller_size = args.size // 2
    if args.readers < 1 or args.size < HEAD or args.read_seconds < 0 or args.chunk < 1:
        parser.error(f"--readers and --chunk >= 1, --size >= {HEAD}, --read-seconds >= 0")
    if args.interval <= 0 or (args.smaller_size and args.smaller_size < HEAD):
        parser.error(f"--interval > 0; --smaller-size 0 or >= {HEAD}")
    machine = machine_info()
    with tempfile.TemporaryDirectory(prefix="gateway-spool-") as tmp:
        phases = measure(
            Path(tmp),
            readers=args.readers,
            size=args.size,
            smaller_size=args.smaller_size,
            read_seconds=args.read_seconds,
            chunk=args.chunk,
            interval=args.interval,
            plain_proxy=not args.no_plain_proxy,
        )
    lines = section(phases, chunk=args.chunk, interval=args.interval, machine=machine)
    print("\n".join(lines), flush=True)
    return 0 if all(phase.ok for phase in phases) else 1


if __name__ == "__main__":
    raise SystemExit(main())
