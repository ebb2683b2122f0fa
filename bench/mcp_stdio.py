"""The MCP miss path's added p50 at c=1, for an HTTP route and a stdio route, side by side.

One run, four rows measured in alternating windows (so a neighbour's load on this
shared machine falls on all of them alike), each calling `create_ticket` of the bench's
one-tool MCP server (`bench.mcp_server`) with a fresh `_meta.idempotencyKey` every call:

- `HTTP direct`: the server over Streamable HTTP (2026-07-28, stateless: one POST a call);
- `HTTP gateway`: the same server behind a gateway MCP route (production defaults,
  SQLite), the same requests;
- `stdio direct`: the server as a stdio child of this process, spoken to as the gateway
  speaks to its children (`gateway.mcp.stdio_child.StdioChild`: one JSON line each way);
- `stdio gateway`: a gateway stdio route (`command = [...]`) starting the same server.

A gateway row's added p50 is over its own direct row's. Each gateway row also says
where the gateway's time went, from its /metrics around its windows: the whole request,
the wait for the server (for a stdio route: the child, spoken to in process), the
claim's and the receipt's durable commits.

    python -m bench.mcp_stdio --windows 6 --calls 300
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from bench import processes
from bench.gateway_config import (
    MCP_PREFIX,
    sqlite_url,
    write_mcp_gateway_config,
    write_mcp_stdio_gateway_config,
)
from bench.mcp_rows import metrics_sample, metrics_split
from gateway.mcp.stdio_child import StdioChild, child_environment

STDIO_SERVER = (sys.executable, "-m", "bench.mcp_server", "--stdio")
VERSION = "2026-07-28"

Call = Callable[[str], Awaitable[None]]


@dataclass
class Row:
    name: str
    call: Call
    metrics_url: str | None = None
    latencies: list[float] = field(default_factory=list)
    split: dict[str, float] = field(default_factory=dict)
    errors: int = 0


def _message(n: int, key: str) -> dict[str, object]:
    envelope = {
        "io.modelcontextprotocol/protocolVersion": VERSION,
        "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "1"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": n,
        "method": "tools/call",
        "params": {
            "name": "create_ticket",
            "arguments": {"title": "bench"},
            "_meta": {**envelope, "idempotencyKey": key},
        },
    }


def http_caller(session: aiohttp.ClientSession, url: str) -> Call:
    counter = itertools.count(1)
    headers = {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        "MCP-Protocol-Version": VERSION,
        "Mcp-Method": "tools/call",
        "Mcp-Name": "create_ticket",
    }

    async def call(key: str) -> None:
        body = json.dumps(_message(next(counter), key))
        async with session.post(url, data=body, headers=headers) as answer:
            text = await answer.text()
            if answer.status != 200 or '"isError":true' in text.replace(" ", ""):
                raise RuntimeError(f"HTTP {answer.status}: {text[:200]}")

    return call


def stdio_caller(child: StdioChild) -> Call:
    async def call(key: str) -> None:
        message = _message(0, key)
        params = message["params"]
        assert isinstance(params, dict)
        params["_meta"] = {"idempotencyKey": key}  # the child speaks the session generation
        answer = await child.call({"method": "tools/call", "params": params})
        if "result" not in answer or answer["result"].get("isError"):
            raise RuntimeError(f"stdio: {answer}")

    return call


async def window(row: Row, calls: int, seconds: float, keys: itertools.count[int]) -> None:
    before = metrics_sample(row.metrics_url) if row.metrics_url else {}
    deadline = time.monotonic() + seconds
    for _ in range(calls):
        if time.monotonic() > deadline:
            break
        started = time.perf_counter()
        try:
            await row.call(f"bench-{next(keys)}")
        except Exception:  # counted, reported
            row.errors += 1
            continue
        row.latencies.append((time.perf_counter() - started) * 1000)
    if row.metrics_url:
        after = metrics_sample(row.metrics_url)
        for name, value in metrics_split(before, after).items():
            row.split.setdefault(name, 0.0)
            row.split[name] += value  # summed over windows, averaged at the end


async def measure(rows: list[Row], windows: int, calls: int, seconds: float) -> None:
    keys = itertools.count(1)
    for row in rows:  # warm-up: a first child, connections, caches
        await window(Row(row.name, row.call, None), 50, 5.0, keys)
    for n in range(windows):
        order = rows[n % len(rows) :] + rows[: n % len(rows)]
        for row in order:
            await window(row, calls, seconds, keys)
    for row in rows:
        row.split = {name: value / windows for name, value in row.split.items()}


def _p(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(rows: list[Row]) -> str:
    by_name = {row.name: row for row in rows}
    lines = [
        "| row | calls | p50 ms | p99 ms | added p50 ms (goal < 2) | in the gateway, mean ms: "
        "whole / server / claim / receipt | errors |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        p50 = statistics.median(row.latencies) if row.latencies else float("nan")
        direct = by_name.get(row.name.replace("gateway", "direct"))
        added = ""
        if direct is not row and direct is not None and direct.latencies:
            added = f"{p50 - statistics.median(direct.latencies):+.2f}"
        split = " / ".join(
            f"{row.split[name]:.2f}" if name in row.split else "-"
            for name in ("request", "upstream", "claim", "receipt")
        )
        lines.append(
            f"| {row.name} | {len(row.latencies)} | {p50:.2f} | {_p(row.latencies, 0.99):.2f} "
            f"| {added or '-'} | {split if row.split else '-'} | {row.errors} |"
        )
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> str:
    workdir = Path(tempfile.mkdtemp(prefix="bench-mcp-stdio-"))
    with (
        processes.mcp_server(workdir, json_response=True) as server,
        processes.gateway(
            write_mcp_gateway_config(
                workdir / "http.toml", upstream=server.url, store_url=sqlite_url(workdir / "h.db")
            ),
            name="gateway (HTTP route)",
        ) as http_gateway,
        processes.gateway(
            write_mcp_stdio_gateway_config(
                workdir / "stdio.toml", command=STDIO_SERVER, store_url=sqlite_url(workdir / "s.db")
            ),
            name="gateway (stdio route)",
        ) as stdio_gateway,
    ):
        child = StdioChild(STDIO_SERVER, child_environment({}), label="bench")
        await child.start()
        try:
            async with aiohttp.ClientSession() as session:
                rows = [
                    Row("HTTP direct", http_caller(session, server.url)),
                    Row(
                        "HTTP gateway",
                        http_caller(session, http_gateway.url + MCP_PREFIX),
                        http_gateway.url,
                    ),
                    Row("stdio direct", stdio_caller(child)),
                    Row(
                        "stdio gateway",
                        http_caller(session, stdio_gateway.url + MCP_PREFIX),
                        stdio_gateway.url,
                    ),
                ]
                await measure(rows, args.windows, args.calls, args.max_seconds)
        finally:
            await child.stop()
    return report(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_stdio", description=__doc__)
    parser.add_argument("--windows", type=int, default=6, help="windows per row (default 6)")
    parser.add_argument("--calls", type=int, default=300, help="calls per window (default 300)")
    parser.add_argument(
        "--max-seconds", type=float, default=10.0, help="a window's time limit (default 10)"
    )
    args = parser.parse_args(argv)
    print(asyncio.run(main_async(args)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
