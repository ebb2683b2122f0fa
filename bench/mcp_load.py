"""A closed-loop MCP load generator: `tools/call` over plain HTTP, in its own process.

The official SDK client costs far more CPU a call than the server under test
would get on a 2-core machine, so this speaks the Streamable HTTP transport
itself with aiohttp, the way `bench.loadgen` drives the HTTP rows: each of
`concurrency` workers is one agent that opens its MCP session once and then
calls the tool, waits for the whole answer, and calls again, for
`warmup + duration` seconds (or until `requests` measured answers). Every
call carries a fresh `params._meta.idempotencyKey` (the gateway's miss path),
or with `--no-key` none (the gateway passes such a call on unrecorded: the
cost of the hop alone). Every call is also a distinct request: its tool
arguments name it (`arguments`: the title ends with the call's key, or with
`--no-key` the name the key would have had), because the gateway refuses a
new key for the same call as one still in flight (an `isError` result,
`similar-operation`), and a row of identical calls under fresh keys would
measure those refusals.

Protocol generations (`--protocol`):

- `2025-11-25` (sessions): each worker POSTs `initialize`, reads the
  `Mcp-Session-Id`, POSTs `notifications/initialized`, then its calls with
  `Mcp-Session-Id` and `MCP-Protocol-Version: 2025-11-25`; at the end it
  DELETEs its session. Answers are JSON or an event stream, as the server
  chooses (`Accept: application/json, text/event-stream`);
- `2026-07-28` (stateless): no handshake, no session; every call stands alone
  with `Mcp-Method`/`Mcp-Name` headers and the protocol version, client info
  and capabilities in `params._meta`.

An answer counts as `ok` only when it is HTTP 200 carrying the JSON-RPC
response to that call, a tool result with `isError: false` that is not
marked replayed; anything else is counted, by what it was, in `non_2xx`
(the field's name is `bench.loadgen`'s; here it means "answered, but not
the tool's success"), and no answer at all in `errors`. The result is a
`bench.loadgen.LoadResult`, so the tables treat both generators alike. The
server CPU of `cpu_pids` is read from /proc at the edges of the measured
window, so session set-up and warm-up are never charged.

    python -m bench.mcp_load --url http://127.0.0.1:8080/tools --concurrency 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import secrets
import subprocess
import sys
import time
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import aiohttp

from bench.jsonrpc_answers import response_in
from bench.loadgen import REQUEST_TIMEOUT, LoadResult
from bench.loadgen import _percentile as percentile
from bench.procstat import cpu_seconds

__all__ = [
    "PROTOCOLS",
    "TITLE",
    "McpLoadSpec",
    "Protocol",
    "arguments",
    "main",
    "merge_results",
    "read_latencies",
    "run_mcp_load",
]

Protocol = Literal["2025-11-25", "2026-07-28"]
PROTOCOLS: tuple[str, ...] = get_args(Protocol)
SESSION_PROTOCOL: Protocol = "2025-11-25"
STATELESS_PROTOCOL: Protocol = "2026-07-28"

TOOL = "create_ticket"
TITLE = "benchmark ticket"
_CLOSE_TIMEOUT = 5.0
"""Seconds all workers together get to DELETE their sessions at the end."""
_ERROR_PAUSE = 0.01
"""A dead server must not turn a worker into a busy loop."""
_CLIENT_INFO = {"name": "bench.mcp_load", "version": "1"}


@dataclass(frozen=True, slots=True)
class McpLoadSpec:
    """One MCP row's load: where, which protocol, how many agents at once, for how long."""

    url: str
    protocol: Protocol = SESSION_PROTOCOL
    concurrency: int = 16
    duration: float = 10.0
    warmup: float = 1.0
    requests: int | None = None
    """Stop the measured window after this many answers (else after `duration`)."""
    cpu_pids: tuple[int, ...] = ()
    keyed: bool = True
    """Every call with a fresh `_meta.idempotencyKey`; False: none (the gateway passes it on)."""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise ValueError(f"protocol: expected one of {PROTOCOLS}, got {self.protocol!r}")
        if self.concurrency < 1 or self.duration <= 0 or self.warmup < 0:
            raise ValueError("concurrency must be >= 1, duration > 0 and warmup >= 0")
        if self.requests is not None and self.requests < 1:
            raise ValueError("requests must be >= 1")

    def argv(self) -> list[str]:
        """This spec as `python -m bench.mcp_load` arguments."""
        args = [
            "--url", self.url,
            "--protocol", self.protocol,
            "--concurrency", str(self.concurrency),
            "--duration", str(self.duration),
            "--warmup", str(self.warmup),
        ]  # fmt: skip
        if self.requests is not None:
            args += ["--requests", str(self.requests)]
        for pid in self.cpu_pids:
            args += ["--cpu-pid", str(pid)]
        if not self.keyed:
            args.append("--no-key")
        return args


