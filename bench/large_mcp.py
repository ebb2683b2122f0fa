"""What a large MCP call costs everyone else: `/healthz` latency while 1 MiB calls run.

A protected `tools/call` is parsed and its arguments put in canonical JSON
(RFC 8785, pure Python, about half a second per MiB). The gateway reads such
messages in a helper process (`gateway.mcp.reading`) so that other callers
do not wait for it. This row measures exactly that: a prober sends
`GET /healthz` one after another, first alone (the baseline, same run), then
while `--concurrency` agents each send protected calls whose arguments are
`--size` bytes, each with a fresh key; it reports the prober's p50/p99/max and
the calls' own time.

The MCP upstream here is a minimal Streamable HTTP endpoint in its own
process: it answers each `tools/call` with a small result as JSON (stateless,
2026-07-28), so the row measures the gateway's reading, not the server's.

    python -m bench.large_mcp                     # 3 agents, 1 MiB, 8 s
    python -m bench.large_mcp --size 262144 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from bench.gateway_config import MCP_PREFIX, write_mcp_gateway_config
from bench.jsonrpc_answers import response_in
from bench.processes import ServerProcess, gateway
from bench.report import Table, ms

__all__ = ["LargeCalls", "main", "measure", "measure_large_calls", "section"]

DEFAULT_SIZE = 1024 * 1024 - 4096
"""Arguments of a large call: a 1 MiB call, under the route's default max_body."""

_ID = re.compile(rb'"id"\s*:\s*("(?:[^"\\]|\\.)*"|-?\d+)')
HEADERS = {
    "Content-Type": "application/json",
    "Accept": "application/json, text/event-stream",
    "MCP-Protocol-Version": "2026-07-28",
    "Mcp-Method": "tools/call",
    "Mcp-Name": "store_document",
}


