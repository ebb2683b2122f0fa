"""No tenant starves another: one client holds its whole share of a route, another's
calls keep their latency.

The security review's load test for `gateway.engine.fairness`. One MCP route
with a small `max_concurrency` (8 by default, so a share matters) in front of
a minimal MCP endpoint in its own process, and two `[[clients]]`, "noisy" and
"quiet" (default quotas: `max_streams` 16, so the route's share, half of 8,
is what binds). Two phases in one run:

1. "quiet alone": quiet sends protected `tools/call`s (a fresh
   `params._meta.idempotencyKey` and distinct arguments each, the tool answers
   after `--tool-delay-ms`) at `--concurrency`, until `--calls` or
   `--seconds`, and each call's latency is measured.
2. noisy opens server streams (`GET`, kept open and read; the endpoint sends `: ping`
   every second) until one is refused, and starts protected calls to a tool
   the endpoint answers only when told to (pinging meanwhile) until one is
   refused: each refusal must be 429 `quota-exceeded`, which proves noisy
   holds its whole share of both lanes. Then quiet repeats phase 1 while
   those are held; the endpoint's own count says they still were at its end.
   Then noisy's streams are closed and its calls answered.

It prints a table of quiet's p50/p99 (answered calls only), the calls that
were not the tool's own success ("not ok": a non-2xx answer, a JSON-RPC error
or an `isError` result, by kind) and calls/s, alone and while noisy holds its
share, and their ratios. It exits 1 if quiet got any refusal while noisy held
its share, or if noisy's share could not be shown (a stream or call past it
was not refused `quota-exceeded`).

    python -m bench.fairness                      # c=2, 400 calls or 10 s a phase, route of 8
    python -m bench.fairness --concurrency 4 --max-concurrency 16 --seconds 20
    python -m bench.fairness --quick              # a tiny run (tests/test_bench_smoke.py)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import hashlib
import json
import secrets
import socket
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from bench.gateway_config import MCP_PREFIX, sqlite_url
from bench.jsonrpc_answers import response_in
from bench.processes import ServerProcess, gateway
from bench.report import Table, machine_info, ms, ratio
from gateway.config import Settings, render_effective

__all__ = ["Fairness", "Phase", "main", "measure", "measure_fairness", "section"]

TOOL = "create_ticket"
"""Quiet's tool: answered after `--tool-delay-ms`."""
HOLD_TOOL = "hold"
"""Noisy's tool: answered only once the bench posts `/release` to the endpoint."""
PROTOCOL = "2026-07-28"
EVENT_STREAM = "text/event-stream"
PING = b": ping\n\n"
PING_SECONDS = 1.0
HOLD_LIMIT_SECONDS = 300.0
"""The endpoint ends a held call or a stream after this long, whatever happens."""
ADMIT_SECONDS = 10.0
"""How long a held call may take to reach the endpoint before the run gives up."""
REFUSALS = frozenset({"quota-exceeded", "route-saturated"})
"""The gateway's refusals for want of a slot (`gateway.engine.fairness`)."""
CLIENTS = ("noisy", "quiet")


# --- the MCP endpoint (its own process: `--serve-upstream`) ---------------------------


