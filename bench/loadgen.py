"""A closed-loop HTTP load generator, run in its own process, bounded in time.

`concurrency` workers each send a request, wait for the whole response and
send the next, for `warmup + duration` seconds (or until `requests` measured
responses). Only the `duration` window after the warm-up is measured. It runs
as a separate process (`run_load` starts `python -m bench.loadgen`) so the
server under test is never charged for the client's CPU, and it reads the
server's CPU time from /proc at the edges of the measured window itself, so
its own start-up and the replay warm-up are never charged either. With
`cpu_tree` a server is the process and all its descendants (a supervisor and
its workers), summed (`bench.procstat.tree_cpu`).

It is built on aiohttp so that the benchmark runs anywhere the project
does; when `wrk` is installed, `LoadSpec(client="wrk")` makes `run_load`
drive the same row with wrk instead (`bench.wrk`, same `LoadResult`). The
aiohttp client costs 100 us or more of CPU a request (measured on the bench machine), so one
generator process saturates near 10,000 req/s or sooner: the result says how
busy the client was (`client_cpu`) so a client-bound row can be flagged
instead of misread.

Key modes (what `Idempotency-Key` each request carries):

- `new`: a unique key per request (the gateway's miss path);
- `replay`: a fixed set of keys, each sent once before the measured window,
  then repeated in turn (the replay path);
- `mix10`: like `new`, but 10% of requests reuse a key that already completed;
- `none`: no key (the tool API directly, the plain proxy);
- `lookup`: no header; `{key}` in the URL becomes a random pre-filled key
  (`bench.prefill.fill_key`), for `GET /operations/{key}`.

Bodies (POST, PUT, PATCH): a JSON ticket of `body_size` bytes whose padding
starts with the request's key (`JsonBodies`), so every new key is a distinct
request and a key sent again sends the same bytes. The gateway refuses a new
key for the same request as one in flight (409 `similar-operation`): with one
body for all keys, a miss row would measure those refusals, not misses.
Requests without a key (`none`) all send the body of the empty tag.

Run it alone with::

    python -m bench.loadgen --url http://127.0.0.1:8080/tickets/v1/issues --mode new

(add `--client wrk` to run the same load with wrk).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import random
import secrets
import subprocess
import sys
import time
from array import array
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Literal, get_args

import aiohttp

from bench.prefill import fill_key
from bench.procstat import cpu_seconds, tree_cpu, tree_cpu_delta

__all__ = [
    "BODY_METHODS",
    "CLIENTS",
    "KEY_ROOM",
    "Client",
    "CpuSample",
    "JsonBodies",
    "KeyMode",
    "LoadResult",
    "LoadSpec",
    "finish_load",
    "json_body",
    "main",
    "run_load",
    "sample_server_cpu",
    "server_cpu_since",
    "start_load",
    "warm_replay_keys",
]

KeyMode = Literal["new", "replay", "mix10", "none", "lookup"]
KEY_MODES: tuple[str, ...] = get_args(KeyMode)
Client = Literal["aiohttp", "wrk"]
"""Which generator drives the load: this module's, or wrk through `bench.wrk`."""
CLIENTS: tuple[str, ...] = get_args(Client)

REQUEST_TIMEOUT = 30.0
"""No single request may hang a row: a response later than this counts as an error."""
_REUSE_SHARE = 0.10
_REUSE_POOL = 10_000
"""mix10 reuses one of the last keys that completed; a bounded pool keeps memory flat."""


BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})
"""The methods whose requests carry a JSON body."""
KEY_ROOM = 48
"""Bytes a body keeps for its tag: more than any key a generator makes (the longest,
wrk's "bench-<8 hex>-w-t<thread>-<n>", is about 30)."""
_JSON_HEAD = b'{"title":"benchmark ticket","pad":"'
_JSON_TAIL = b'"}'


