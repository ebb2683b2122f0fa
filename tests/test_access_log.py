"""The access log: every request's line, written off the event loop, none lost on SIGTERM.

The unit tests pin the line (the fields and order it had as a `logging`
record) and the batching; the others run `python -m gateway serve` with the
default `[logging]` (info, json) and read its stderr.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any, Literal

import aiohttp
from harness import GatewayProcess, spawn
from upstream import CountingUpstream

from gateway.engine.exchange import RequestTrace
from gateway.engine.scopes import scope_hash
from gateway.web.access_log import FLUSH_SECONDS, MAX_BATCH, AccessLog

FIELDS = [
    "ts", "level", "logger", "message", "event", "request_id", "method", "path", "status",
    "route", "outcome", "error", "state", "key", "scope", "operation_id", "upstream_ms",
    "total_ms",
]  # fmt: skip
"""The fields of a line, in order: those the `logging` record had."""


def _trace() -> RequestTrace:
    trace = RequestTrace(request_id="abc123", route="tickets", key="k-1", scope="client:a")
    trace.outcome, trace.state, trace.operation_id = "forwarded", "completed", "op_1"
    trace.upstream_seconds = 0.0021
    return trace


async def written(form: Literal["json", "text"], method: str, path: str, status: int) -> list[str]:
    """What an access log of `form` writes for one request of `_trace()`, 4.9 ms long."""
    lines: list[str] = []
    access = AccessLog(form, sink=lines.append)
    access.start()
    access.request(_trace(), method, path, status, elapsed=0.0049)
    await access.close()
    return lines


async def test_a_json_line_has_the_fields_the_logging_record_had() -> None:
    """One JSON object a line, the same keys in the same order, the scope only as its hash."""
    lines = await written("json", "POST", "/tickets/v1/issues", 201)
    assert len(lines) == 1
    assert lines[0].endswith("\n")
    line = json.loads(lines[0])
    assert list(line) == FIELDS
    assert line["message"] == "POST /tickets/v1/issues 201"
    assert (line["level"], line["logger"], line["event"]) == ("info", "gateway.access", "request")
    assert (line["upstream_ms"], line["total_ms"]) == (2.1, 4.9)
    assert line["scope"] == scope_hash("client:a")
    assert line["ts"].endswith("Z")
    assert len(line["ts"]) == len("2026-12-02T16:10:00.123Z")


async def test_a_text_line_reads_as_the_logging_formatter_wrote_it() -> None:
    """`format = "text"`: `<asctime> INFO gateway.access: <method> <path> <status>`."""
    lines = await written("text", "GET", "/tickets/v1/7", 200)
    stamp, rest = lines[0][:23], lines[0][24:]
    assert stamp[4] == "-"
    assert stamp[19] == ","
    assert rest == "INFO gateway.access: GET /tickets/v1/7 200\n"


async def test_lines_are_written_in_batches_by_the_timer_or_at_max_batch() -> None:
    """Lines wait at most FLUSH_SECONDS for the writer, and MAX_BATCH of them go at once."""
    written: list[str] = []
    arrived = asyncio.Event()
    loop = asyncio.get_running_loop()

    def sink(text: str) -> None:
        written.append(text)
        loop.call_soon_threadsafe(arrived.set)

    access = AccessLog("json", sink=sink)
    access.start()
    try:
        access.request(_trace(), "POST", "/a", 201, elapsed=0.001)
        assert written == []  # not on the event loop
        async with asyncio.timeout(30):
            await arrived.wait()
        assert len(written) == 1
        arrived.clear()
        for _ in range(MAX_BATCH):
            access.request(_trace(), "POST", "/b", 201, elapsed=0.001)
        async with asyncio.timeout(30):
            await arrived.wait()  # handed over at once, well before a timer would fire
        assert written[1].count("\n") == MAX_BATCH
    finally:
        await access.close()
    assert FLUSH_SECONDS <= 0.5


async def test_close_writes_every_buffered_line() -> None:
    """Closing writes what the timer had not handed over yet."""
    lines: list[str] = []
    access = AccessLog("json", sink=lines.append)
    access.start()
    for n in range(10):
        access.request(_trace(), "POST", f"/{n}", 201, elapsed=0.001)
    await access.close()
    assert "".join(lines).count("\n") == 10


def _lines(log_path: Path) -> list[dict[str, Any]]:
    """Every line of a gateway's stderr, each a JSON object (a cut line fails here)."""
    return [json.loads(line) for line in log_path.read_text().splitlines() if line.strip()]


async def test_no_access_line_is_lost_when_the_gateway_is_stopped_under_load(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """SIGTERM while 32 agents keep sending: every request that got an answer has its
    line, every line of stderr is whole JSON, and the gateway's own log lines still
    reach it."""
    gateway = spawn(processes, tmp_path, upstream.url, logging={"level": "info", "format": "json"})
    answered: list[str] = []
    stop, enough = asyncio.Event(), asyncio.Event()

    async def agent(session: aiohttp.ClientSession, n: int) -> None:
        for i in range(2000):  # bounded; the SIGTERM ends it well before
            if stop.is_set():
                return
            key = f"a{n}-{i}"
            body = json.dumps({"n": key}).encode()
            try:
                async with session.post(
                    f"{gateway.url}/tickets/v1/issues",
                    data=body,
                    headers={"Idempotency-Key": key, "Content-Type": "application/json"},
                ) as response:
                    await response.read()
                    answered.append(response.headers["X-Request-Id"])
                    if len(answered) >= 500:
                        enough.set()
            except aiohttp.ClientError:
                return  # the gateway stopped listening

    async with aiohttp.ClientSession() as session:
        agents = [asyncio.create_task(agent(session, n)) for n in range(32)]
        async with asyncio.timeout(120):
            await enough.wait()
        assert gateway.process is not None
        gateway.process.send_signal(signal.SIGTERM)
        await asyncio.to_thread(gateway.process.wait, 60)
        stop.set()
        await asyncio.gather(*agents)
    assert gateway.log_path is not None
    lines = _lines(gateway.log_path)
    logged = {line["request_id"] for line in lines if line.get("event") == "request"}
    missing = set(answered) - logged
    assert not missing, f"{len(missing)} of {len(answered)} answered requests have no line"
    assert any(line["message"].startswith("shutting down") for line in lines)


async def test_a_line_is_what_json_dumps_makes_of_the_same_fields() -> None:
    """Values that need escaping (quotes, a backslash, non-ASCII, a lone surrogate from
    bytes that were not UTF-8, nulls) come out as `json.dumps` writes them."""
    lines: list[str] = []
    access = AccessLog("json", sink=lines.append)
    access.start()
    trace = RequestTrace(request_id='a"b\\c', key="clé-\udcff", scope=None)
    access.request(trace, "POST", "/tickets/ü\t", 400, elapsed=0.5)
    await access.close()
    line = json.loads(lines[0])
    expected = {"request_id": 'a"b\\c', "key": "clé-\udcff", "path": "/tickets/ü\t"}
    assert {name: line[name] for name in expected} == expected
    assert (line["route"], line["scope"], line["upstream_ms"], line["total_ms"]) == (
        None,
        None,
        None,
        500.0,
    )
    assert lines[0] == json.dumps(line) + "\n"