async def _serve_upstream() -> None:
    """The minimal MCP endpoint: every POST answered with a small result under its id
    (found by a pattern: the upstream must not spend the CPU the row measures)."""

    async def answer(request: web.Request) -> web.Response:
        body = await request.read()
        found = _ID.search(body)
        message_id = found.group(1).decode() if found else "null"
        result = '{"content":[],"resultType":"complete"}'
        text = f'{{"jsonrpc":"2.0","id":{message_id},"result":{result}}}'
        return web.Response(text=text, content_type="application/json")

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_post("/mcp", answer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    sock = socket.create_server(("127.0.0.1", 0))
    site = web.SockSite(runner, sock)
    await site.start()
    print(f"large-call upstream listening on http://127.0.0.1:{sock.getsockname()[1]}/mcp")
    sys.stdout.flush()
    await asyncio.Event().wait()


_KEY_SLOT = b"large-00000000000000000000000000000000"


def _call_template(size: int) -> bytes:
    """A tools/call whose arguments hold about `size` bytes of small objects (the shape
    canonical JSON is slowest on); its key is `_KEY_SLOT`, replaced per call (built once:
    the prober shares this process's event loop and must not wait on it). The key is in
    the arguments too (`ref`), so each call is a distinct request: the gateway refuses a
    new key for the same call as one still in flight (`similar-operation`)."""
    per_item = len(json.dumps({"id": 99999, "name": "item 99999", "tags": ["a", "b"]})) + 2
    items = [{"id": i, "name": f"item {i}", "tags": ["a", "b"]} for i in range(size // per_item)]
    document = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {
            "name": "store_document",
            "arguments": {"ref": _KEY_SLOT.decode(), "items": items},
            "_meta": {"idempotencyKey": _KEY_SLOT.decode()},
        },
    }
    return json.dumps(document).encode()


async def _probe(session: aiohttp.ClientSession, url: str, until: float) -> list[float]:
    latencies = []
    while time.perf_counter() < until:
        started = time.perf_counter()
        async with session.get(url) as answer:
            await answer.read()
        latencies.append(time.perf_counter() - started)
        await asyncio.sleep(0.005)
    return latencies


async def _agent(
    session: aiohttp.ClientSession, url: str, template: bytes, until: float
) -> list[float]:
    """Calls one after another until `until` (one at least), each with a fresh key (in
    its `_meta` and its arguments: every slot of the template)."""
    times: list[float] = []
    while not times or time.perf_counter() < until:
        body = template.replace(_KEY_SLOT, f"large-{uuid.uuid4().hex}".encode())
        started = time.perf_counter()
        async with session.post(url, data=body, headers=HEADERS) as answer:
            text = await answer.read()
            if answer.status != 200:
                raise RuntimeError(f"a large call was answered {answer.status}")
        times.append(time.perf_counter() - started)
        if _is_error(text):
            raise RuntimeError(f"a large call was answered an error: {text[:300]!r}")
    return times


def _is_error(answer: bytes) -> bool:
    """Whether a call's answer (JSON, or an event stream of JSON) is not the tool's
    result: a JSON-RPC error, or a result with `isError` (the gateway's refusals).

    >>> _is_error(b'{"jsonrpc":"2.0","id":1,"result":{"content":[]}}')
    False
    >>> _is_error(b'data: {"jsonrpc":"2.0","id":1,"result":{"isError":true}}\\n\\n')
    True
    """
    message = response_in(answer)
    if message is None:
        return True
    result = message.get("result")
    return "error" in message or not isinstance(result, dict) or bool(result.get("isError"))


async def measure(gateway_url: str, *, size: int, agents: int, seconds: float) -> dict[str, float]:
    """Prober latencies alone and under load (ms), and the large calls' mean time (s)."""
    timeout = aiohttp.ClientTimeout(total=120)
    template = _call_template(size)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        health = gateway_url + "/healthz"
        alone = await _probe(session, health, time.perf_counter() + min(seconds, 3.0))
        # The first large message starts the gateway's reading helper (once per process):
        # measured on its own, not mixed into the steady state.
        started = time.perf_counter()
        first, _ = await asyncio.gather(
            _probe(session, health, started + 1.0),
            _agent(session, gateway_url + MCP_PREFIX, template, started),
        )
        first_call = time.perf_counter() - started
        until = time.perf_counter() + seconds
        loaded, *calls = await asyncio.gather(
            _probe(session, health, until),
            *(_agent(session, gateway_url + MCP_PREFIX, template, until) for _ in range(agents)),
        )
    call_times = [t for times in calls for t in times]

    def ms(values: list[float], q: float) -> float:
        ordered = sorted(values)
        return 1000 * ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {
        "first_call_s": first_call,
        "first_max": ms(first, 1.0),
        "alone_p50": ms(alone, 0.5),
        "alone_p99": ms(alone, 0.99),
        "loaded_p50": ms(loaded, 0.5),
        "loaded_p99": ms(loaded, 0.99),
        "loaded_max": ms(loaded, 1.0),
        "calls": len(call_times),
        "call_mean_s": statistics.fmean(call_times) if call_times else float("nan"),
    }


@dataclass(frozen=True, slots=True)
class LargeCalls:
    """One run of this row: what was sent and what `/healthz` saw."""

    size: int
    agents: int
    figures: dict[str, float]


def measure_large_calls(
    workdir: Path,
    *,
    size: int = DEFAULT_SIZE,
    agents: int = 3,
    seconds: float = 8.0,
    gateway_root: Path | None = None,
) -> LargeCalls:
    """Start the upstream and a gateway (production defaults, SQLite in `workdir`), run
    the row, stop both."""
    argv = [sys.executable, "-m", "bench.large_mcp", "--serve-upstream"]
    upstream = ServerProcess("large-call upstream", argv, log_path=workdir / "large_up.log")
    with upstream:
        config = write_mcp_gateway_config(
            workdir / "large_gateway.toml",
            upstream=upstream.url,
            store_url=f"sqlite:///{workdir}/large_gateway.db",
        )
        served_from = {"cwd": gateway_root} if gateway_root else {}
        with gateway(config, **served_from) as served:
            figures = asyncio.run(measure(served.url, size=size, agents=agents, seconds=seconds))
    return LargeCalls(size, agents, figures)


def section(run: LargeCalls) -> list[str]:
    """The row as a Markdown section of bench/RESULTS.md."""
    figures = run.figures
    first = "during the first large call (it starts the reading helper)"
    table = Table(
        ("/healthz", "p50 ms", "p99 ms", "max ms"),
        (
            ("alone", ms(figures["alone_p50"]), ms(figures["alone_p99"]), "-"),
            (first, "-", "-", ms(figures["first_max"])),
            (
                f"while {run.agents} agents send large calls",
                ms(figures["loaded_p50"]),
                ms(figures["loaded_p99"]),
                ms(figures["loaded_max"]),
            ),
        ),
    )
    return [
        "## Large MCP calls and everyone else",
        "",
        f"`GET /healthz` one after another, alone, then while {run.agents} agents each send "
        f"protected `tools/call`s of {run.size / 1024:.0f} KiB of arguments (small objects, "
        "a fresh key each) to a gateway MCP route (production defaults, SQLite) in front "
        "of a minimal stateless MCP endpoint (`bench.large_mcp`). The gateway reads such "
        "calls, canonical JSON included, in a helper process. "
        f"{figures['calls']:.0f} large calls, {figures['call_mean_s']:.2f} s each on "
        f"average; the first one took {figures['first_call_s']:.2f} s.",
        "",
        table.render(),
    ]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", type=int, default=DEFAULT_SIZE)
    parser.add_argument("--concurrency", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument(
        "--gateway-root",
        type=Path,
        default=None,
        help="run the gateway code of this checkout (e.g. a worktree of an older commit)",
    )
    parser.add_argument("--serve-upstream", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve_upstream:
        asyncio.run(_serve_upstream())
        return 0
    with tempfile.TemporaryDirectory(prefix="igw-large-") as scratch:
        run = measure_large_calls(
            Path(scratch),
            size=args.size,
            agents=args.concurrency,
            seconds=args.seconds,
            gateway_root=args.gateway_root,
        )
    figures = run.figures
    print(
        f"/healthz while {args.concurrency} agents send {args.size / 1024:.0f} KiB MCP calls "
        f"({figures['calls']:.0f} calls, {figures['call_mean_s']:.2f} s each on average):\n"
        f"  alone   p50 {figures['alone_p50']:.1f} ms  p99 {figures['alone_p99']:.1f} ms\n"
        f"  first large call (starts the reading helper): {figures['first_call_s']:.2f} s, "
        f"/healthz max {figures['first_max']:.1f} ms meanwhile\n"
        f"  loaded  p50 {figures['loaded_p50']:.1f} ms  p99 {figures['loaded_p99']:.1f} ms  "
        f"max {figures['loaded_max']:.1f} ms"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