class JsonBodies:
    """JSON tickets of exactly `size` bytes, one per tag: the tag starts the padding.

    The gateway refuses a new key for the same request as one still in flight
    (409 `similar-operation`), so a load that means a distinct effect per key
    sends a distinct body per key; a key sent again must send the same bytes.
    A request's body is therefore its key's: `bodies(key)`. The tag "" gives
    `template`, the body of requests without a key. A body is `template` with
    the tag written over it at `offset` (two slices and a join: cheap enough
    for the generator's hot path); `bench/wrk_keys.lua` builds the same bytes
    from `template` and `offset`.

    >>> bodies = JsonBodies(200)
    >>> one = bodies("bench-1")
    >>> len(one), one == bodies("bench-1"), one != bodies("bench-2"), len(bodies("bench-2"))
    (200, True, True, 200)
    >>> json.loads(one)["pad"][:10], json.loads(bodies(""))["title"]
    ('bench-1xxx', 'benchmark ticket')
    """

    __slots__ = ("offset", "room", "size", "template")

    def __init__(self, size: int) -> None:
        room = size - len(_JSON_HEAD) - len(_JSON_TAIL)
        if room < 0:
            least = len(_JSON_HEAD) + len(_JSON_TAIL)
            raise ValueError(f"a body needs at least {least} bytes, got {size}")
        self.size = size
        self.room = room  # the longest tag that fits
        self.offset = len(_JSON_HEAD)
        self.template = _JSON_HEAD + b"x" * room + _JSON_TAIL

    def __call__(self, tag: str) -> bytes:
        """The body for `tag` (printable ASCII, no quote or backslash: it is not escaped)."""
        if not tag:
            return self.template
        if len(tag) > self.room:
            raise ValueError(f"a body of {self.size} bytes has room for {self.room}: {tag!r}")
        if not (tag.isascii() and tag.isprintable()) or '"' in tag or "\\" in tag:
            raise ValueError(f'a body tag must be printable ASCII without \\ or ": {tag!r}')
        offset = self.offset
        return self.template[:offset] + tag.encode() + self.template[offset + len(tag) :]


def json_body(size: int, tag: str = "") -> bytes:
    """A JSON ticket of exactly `size` bytes (the tool API needs a string "title"),
    its padding starting with `tag` (`JsonBodies`): distinct tags, distinct bodies.

    >>> len(json_body(200)), json.loads(json_body(200))["title"]
    (200, 'benchmark ticket')
    >>> json_body(60, "k-1")
    b'{"title":"benchmark ticket","pad":"k-1xxxxxxxxxxxxxxxxxxxx"}'
    """
    return JsonBodies(size)(tag)


@dataclass(frozen=True, slots=True)
class LoadSpec:
    """One row's load: where, how many at once, for how long, with which keys."""

    url: str
    mode: KeyMode
    concurrency: int = 64
    duration: float = 10.0
    warmup: float = 1.0
    requests: int | None = None
    """Stop the measured window after this many responses (else after `duration`)."""
    method: str = "POST"
    body_size: int = 200
    replay_keys: int = 1000
    lookup_keys: int = 0
    """How many pre-filled keys exist (`fill_key(0..n-1)`), for `lookup`."""
    cpu_pids: tuple[int, ...] = ()
    """Processes whose CPU time the result reports, measured over the window."""
    cpu_tree: bool = False
    """Charge each of `cpu_pids` its descendants' CPU too (a supervisor and its workers)."""
    client: Client = "aiohttp"
    """The generator `run_load` uses; `start_load` (the soak's sampler) is aiohttp only."""

    def __post_init__(self) -> None:
        if self.mode not in KEY_MODES:
            raise ValueError(f"mode: expected one of {KEY_MODES}, got {self.mode!r}")
        if self.client not in CLIENTS:
            raise ValueError(f"client: expected one of {CLIENTS}, got {self.client!r}")
        if self.client == "wrk" and self.requests is not None:
            # wrk stops on time only. Quietly running such a row with aiohttp
            # instead would make the results' "load generator: wrk" line false.
            raise ValueError(
                "requests (a cap on responses) needs client='aiohttp': wrk stops on time only"
            )
        if self.concurrency < 1 or self.duration <= 0 or self.warmup < 0:
            raise ValueError("concurrency must be >= 1, duration > 0 and warmup >= 0")
        if self.mode == "lookup" and (self.lookup_keys < 1 or "{key}" not in self.url):
            raise ValueError("lookup needs lookup_keys >= 1 and a URL containing {key}")
        if self.method in BODY_METHODS and self.mode in ("new", "replay", "mix10"):
            room = self.body_size - len(_JSON_HEAD) - len(_JSON_TAIL)
            if room < KEY_ROOM:
                raise ValueError(
                    f"body_size: a keyed body needs {KEY_ROOM} bytes of padding for its key, "
                    f"so at least {self.body_size - room + KEY_ROOM}; got {self.body_size}"
                )

    def argv(self) -> list[str]:
        """This spec as `python -m bench.loadgen` arguments (for the aiohttp generator)."""
        args = [
            "--url", self.url,
            "--mode", self.mode,
            "--concurrency", str(self.concurrency),
            "--duration", str(self.duration),
            "--warmup", str(self.warmup),
            "--method", self.method,
            "--body-size", str(self.body_size),
            "--replay-keys", str(self.replay_keys),
            "--lookup-keys", str(self.lookup_keys),
        ]  # fmt: skip
        if self.requests is not None:
            args += ["--requests", str(self.requests)]
        for pid in self.cpu_pids:
            args += ["--cpu-pid", str(pid)]
        if self.cpu_tree:
            args.append("--cpu-tree")
        return args


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one measured window saw. Latencies in milliseconds, CPU in seconds."""

    seconds: float
    responses: int
    ok: int
    """2xx responses."""
    duplicates: int
    """409: the key is in progress elsewhere; a correct refusal, not an error."""
    non_2xx: int
    """Any other status."""
    errors: int
    """No response at all: connection errors and timeouts."""
    p50_ms: float
    p99_ms: float
    max_ms: float
    client_cpu: float
    """The generator's CPU seconds over the window; near `seconds` means client-bound."""
    server_cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds over the window, by pid (as a string: JSON keys)."""
    statuses: dict[str, int] = field(default_factory=dict)
    server_processes: dict[str, int] = field(default_factory=dict)
    """Processes alive in each server's tree at the window's end, by pid (1 without
    `cpu_tree`): says whether a multi-process server really ran several."""

    @property
    def throughput(self) -> float:
        """Answered requests (2xx and 409) per second."""
        return (self.ok + self.duplicates) / self.seconds if self.seconds > 0 else 0.0

    def cpu_us_per_request(self, pid: int) -> float:
        answered = self.ok + self.duplicates
        return self.server_cpu[str(pid)] / answered * 1e6 if answered else math.nan

    @property
    def client_bound(self) -> bool:
        """The generator was busy most of the window: the server may have had more to give."""
        return self.client_cpu >= 0.9 * self.seconds


CpuSample = dict[int, dict[int, float]]
"""CPU seconds so far, by server pid, then by pid in that server's tree."""