async def _serve_upstream(tool_delay: float) -> None:
    """A minimal Streamable HTTP endpoint at `/mcp`, and two bench-only paths:
    `GET /state` (held calls and open streams, as JSON) and `POST /release` (answer
    every held call, now and from now on)."""
    released = asyncio.Event()
    counts = {"holding": 0, "streams": 0}
    loop = asyncio.get_running_loop()

    async def post(request: web.Request) -> web.StreamResponse:
        try:
            message = json.loads(await request.read())
        except ValueError:
            error = {"code": -32700, "message": "Parse error"}
            return web.json_response({"jsonrpc": "2.0", "id": None, "error": error}, status=400)
        if not isinstance(message, dict) or "id" not in message:
            return web.Response(status=202)  # a notification or a response
        params = message.get("params")
        name = params.get("name") if isinstance(params, dict) else None
        if message.get("method") == "tools/call" and name == HOLD_TOOL:
            return await hold(request, message["id"])
        if tool_delay:
            await asyncio.sleep(tool_delay)
        return web.json_response({"jsonrpc": "2.0", "id": message["id"], "result": _result()})

    async def hold(request: web.Request, message_id: object) -> web.StreamResponse:
        counts["holding"] += 1
        response = web.StreamResponse(
            headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(request)
            await response.write(PING)
            deadline = loop.time() + HOLD_LIMIT_SECONDS
            while not released.is_set() and loop.time() < deadline:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(released.wait(), PING_SECONDS)
                if not released.is_set():
                    await response.write(PING)
            answer = {"jsonrpc": "2.0", "id": message_id, "result": _result()}
            await response.write(f"event: message\ndata: {json.dumps(answer)}\n\n".encode())
            await response.write_eof()
        except ConnectionError:
            pass  # the gateway left
        finally:
            counts["holding"] -= 1
        return response

    async def stream(request: web.Request) -> web.StreamResponse:
        counts["streams"] += 1
        response = web.StreamResponse(
            headers={"Content-Type": EVENT_STREAM, "Cache-Control": "no-cache"}
        )
        try:
            await response.prepare(request)
            deadline = loop.time() + HOLD_LIMIT_SECONDS
            while loop.time() < deadline:
                await response.write(PING)  # raises once the client has left
                await asyncio.sleep(PING_SECONDS)
        except ConnectionError:
            pass
        finally:
            counts["streams"] -= 1
        return response

    async def state(request: web.Request) -> web.Response:
        return web.json_response(counts)

    async def release(request: web.Request) -> web.Response:
        released.set()
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/mcp", post)
    app.router.add_get("/mcp", stream)
    app.router.add_get("/state", state)
    app.router.add_post("/release", release)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    await web.SockSite(runner, sock).start()
    print(f"fairness upstream listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp")
    sys.stdout.flush()
    await asyncio.Event().wait()


def _result() -> dict[str, Any]:
    return {"content": [{"type": "text", "text": "done"}], "resultType": "complete"}


# --- what an answer says ----------------------------------------------------------------


def verdict(status: int, body: bytes) -> str:
    """`ok` when the answer is the tool's own success, else what it was: the gateway's
    problem type (from a JSON-RPC error's `data`, or an `isError` result's
    `_meta.idempotency`), else "HTTP <status>" or what was wrong with it.

    >>> verdict(200, b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}')
    'ok'
    >>> refused = {"isError": True, "_meta": {"idempotency": {"type": "quota-exceeded"}}}
    >>> verdict(200, json.dumps({"jsonrpc": "2.0", "id": 1, "result": refused}).encode())
    'quota-exceeded'
    >>> error = {"code": -32600, "message": "x", "data": {"type": "https://x/route-saturated"}}
    >>> verdict(503, json.dumps({"jsonrpc": "2.0", "id": None, "error": error}).encode())
    'route-saturated'
    >>> verdict(502, b"Bad Gateway"), verdict(200, b'data: {"id":1,"result":{"isError":true}}')
    ('HTTP 502', 'isError')
    """
    message = response_in(body)
    if message is None:
        return "unreadable answer" if 200 <= status < 300 else f"HTTP {status}"
    error = message.get("error")
    if error is not None:
        data = error.get("data") if isinstance(error, dict) else None
        kind = data.get("type") if isinstance(data, dict) else None
        return str(kind).rsplit("/", 1)[-1] if kind else f"HTTP {status} JSON-RPC error"
    result = message.get("result")
    if not isinstance(result, dict):
        return "no result"
    if result.get("isError"):
        meta = result.get("_meta")
        problem = meta.get("idempotency") if isinstance(meta, dict) else None
        kind = problem.get("type") if isinstance(problem, dict) else None
        return str(kind) if kind else "isError"
    return "ok" if 200 <= status < 300 else f"HTTP {status}"


def _is_refusal(status: int, kind: str) -> bool:
    return status in (429, 503) or kind in REFUSALS


# --- the load -------------------------------------------------------------------------------


@dataclass(slots=True)
class Phase:
    """One phase of quiet's calls: latencies of the answered ones, and the others by kind."""

    latencies: list[float] = field(default_factory=list)
    """Seconds, of the calls answered with the tool's own success."""
    not_ok: Counter[str] = field(default_factory=Counter)
    refused: int = 0
    seconds: float = 0.0

    @property
    def calls(self) -> int:
        return len(self.latencies) + sum(self.not_ok.values())

    def quantile_ms(self, q: float) -> float:
        if not self.latencies:
            return float("nan")
        ordered = sorted(self.latencies)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    @property
    def rate(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds > 0 else float("nan")


def _headers(token: str, tool: str) -> dict[str, str]:
    return {
        "Authorization": f"Bearer {token}",
        "Content-Type": "application/json",
        "Accept": f"application/json, {EVENT_STREAM}",
        "MCP-Protocol-Version": PROTOCOL,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }


def _call_body(tool: str, n: int, who: str) -> bytes:
    """A protected call with a fresh key, in its `_meta` and its arguments (each call a
    distinct request: no similar-operation refusal)."""
    key = f"{who}-{uuid.uuid4().hex}"
    message = {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {
            "name": tool,
            "arguments": {"title": f"{who} call {n}", "ref": key},
            "_meta": {"idempotencyKey": key},
        },
    }
    return json.dumps(message).encode()


async def _call(
    session: aiohttp.ClientSession, url: str, token: str, tool: str, n: int, who: str
) -> tuple[float, int, str]:
    """One protected call: (seconds, HTTP status or 0, verdict)."""
    body = _call_body(tool, n, who)
    started = time.perf_counter()
    try:
        async with session.post(url, data=body, headers=_headers(token, tool)) as answer:
            text = await answer.read()
            status = answer.status
    except (aiohttp.ClientError, TimeoutError) as exc:
        return time.perf_counter() - started, 0, f"client error {type(exc).__name__}"
    return time.perf_counter() - started, status, verdict(status, text)


async def _quiet_phase(
    session: aiohttp.ClientSession,
    url: str,
    token: str,
    *,
    calls: int,
    seconds: float,
    concurrency: int,
) -> Phase:
    """`concurrency` agents call one after another until `calls` were sent or `seconds`
    have passed (each agent at least one call)."""
    phase = Phase()
    issued = 0
    deadline = time.perf_counter() + seconds

    async def agent() -> None:
        nonlocal issued
        first = True
        while issued < calls and (first or time.perf_counter() < deadline):
            first = False
            issued += 1
            elapsed, status, kind = await _call(session, url, token, TOOL, issued, "quiet")
            if kind == "ok":
                phase.latencies.append(elapsed)
            else:
                phase.not_ok[kind if status in (0, 200) else f"{kind} ({status})"] += 1
                phase.refused += _is_refusal(status, kind)

    started = time.perf_counter()
    await asyncio.gather(*(agent() for _ in range(concurrency)))
    phase.seconds = time.perf_counter() - started
    return phase


@dataclass(slots=True)
class NoisyShare:
    """What noisy holds in phase 2, and how the gateway refused it past that."""

    streams: list[aiohttp.ClientResponse] = field(default_factory=list)
    readers: list[asyncio.Task[None]] = field(default_factory=list)
    stream_refusal: str = "none"
    calls: list[asyncio.Task[tuple[float, int, str]]] = field(default_factory=list)
    call_refusal: str = "none"
    held_at_end: dict[str, int] = field(default_factory=dict)
    """The endpoint's count after phase 2: {"streams": k, "holding": j}."""
    calls_answered: Counter[str] = field(default_factory=Counter)
    """How noisy's held calls ended once released."""


async def _read_all(response: aiohttp.ClientResponse) -> None:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async for _ in response.content.iter_any():
            pass


async def _upstream_state(session: aiohttp.ClientSession, base: str) -> dict[str, int]:
    async with session.get(base + "/state") as answer:
        state: dict[str, int] = await answer.json()
    return state


async def _fill_share(
    noisy: aiohttp.ClientSession,
    control: aiohttp.ClientSession,
    url: str,
    upstream_base: str,
    token: str,
    attempts: int,
    share: NoisyShare,
) -> None:
    """Streams, then held calls, one after another until the gateway refuses one (at most
    `attempts` of each: the whole lane and one more)."""
    stream_headers = {
        "Authorization": f"Bearer {token}",
        "Accept": EVENT_STREAM,
        "MCP-Protocol-Version": PROTOCOL,
    }
    for _ in range(attempts):
        response = await noisy.get(url, headers=stream_headers)
        if response.status == 200:
            share.streams.append(response)
            share.readers.append(asyncio.create_task(_read_all(response)))
            continue
        body = await response.read()
        response.release()
        share.stream_refusal = f"HTTP {response.status} {verdict(response.status, body)}"
        break
    for n in range(1, attempts + 1):
        task = asyncio.create_task(_call(noisy, url, token, HOLD_TOOL, n, "noisy"))
        admitted = False
        deadline = time.perf_counter() + ADMIT_SECONDS
        while not task.done() and time.perf_counter() < deadline:
            if (await _upstream_state(control, upstream_base))["holding"] >= len(share.calls) + 1:
                admitted = True
                break
            await asyncio.sleep(0.02)
        if admitted:
            share.calls.append(task)
            continue
        if not task.done():
            share.calls.append(task)  # neither refused nor seen upstream: released later
            share.call_refusal = f"not refused within {ADMIT_SECONDS:g} s"
            break
        _, status, kind = task.result()
        share.call_refusal = f"HTTP {status} {kind}"
        break


async def _let_go(
    control: aiohttp.ClientSession, upstream_base: str, share: NoisyShare, bound: float
) -> None:
    """Close noisy's streams, answer its held calls, and wait (bounded) for them."""
    for response in share.streams:
        response.close()
    for reader in share.readers:
        reader.cancel()
    await asyncio.gather(*share.readers, return_exceptions=True)
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with control.post(upstream_base + "/release"):
            pass
    if not share.calls:
        return
    done, pending = await asyncio.wait(share.calls, timeout=bound)
    for task in pending:
        task.cancel()
        share.calls_answered["not answered in time"] += 1
    for task in done:
        if not task.cancelled() and task.exception() is None:
            share.calls_answered[task.result()[2]] += 1


@dataclass(frozen=True, slots=True)
class Fairness:
    """One run: quiet alone, quiet while noisy held its share, and what noisy held."""

    max_concurrency: int
    concurrency: int
    tool_delay_ms: float
    alone: Phase
    shared: Phase
    streams: int
    calls: int
    stream_refusal: str
    call_refusal: str
    held_at_end: dict[str, int]
    calls_answered: dict[str, int]

    @property
    def proven(self) -> bool:
        """Whether the gateway refused noisy `quota-exceeded` past its share in both lanes
        (a stream: 429; a protected call: an `isError` result, HTTP 200, like every
        refusal of a protected MCP call)."""
        return self.stream_refusal == "HTTP 429 quota-exceeded" and self.call_refusal in {
            "HTTP 200 quota-exceeded",
            "HTTP 429 quota-exceeded",
        }


async def measure(
    gateway_url: str,
    upstream_url: str,
    tokens: dict[str, str],
    *,
    calls: int,
    seconds: float,
    concurrency: int,
    max_concurrency: int,
    tool_delay_ms: float,
) -> Fairness:
    url = gateway_url + MCP_PREFIX
    upstream_base = upstream_url.removesuffix("/mcp")
    calls_timeout = aiohttp.ClientTimeout(total=60)
    # Noisy's streams and held calls last the whole phase: no total, a read bound well
    # above the endpoint's ping interval.
    held_timeout = aiohttp.ClientTimeout(total=None, connect=10, sock_read=60)
    share = NoisyShare()
    async with (
        aiohttp.ClientSession(timeout=calls_timeout) as quiet,
        aiohttp.ClientSession(timeout=held_timeout) as noisy,
        aiohttp.ClientSession(timeout=calls_timeout) as control,
    ):
        token = tokens["quiet"]
        # Warm-up, not measured: the first calls open connections and the store's pages.
        await _quiet_phase(quiet, url, token, calls=5, seconds=5, concurrency=1)
        phase = functools.partial(
            _quiet_phase, quiet, url, token, calls=calls, seconds=seconds, concurrency=concurrency
        )
        alone = await phase()
        try:
            # Two [[clients]] may use the route, so noisy is held to its share whoever
            # came first (gateway.engine.fairness); it takes all it is given.
            await _fill_share(
                noisy, control, url, upstream_base, tokens["noisy"], max_concurrency + 1, share
            )
            shared = await phase()
            share.held_at_end = await _upstream_state(control, upstream_base)
        finally:
            await _let_go(control, upstream_base, share, bound=30.0)
    return Fairness(
        max_concurrency=max_concurrency,
        concurrency=concurrency,
        tool_delay_ms=tool_delay_ms,
        alone=alone,
        shared=shared,
        streams=len(share.streams),
        calls=len(share.calls),
        stream_refusal=share.stream_refusal,
        call_refusal=share.call_refusal,
        held_at_end=dict(share.held_at_end),
        calls_answered=dict(share.calls_answered),
    )


def _write_config(
    path: Path, *, upstream: str, store: Path, max_concurrency: int
) -> dict[str, str]:
    """One MCP route of `max_concurrency` slots, two `[[clients]]`, default quotas,
    warning logs, SQLite; through the gateway's own model (a bad key fails here).
    Returns each client's bearer token (the file holds only their digests)."""
    tokens = {name: secrets.token_urlsafe(24) for name in CLIENTS}
    settings = Settings.model_validate(
        {
            "server": {"host": "127.0.0.1", "port": 0},
            "store": {"url": sqlite_url(store)},
            "routes": [
                {
                    "name": "tools",
                    "prefix": MCP_PREFIX,
                    "upstream": upstream,
                    "kind": "mcp",
                    "timeout": "10s",
                    "max_concurrency": max_concurrency,
                }
            ],
            "clients": [
                {"name": name, "token_sha256": [hashlib.sha256(token.encode()).hexdigest()]}
                for name, token in tokens.items()
            ],
            "logging": {"level": "warning", "format": "json"},
        }
    )
    path.write_text(render_effective(settings))
    return tokens


def measure_fairness(
    workdir: Path,
    *,
    calls: int = 400,
    seconds: float = 10.0,
    concurrency: int = 2,
    max_concurrency: int = 8,
    tool_delay_ms: float = 5.0,
) -> Fairness:
    """Start the endpoint and a gateway (SQLite in `workdir`), run both phases, stop both."""
    argv = [sys.executable, "-m", "bench.fairness", "--serve-upstream"]
    argv += ["--tool-delay-ms", str(tool_delay_ms)]
    upstream = ServerProcess("fairness upstream", argv, log_path=workdir / "fairness_up.log")
    with upstream:
        config = workdir / "fairness_gateway.toml"
        tokens = _write_config(
            config,
            upstream=upstream.url,
            store=workdir / "fairness_gateway.db",
            max_concurrency=max_concurrency,
        )
        with gateway(config) as served:
            bound = 2 * seconds + 4 * ADMIT_SECONDS * (max_concurrency + 1) + 120
            return asyncio.run(
                asyncio.wait_for(
                    measure(
                        served.url,
                        upstream.url,
                        tokens,
                        calls=calls,
                        seconds=seconds,
                        concurrency=concurrency,
                        max_concurrency=max_concurrency,
                        tool_delay_ms=tool_delay_ms,
                    ),
                    bound,
                )
            )


# --- the report ------------------------------------------------------------------------


def _not_ok(phase: Phase) -> str:
    total = sum(phase.not_ok.values())
    if not total:
        return "0"
    kinds = ", ".join(f"{kind} {count}" for kind, count in phase.not_ok.most_common())
    return f"{total} ({kinds})"


def shared_row(run: Fairness) -> str:
    return f"quiet while noisy holds its share ({run.streams} streams, {run.calls} calls)"


def table(run: Fairness) -> Table:
    def row(name: str, phase: Phase) -> tuple[str, ...]:
        return (
            name,
            str(phase.calls),
            ms(phase.quantile_ms(0.5)),
            ms(phase.quantile_ms(0.99)),
            _not_ok(phase),
            str(phase.refused),
            f"{phase.rate:.0f}",
        )

    return Table(
        ("quiet's calls", "calls", "p50 ms", "p99 ms", "not ok", "refused", "calls/s"),
        (row("quiet alone", run.alone), row(shared_row(run), run.shared)),
    )


def section(run: Fairness) -> list[str]:
    """The run as Markdown lines (a heading, what was held, the table, the ratios)."""
    alone, shared = run.alone, run.shared
    held = run.held_at_end
    p50 = ratio(shared.quantile_ms(0.5), alone.quantile_ms(0.5))
    p99 = ratio(shared.quantile_ms(0.99), alone.quantile_ms(0.99))
    return [
        "## Fairness: one client holds its share of a route",
        "",
        f"One MCP route, `max_concurrency = {run.max_concurrency}`, two `[[clients]]`, default "
        f"quotas; quiet calls a tool that answers after {run.tool_delay_ms:g} ms at "
        f"c={run.concurrency}, a fresh key each. Noisy held {run.streams} server streams "
        f"(the next: {run.stream_refusal}) and {run.calls} calls in progress (the next: "
        f"{run.call_refusal}); still held when quiet's second phase ended, by the "
        f"endpoint's count: {held.get('streams', 0)} streams, {held.get('holding', 0)} calls. "
        f"Noisy's calls, once answered: "
        + (", ".join(f"{k} {v}" for k, v in sorted(run.calls_answered.items())) or "none")
        + ".",
        "",
        table(run).render(),
        "",
        f"While noisy holds its share / alone: p50 {p50}, p99 {p99}, calls/s "
        f"{ratio(shared.rate, alone.rate)}. Percentiles are of the calls answered "
        "with the tool's success; `not ok` counts the others (a non-2xx answer, a JSON-RPC "
        "error, an `isError` result), `refused` those refused for want of a slot.",
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=400, help="quiet's calls a phase, at most")
    parser.add_argument("--seconds", type=float, default=10.0, help="a phase's length, at most")
    parser.add_argument("--concurrency", type=int, default=2, help="quiet's agents")
    parser.add_argument("--max-concurrency", type=int, default=8, help="the route's slots")
    parser.add_argument("--tool-delay-ms", type=float, default=5.0)
    parser.add_argument("--quick", action="store_true", help="a tiny run (40 calls, 2 s)")
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        asyncio.run(_serve_upstream(args.tool_delay_ms / 1000))
        return 0
    if args.quick:
        args.calls, args.seconds = min(args.calls, 40), min(args.seconds, 2.0)
    print("\n".join(machine_info()), flush=True)
    with tempfile.TemporaryDirectory(prefix="igw-fairness-") as scratch:
        run = measure_fairness(
            Path(scratch),
            calls=args.calls,
            seconds=args.seconds,
            concurrency=args.concurrency,
            max_concurrency=args.max_concurrency,
            tool_delay_ms=args.tool_delay_ms,
        )
    print()
    print("\n".join(section(run)))
    failed = 0
    if run.shared.refused:
        print(f"FAIL: quiet was refused {run.shared.refused} times while noisy held its share")
        failed = 1
    if not run.proven:
        print(
            "FAIL: noisy's share was not shown: past it, a stream was answered "
            f"{run.stream_refusal!r} and a call {run.call_refusal!r} (want 429 quota-exceeded)"
        )
        failed = 1
    return failed


if __name__ == "__main__":
    raise SystemExit(main())