def arguments(name: str) -> dict[str, str]:
    """The tool arguments of the call `name` (its key, when it has one): distinct
    names, distinct calls; the same name, the same arguments.

    >>> arguments("bench-mcp-0a1b-3-17")
    {'title': 'benchmark ticket bench-mcp-0a1b-3-17'}
    """
    return {"title": f"{TITLE} {name}"}


def run_mcp_load(spec: McpLoadSpec, *, latencies: Path | None = None) -> LoadResult:
    """Run `spec` in a fresh `python -m bench.mcp_load` process (killed past its budget).

    With `latencies`, the measured window's latencies (ms, ascending) are also
    written to that file (`read_latencies` reads them), for `merge_results`."""
    budget = spec.warmup + spec.duration + 2 * REQUEST_TIMEOUT + _CLOSE_TIMEOUT + 60.0
    extra = ["--latencies", str(latencies)] if latencies is not None else []
    process = subprocess.Popen(
        [sys.executable, "-m", "bench.mcp_load", *spec.argv(), *extra, "--json"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=budget)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise RuntimeError(f"the MCP load generator ran past its {budget:.0f} s budget") from None
    if process.returncode != 0:
        raise RuntimeError(
            f"the MCP load generator failed ({process.returncode}):\n{stderr[-2000:]}"
        )
    return LoadResult(**json.loads(stdout.strip().splitlines()[-1]))


def read_latencies(path: Path) -> array[float]:
    """The latencies `run_mcp_load(..., latencies=path)` wrote (ms, ascending)."""
    values = array("d")
    values.frombytes(path.read_bytes())
    return values


def merge_results(parts: Sequence[tuple[LoadResult, Sequence[float]]]) -> LoadResult:
    """One result from several windows of one load (each with its latencies): counts,
    seconds and CPU add up; the percentiles are those of all the latencies together.

    >>> one = LoadResult(1.0, 2, 2, 0, 0, 0, 1.0, 2.0, 2.0, 0.1, {"7": 0.5}, {"ok": 2})
    >>> two = LoadResult(1.0, 2, 1, 0, 1, 0, 3.0, 4.0, 4.0, 0.1, {"7": 0.5}, {"ok": 1, "x": 1})
    >>> both = merge_results([(one, [1.0, 2.0]), (two, [3.0, 4.0])])
    >>> both.p50_ms, both.ok, both.statuses, both.cpu_us_per_request(7)
    (2.0, 3, {'ok': 3, 'x': 1}, 333333.3333333333)
    """
    latencies = sorted(value for _, values in parts for value in values)
    cpu: Counter[str] = Counter()
    statuses: Counter[str] = Counter()
    for result, _ in parts:
        cpu.update(result.server_cpu)
        statuses.update(result.statuses)
    return LoadResult(
        seconds=sum(result.seconds for result, _ in parts),
        responses=sum(result.responses for result, _ in parts),
        ok=sum(result.ok for result, _ in parts),
        duplicates=sum(result.duplicates for result, _ in parts),
        non_2xx=sum(result.non_2xx for result, _ in parts),
        errors=sum(result.errors for result, _ in parts),
        p50_ms=percentile(latencies, 0.50),
        p99_ms=percentile(latencies, 0.99),
        max_ms=latencies[-1] if latencies else math.nan,
        client_cpu=sum(result.client_cpu for result, _ in parts),
        server_cpu=dict(cpu),
        statuses=dict(sorted(statuses.items())),
    )


# -- inside the generator process ---------------------------------------------------


class _NoSession(Exception):
    """The handshake did not give this agent a session (counted as an error)."""


class _Agent:
    """One simulated agent: its session (2025-11-25 only) and its calls, one at a time."""

    def __init__(self, http: aiohttp.ClientSession, spec: McpLoadSpec, name: str) -> None:
        self._http = http
        self._spec = spec
        self._name = name
        self._calls = 0
        self.session_id: str | None = None
        stateless = spec.protocol == STATELESS_PROTOCOL
        self._headers = {
            "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream",
            "MCP-Protocol-Version": spec.protocol,
        }
        if stateless:
            self._headers |= {"Mcp-Method": "tools/call", "Mcp-Name": TOOL}
        self._envelope: dict[str, Any] = (
            {
                "io.modelcontextprotocol/protocolVersion": STATELESS_PROTOCOL,
                "io.modelcontextprotocol/clientInfo": _CLIENT_INFO,
                "io.modelcontextprotocol/clientCapabilities": {},
            }
            if stateless
            else {}
        )

    @property
    def ready(self) -> bool:
        return self._spec.protocol == STATELESS_PROTOCOL or self.session_id is not None

    async def open(self) -> None:
        """`initialize` and `notifications/initialized`: a session for the calls."""
        initialize = {
            "jsonrpc": "2.0",
            "id": 0,
            "method": "initialize",
            "params": {
                "protocolVersion": SESSION_PROTOCOL,
                "capabilities": {},
                "clientInfo": _CLIENT_INFO,
            },
        }
        headers = {k: v for k, v in self._headers.items() if k != "MCP-Protocol-Version"}
        async with self._http.post(
            self._spec.url, data=json.dumps(initialize), headers=headers
        ) as response:
            body = await response.read()
            session_id = response.headers.get("Mcp-Session-Id")
            answer = response_in(body, 0)
        if response.status != 200 or session_id is None or answer is None or "result" not in answer:
            raise _NoSession(f"initialize answered HTTP {response.status}: {body[:200]!r}")
        self._headers["Mcp-Session-Id"] = session_id
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        async with self._http.post(
            self._spec.url, data=json.dumps(initialized), headers=self._headers
        ) as response:
            await response.read()
        if response.status != 202:
            raise _NoSession(f"notifications/initialized answered HTTP {response.status}")
        self.session_id = session_id

    async def call(self) -> str:
        """One `tools/call` with a new key; "ok", or what else came back."""
        self._calls += 1
        call_id = self._calls
        meta = dict(self._envelope)
        name = f"{self._name}-{call_id}"
        if self._spec.keyed:
            meta["idempotencyKey"] = name
        params: dict[str, Any] = {"name": TOOL, "arguments": arguments(name)}
        if meta:
            params["_meta"] = meta
        message = {"jsonrpc": "2.0", "id": call_id, "method": "tools/call", "params": params}
        async with self._http.post(
            self._spec.url, data=json.dumps(message), headers=self._headers
        ) as response:
            body = await response.read()
        if response.status != 200:
            if response.status == 404 and self.session_id is not None:
                self.session_id = None  # the server forgot the session: open a new one
            return f"HTTP {response.status}"
        return _verdict(response_in(body, call_id))

    async def close(self) -> None:
        """DELETE the session, so the server does not keep it until its idle timeout."""
        if self.session_id is None:
            return
        async with self._http.delete(self._spec.url, headers=self._headers) as response:
            await response.read()
        self.session_id = None


def _verdict(answer: dict[str, Any] | None) -> str:
    """ "ok" for the tool's own success, first answered; else what the answer was."""
    if answer is None:
        return "no response to the call"
    if "error" in answer:
        return f"JSON-RPC error {answer['error'].get('code')}"
    result = answer.get("result")
    if not isinstance(result, dict):
        return "no result"
    if (result.get("_meta") or {}).get("idempotencyReplayed"):
        return "replayed"  # a fresh key must never be a replay
    if result.get("isError") is not False:
        return "isError"
    return "ok"


@dataclass
class _Window:
    """The measured window's state, shared by the workers and the timer."""

    measuring: bool = False
    stopping: bool = False
    latencies: array[float] = field(default_factory=lambda: array("d"))
    verdicts: Counter[str] = field(default_factory=Counter)
    errors: int = 0
    enough: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def counting(self) -> bool:
        return self.measuring and not self.stopping


class _Generator:
    def __init__(self, spec: McpLoadSpec) -> None:
        self.spec = spec
        self.window = _Window()
        self.run_name = f"bench-mcp-{secrets.token_hex(4)}"
        self.latencies: list[float] = []
        """The measured window's latencies, ascending, once `run` returned."""

    async def run(self) -> LoadResult:
        spec = self.spec
        async with aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=spec.concurrency),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT),
        ) as http:
            agents = [_Agent(http, spec, f"{self.run_name}-{n}") for n in range(spec.concurrency)]
            workers = [asyncio.create_task(self._worker(agent)) for agent in agents]
            try:
                return await self._measure()
            finally:
                self.window.stopping = True
                # Each worker finishes at most the one call it has in flight.
                _, pending = await asyncio.wait(workers, timeout=REQUEST_TIMEOUT + 5)
                for task in pending:
                    task.cancel()
                await asyncio.gather(*workers, return_exceptions=True)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_CLOSE_TIMEOUT):
                        await asyncio.gather(
                            *(agent.close() for agent in agents), return_exceptions=True
                        )

    async def _measure(self) -> LoadResult:
        window, pids = self.window, self.spec.cpu_pids
        await asyncio.sleep(self.spec.warmup)
        started, client_before = time.perf_counter(), time.process_time()
        servers_before = {pid: cpu_seconds(pid) for pid in pids}
        window.measuring = True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(window.enough.wait(), self.spec.duration)
        window.stopping = True
        elapsed, client_cpu = time.perf_counter() - started, time.process_time() - client_before
        server_cpu = {str(pid): cpu_seconds(pid) - servers_before[pid] for pid in pids}
        latencies = self.latencies = sorted(window.latencies)
        ok = window.verdicts["ok"]
        return LoadResult(
            seconds=elapsed,
            responses=len(latencies),
            ok=ok,
            duplicates=0,
            non_2xx=len(latencies) - ok,
            errors=window.errors,
            p50_ms=percentile(latencies, 0.50),
            p99_ms=percentile(latencies, 0.99),
            max_ms=latencies[-1] if latencies else math.nan,
            client_cpu=client_cpu,
            server_cpu=server_cpu,
            statuses=dict(sorted(window.verdicts.items())),
        )

    async def _worker(self, agent: _Agent) -> None:
        window, cap = self.window, self.spec.requests
        while not window.stopping:
            try:
                if not agent.ready:
                    await agent.open()
                    continue
                sent = time.perf_counter()
                verdict = await agent.call()
            except (aiohttp.ClientError, TimeoutError, _NoSession):
                if window.counting:
                    window.errors += 1
                await asyncio.sleep(_ERROR_PAUSE)
                continue
            if window.counting:
                window.latencies.append((time.perf_counter() - sent) * 1000)
                window.verdicts[verdict] += 1
                if cap is not None and len(window.latencies) >= cap:
                    window.enough.set()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bench.mcp_load", description="A closed-loop MCP tools/call generator."
    )
    parser.add_argument("--url", required=True, help="the MCP endpoint (server or gateway route)")
    parser.add_argument(
        "--protocol", choices=PROTOCOLS, default=SESSION_PROTOCOL, help="protocol generation"
    )
    parser.add_argument("--concurrency", type=int, default=16, help="agents calling at once")
    parser.add_argument("--duration", type=float, default=10.0, help="measured seconds")
    parser.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds first")
    parser.add_argument("--requests", type=int, help="stop after this many measured answers")
    parser.add_argument(
        "--cpu-pid", type=int, action="append", default=[], help="report this pid's CPU"
    )
    parser.add_argument(
        "--no-key", action="store_true", help="send no idempotency key (a pass-through call)"
    )
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    parser.add_argument(
        "--latencies", type=Path, help="also write the latencies (ms, float64, ascending) here"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one load and print its result."""
    args = _parser().parse_args(argv)
    spec = McpLoadSpec(
        url=args.url,
        protocol=args.protocol,
        concurrency=args.concurrency,
        duration=args.duration,
        warmup=args.warmup,
        requests=args.requests,
        cpu_pids=tuple(args.cpu_pid),
        keyed=not args.no_key,
    )
    generator = _Generator(spec)
    result = asyncio.run(generator.run())
    if args.latencies is not None:
        args.latencies.write_bytes(array("d", generator.latencies).tobytes())
    if args.json:
        print(json.dumps(asdict(result)), flush=True)
        return 0
    print(
        f"{result.throughput:,.0f} calls/s  p50 {result.p50_ms:.2f} ms  "
        f"p99 {result.p99_ms:.2f} ms  answers {result.statuses}  errors {result.errors}  "
        f"client CPU {result.client_cpu / result.seconds:.0%}"
    )
    for pid, seconds in result.server_cpu.items():
        print(
            f"pid {pid}: {seconds / result.seconds:.0%} CPU, "
            f"{result.cpu_us_per_request(int(pid)):.0f} us/call"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