def sample_server_cpu(spec: LoadSpec) -> CpuSample:
    """The CPU time of `spec.cpu_pids` now (of their whole trees with `spec.cpu_tree`)."""
    if spec.cpu_tree:
        return {pid: tree_cpu(pid) for pid in spec.cpu_pids}
    return {pid: {pid: cpu_seconds(pid)} for pid in spec.cpu_pids}


def server_cpu_since(
    spec: LoadSpec, before: Mapping[int, Mapping[int, float]]
) -> tuple[dict[str, float], dict[str, int]]:
    """CPU seconds each server used since `before`, and its processes now (JSON-keyed)."""
    after = sample_server_cpu(spec)
    used = {str(pid): tree_cpu_delta(before[pid], tree) for pid, tree in after.items()}
    return used, {str(pid): len(tree) for pid, tree in after.items()}


def run_load(spec: LoadSpec) -> LoadResult:
    """Run `spec` with its client: wrk, or a fresh `python -m bench.loadgen` process."""
    if spec.client == "wrk":
        # Imported here: bench.wrk imports this module for LoadSpec and LoadResult.
        from bench.wrk import run_wrk

        return run_wrk(spec)
    return finish_load(start_load(spec), spec)


def start_load(spec: LoadSpec) -> subprocess.Popen[str]:
    """Start the generator process for `spec` without waiting (for samplers such as the soak)."""
    if spec.client != "aiohttp":
        raise ValueError(f"start_load runs the aiohttp generator only, not {spec.client!r}")
    return subprocess.Popen(
        [sys.executable, "-m", "bench.loadgen", *spec.argv(), "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish_load(process: subprocess.Popen[str], spec: LoadSpec) -> LoadResult:
    """Wait for a generator started by `start_load` (killing it past its budget); its result."""
    budget = spec.warmup + spec.duration + REQUEST_TIMEOUT + 60.0
    if spec.mode == "replay":
        budget += REQUEST_TIMEOUT + spec.replay_keys / 50  # warming at a slow 50 keys/s
    try:
        stdout, stderr = process.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise RuntimeError(f"the load generator ran past its {budget:.0f} s budget") from None
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    if process.returncode != 0:
        raise RuntimeError(f"the load generator failed ({process.returncode}):\n{stderr[-2000:]}")
    document = json.loads(stdout.strip().splitlines()[-1])
    return LoadResult(**document)


# -- inside the generator process ---------------------------------------------------


class _Keys:
    """Chooses each request's key (and URL) according to the mode."""

    def __init__(self, spec: LoadSpec, rng: random.Random) -> None:
        self._spec = spec
        self._rng = rng
        self._run = f"bench-{secrets.token_hex(4)}"
        self._count = 0
        self.replay = [f"{self._run}-r{i}" for i in range(spec.replay_keys)]
        self._done: list[str] = []

    def next(self) -> tuple[str, str | None]:
        """The URL and the Idempotency-Key (None: send no header) of the next request."""
        mode, url = self._spec.mode, self._spec.url
        self._count += 1
        if mode == "none":
            return url, None
        if mode == "lookup":
            return url.replace("{key}", fill_key(self._rng.randrange(self._spec.lookup_keys))), None
        if mode == "replay":
            return url, self.replay[self._count % len(self.replay)]
        if mode == "mix10" and self._done and self._rng.random() < _REUSE_SHARE:
            return url, self._rng.choice(self._done)
        return url, f"{self._run}-{self._count}"

    def completed(self, key: str | None) -> None:
        if self._spec.mode != "mix10" or key is None:
            return
        if len(self._done) < _REUSE_POOL:
            self._done.append(key)
        else:
            self._done[self._count % _REUSE_POOL] = key


@dataclass
class _Window:
    """The measured window's state, shared by the workers and the timer."""

    measuring: bool = False
    stopping: bool = False
    latencies: array[float] = field(default_factory=lambda: array("d"))
    statuses: Counter[int] = field(default_factory=Counter)
    errors: int = 0
    enough: asyncio.Event = field(default_factory=asyncio.Event)


class _Generator:
    """One load run: the workers, the timer that opens and closes the window, the tally."""

    def __init__(self, spec: LoadSpec) -> None:
        self.spec = spec
        self.keys = _Keys(spec, random.Random(0x1DE))
        self.window = _Window()
        self.bodies = _request_bodies(spec)

    async def run(self) -> LoadResult:
        async with _session(self.spec) as session:
            if self.spec.mode == "replay":
                await _send_each(session, self.spec, self.keys.replay)
            workers = [
                asyncio.create_task(self._worker(session)) for _ in range(self.spec.concurrency)
            ]
            try:
                return await self._measure()
            finally:
                self.window.stopping = True
                # Each worker finishes at most the one request it has in flight.
                _, pending = await asyncio.wait(workers, timeout=REQUEST_TIMEOUT + 5)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)

    async def _measure(self) -> LoadResult:
        window = self.window
        await asyncio.sleep(self.spec.warmup)
        # Read before the clock starts: a tree's /proc scan takes milliseconds.
        servers_before = sample_server_cpu(self.spec)
        started, client_before = time.perf_counter(), time.process_time()
        window.measuring = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(window.enough.wait(), self.spec.duration)
        window.stopping = True
        elapsed, client_cpu = time.perf_counter() - started, time.process_time() - client_before
        server_cpu, server_processes = server_cpu_since(self.spec, servers_before)
        latencies = sorted(window.latencies)
        statuses = window.statuses
        ok = sum(n for status, n in statuses.items() if 200 <= status < 300)
        return LoadResult(
            seconds=elapsed,
            responses=len(latencies),
            ok=ok,
            duplicates=statuses[409],
            non_2xx=len(latencies) - ok - statuses[409],
            errors=window.errors,
            p50_ms=_percentile(latencies, 0.50),
            p99_ms=_percentile(latencies, 0.99),
            max_ms=latencies[-1] if latencies else math.nan,
            client_cpu=client_cpu,
            server_cpu=server_cpu,
            statuses={str(status): n for status, n in sorted(statuses.items())},
            server_processes=server_processes,
        )

    async def _worker(self, session: aiohttp.ClientSession) -> None:
        window, cap = self.window, self.spec.requests
        while not window.stopping:
            url, key = self.keys.next()
            body = self.bodies(key or "") if self.bodies is not None else None
            sent = time.perf_counter()
            try:
                status = await _send(session, self.spec, body, url, key)
            except (aiohttp.ClientError, TimeoutError):
                if window.measuring and not window.stopping:
                    window.errors += 1
                await asyncio.sleep(0.01)  # a dead server must not turn this into a busy loop
                continue
            if window.measuring and not window.stopping:
                window.latencies.append((time.perf_counter() - sent) * 1000)
                window.statuses[status] += 1
                if cap is not None and len(window.latencies) >= cap:
                    window.enough.set()
            if 200 <= status < 300:
                self.keys.completed(key)


def warm_replay_keys(spec: LoadSpec, keys: Sequence[str]) -> None:
    """Send each of `keys` once with `spec`'s request, so a measured window only replays.

    For generators that cannot do it themselves (`bench.wrk`): the same
    requests, `spec.concurrency` at a time, as this generator's own warm-up.
    """

    async def warm() -> None:
        async with _session(spec) as session:
            await _send_each(session, spec, keys)

    asyncio.run(warm())


def _request_bodies(spec: LoadSpec) -> JsonBodies | None:
    """The bodies of `spec`'s requests, by key (None: its method sends none)."""
    return JsonBodies(spec.body_size) if spec.method in BODY_METHODS else None


def _session(spec: LoadSpec) -> aiohttp.ClientSession:
    """A client session holding at most `spec.concurrency` connections."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=spec.concurrency),
        auto_decompress=False,
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
    )


async def _send_each(session: aiohttp.ClientSession, spec: LoadSpec, keys: Sequence[str]) -> None:
    """Send every key once, `spec.concurrency` at a time (the replay warm-up), each
    with its key's body: the bytes the measured window sends again under it."""
    bodies, queue = _request_bodies(spec), list(keys)

    async def warm() -> None:
        while queue:
            key = queue.pop()
            body = bodies(key) if bodies is not None else None
            await _send(session, spec, body, spec.url, key)

    async with asyncio.timeout(REQUEST_TIMEOUT + len(queue) / 50):
        await asyncio.gather(*(warm() for _ in range(spec.concurrency)))


async def _send(
    session: aiohttp.ClientSession, spec: LoadSpec, body: bytes | None, url: str, key: str | None
) -> int:
    """One request (the key, bare, in `Idempotency-Key` unless None); its status."""
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if key is not None:
        headers["Idempotency-Key"] = key
    async with session.request(spec.method, url, data=body, headers=headers) as response:
        await response.read()
        return response.status


def _percentile(ordered: Sequence[float], share: float) -> float:
    """Nearest-rank percentile of an ascending sequence (NaN when empty)."""
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.loadgen", description="A closed-loop HTTP load generator."
    )
    parser.add_argument("--url", required=True, help="target URL ({key} is replaced in lookup)")
    parser.add_argument("--mode", choices=KEY_MODES, default="new", help="key mode (default new)")
    parser.add_argument("--concurrency", type=int, default=64, help="requests in flight")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--requests", type=int, help="stop after this many measured responses")
    parser.add_argument("--method", default="POST", help="HTTP method (default POST)")
    parser.add_argument(
        "--body-size", type=int, default=200, help="JSON body bytes (the key in its padding)"
    )
    parser.add_argument("--replay-keys", type=int, default=1000, help="key set size for replay")
    parser.add_argument("--lookup-keys", type=int, default=0, help="pre-filled keys for lookup")
    parser.add_argument(
        "--cpu-pid", type=int, action="append", default=[], help="report this pid's CPU"
    )
    parser.add_argument(
        "--cpu-tree",
        action="store_true",
        help="charge each --cpu-pid its descendants' CPU too (a supervisor and its workers)",
    )
    parser.add_argument(
        "--client", choices=CLIENTS, default="aiohttp", help="generator (default aiohttp)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one load and print its result."""
    args = _parser().parse_args(argv)
    spec = LoadSpec(
        url=args.url,
        mode=args.mode,
        concurrency=args.concurrency,
        duration=args.duration,
        warmup=args.warmup,
        requests=args.requests,
        method=args.method.upper(),
        body_size=args.body_size,
        replay_keys=args.replay_keys,
        lookup_keys=args.lookup_keys,
        cpu_pids=tuple(args.cpu_pid),
        cpu_tree=args.cpu_tree,
        client=args.client,
    )
    if spec.client == "wrk":
        from bench.wrk import run_wrk  # see run_load

        result = run_wrk(spec)
    else:
        result = asyncio.run(_Generator(spec).run())
    if args.json:
        print(json.dumps(asdict(result)), flush=True)
    else:
        print(
            f"{result.throughput:,.0f} req/s  p50 {result.p50_ms:.2f} ms  "
            f"p99 {result.p99_ms:.2f} ms  ok {result.ok}  409 {result.duplicates}  "
            f"other {result.non_2xx}  errors {result.errors}  statuses {result.statuses}  "
            f"client CPU {result.client_cpu / result.seconds:.0%}"
        )
        for pid, seconds in result.server_cpu.items():
            share = seconds / result.seconds
            processes = result.server_processes.get(pid, 1)
            tree = f" (tree of {processes} processes)" if processes > 1 else ""
            print(
                f"pid {pid}{tree}: {share:.0%} CPU, "
                f"{result.cpu_us_per_request(int(pid)):.0f} us/request"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
