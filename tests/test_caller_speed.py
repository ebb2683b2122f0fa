"""A caller's reading speed never decides a receipt (issue: "A receipt never depends on
the caller").

Found by a black-box review on the main of then: callers that connected and read
nothing held a `max_concurrency = 2` route at `503 route-saturated`, their
operations `in_flight`; a caller reading a 20 MB answer slowly was cut off by the
route's `timeout` and the key left `unknown` although the tool answered in full; an
MCP caller that stopped reading while the server streamed progress left the call
`unknown` at `max_call`. Here the gateway reads every answer to its end at the
upstream's pace (spooling what is too large to keep), relays at the caller's, and
cuts a caller that takes nothing for `write_timeout`.

The callers that never read are raw sockets with a tiny receive buffer: they send
their request and take no byte until the test says so.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from pathlib import Path
from typing import Any

import aiohttp
from harness import GatewayProcess, spawn
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client
from upstream import CountingUpstream, pattern

JSON = "application/json"
EVENT_STREAM = "text/event-stream"

PATH = "/tickets/v1/issues"
TWENTY_MB = 20_000_000
LARGE = {"max_stored_response": "1KiB", "timeout": "3s"}


class FrozenCaller:
    """A caller that sends one request, then reads nothing until `read_rest`."""

    def __init__(self, gateway: GatewayProcess, request: bytes) -> None:
        host, port = gateway.url.removeprefix("http://").split(":")
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        self.sock.connect((host, int(port)))
        self.sock.sendall(request)

    async def read_rest(self, seconds: float = 60.0) -> bytes:
        """Everything the gateway still lets it read, up to the end of the connection."""
        return await asyncio.to_thread(self._read, seconds)

    def _read(self, seconds: float) -> bytes:
        self.sock.settimeout(seconds)
        received = bytearray()
        try:
            while chunk := self.sock.recv(1 << 16):
                received += chunk
        except ConnectionResetError:
            pass
        return bytes(received)

    def close(self) -> None:
        self.sock.close()


def keyed_post(key: str, query: str) -> bytes:
    body = json.dumps({"key": key}).encode()
    return (
        f"POST {PATH}{query} HTTP/1.1\r\nHost: gateway\r\nIdempotency-Key: {key}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode() + body


async def lookup(session: aiohttp.ClientSession, gateway: GatewayProcess, key: str) -> Any:
    async with session.get(f"{gateway.url}/operations/{key}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


async def wait_for_state(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, state: str
) -> Any:
    async with asyncio.timeout(60):
        while True:
            async with session.get(f"{gateway.url}/operations/{key}") as response:
                if response.status == 200:  # else not claimed yet
                    operation = await response.json()
                    if operation["state"] == state:
                        return operation
            await asyncio.sleep(0.05)


async def wait_for_log(gateway: GatewayProcess, text: str) -> None:
    """Until the gateway's log has a line with `text` (the access line of a request is
    written when the gateway is done with it)."""
    assert gateway.log_path is not None
    async with asyncio.timeout(60):
        while text not in gateway.log_path.read_text():  # noqa: ASYNC110 (a file: no event)
            await asyncio.sleep(0.05)


def spool_files(gateway: GatewayProcess, spool_dir: Path) -> list[Path]:
    """The spool files the gateway holds open (they have no name left in `spool_dir`)."""
    assert gateway.process is not None
    fds = Path(f"/proc/{gateway.process.pid}/fd")
    held = []
    for fd in fds.iterdir():
        try:
            target = os.readlink(fd)
        except FileNotFoundError:
            continue
        if target.startswith(str(spool_dir)):
            held.append(fd)
    return held


async def wait_for_spools(gateway: GatewayProcess, spool_dir: Path, count: int) -> list[Path]:
    async with asyncio.timeout(60):
        while len(held := spool_files(gateway, spool_dir)) != count:  # noqa: ASYNC110 (/proc)
            await asyncio.sleep(0.05)
    return held


async def test_callers_that_never_read_leave_the_route_to_others(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Two callers of 20 MB answers who read nothing, on a route of two slots: both
    operations complete (the answers are read to their end and spooled), and the route
    serves a third caller at once, not `503 route-saturated`."""
    gateway = spawn(processes, tmp_path, upstream.url, route={**LARGE, "max_concurrency": 2})
    frozen = [
        FrozenCaller(gateway, keyed_post(f"frozen-{n}", f"?size={TWENTY_MB}")) for n in (1, 2)
    ]
    try:
        async with aiohttp.ClientSession() as session:
            for n in (1, 2):
                operation = await wait_for_state(session, gateway, f"frozen-{n}", "completed")
                assert operation["body_retained"] is False
            async with session.post(
                f"{gateway.url}{PATH}", json={"n": 3}, headers={"Idempotency-Key": "third"}
            ) as response:
                assert response.status == 201, await response.text()
        assert upstream.count == 3
    finally:
        for caller in frozen:
            caller.close()


async def test_a_caller_that_stops_reading_is_cut_after_write_timeout(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The operation completes whatever the caller does; once the caller has taken
    nothing for `write_timeout`, the gateway lets go of it (its spool is gone), and a
    caller that comes back to read finds its copy cut short."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        route=LARGE,
        server={"write_timeout": "1s", "spool_dir": str(spool_dir)},
    )
    caller = FrozenCaller(gateway, keyed_post("stops", f"?size={TWENTY_MB}"))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_for_state(session, gateway, "stops", "completed")
        await wait_for_spools(gateway, spool_dir, 0)
        received = await caller.read_rest()
        assert 0 < len(received) < TWENTY_MB
    finally:
        caller.close()
    assert upstream.count == 1


async def test_a_spool_is_unlinked_private_and_encrypted(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """While a caller holds a spooled answer, its file has no name in the spool
    directory, mode 0600, and not one page of the answer in clear."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    gateway = spawn(
        processes, tmp_path, upstream.url, route=LARGE, server={"spool_dir": str(spool_dir)}
    )
    caller = FrozenCaller(gateway, keyed_post("at-rest", f"?size={TWENTY_MB}"))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_for_state(session, gateway, "at-rest", "completed")
        (held,) = await wait_for_spools(gateway, spool_dir, 1)
        assert list(spool_dir.iterdir()) == []
        assert os.readlink(held).endswith("(deleted)")
        assert stat.S_IMODE(os.stat(held).st_mode) == 0o600
        content = held.read_bytes()
        assert len(content) > TWENTY_MB // 2
        assert pattern(4096)[:64] not in content
    finally:
        caller.close()


async def test_a_slow_reader_of_a_large_answer_gets_all_of_it_and_a_receipt(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A caller reads a 20 MB answer for longer than the route's `timeout`: it gets every
    byte, and the operation is completed (body not kept: a retry is told so in words),
    not `unknown`."""
    gateway = spawn(processes, tmp_path, upstream.url, route={**LARGE, "timeout": "1s"})
    async with aiohttp.ClientSession() as session:
        received = await read_slowly(session, gateway, "slow-reader", seconds=3.0)
        assert received == pattern(TWENTY_MB)
        operation = await lookup(session, gateway, "slow-reader")
        assert (operation["state"], operation["body_retained"]) == ("completed", False)
        async with session.post(
            f"{gateway.url}{PATH}?size={TWENTY_MB}",
            data=json.dumps({"key": "slow-reader"}).encode(),
            headers={"Idempotency-Key": "slow-reader", "Content-Type": "application/json"},
        ) as retry:
            problem = await retry.json(content_type=None)
    assert (retry.status, problem["type"].rsplit("/", 1)[-1]) == (409, "receipt-not-retained")
    assert "too large to keep" in problem["detail"], problem
    assert upstream.count == 1


async def test_an_answer_past_max_spool_is_completed_at_its_status_line(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """An answer longer than `max_spool` by its Content-Length is completed before the
    caller has read much of it; the rest reaches a caller that keeps reading, whole."""
    route = {**LARGE, "max_spool": "1MiB"}
    gateway = spawn(processes, tmp_path, upstream.url, route=route)
    async with aiohttp.ClientSession() as session:
        request = session.post(
            f"{gateway.url}{PATH}?size={TWENTY_MB}",
            data=json.dumps({"key": "past-spool"}).encode(),
            headers={"Idempotency-Key": "past-spool", "Content-Type": "application/json"},
        )
        async with request as response:
            first = await response.content.readexactly(1 << 16)
            operation = await wait_for_state(session, gateway, "past-spool", "completed")
            assert operation["body_retained"] is False
            rest = await response.read()
    assert first + rest == pattern(TWENTY_MB)
    assert upstream.count == 1


async def test_full_spools_refuse_new_calls_before_their_claim(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """With `max_spool_total` taken by a caller who reads nothing, a new protected call
    is refused `503 route-saturated` and nothing is sent; once that caller is cut, the
    room is back."""
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    server = {"max_spool_total": "1MiB", "write_timeout": "2s", "spool_dir": str(spool_dir)}
    gateway = spawn(processes, tmp_path, upstream.url, route=LARGE, server=server)
    caller = FrozenCaller(gateway, keyed_post("hog", "?size=4000000"))
    try:
        async with aiohttp.ClientSession() as session:
            await wait_for_state(session, gateway, "hog", "completed")
            async with session.post(
                f"{gateway.url}{PATH}", json={}, headers={"Idempotency-Key": "refused"}
            ) as refused:
                problem = await refused.json(content_type=None)
            assert (refused.status, problem["type"].rsplit("/", 1)[-1]) == (503, "route-saturated")
            assert "max_spool_total" in problem["detail"]
            assert upstream.count == 1
            await wait_for_spools(gateway, spool_dir, 0)
            async with session.post(
                f"{gateway.url}{PATH}", json={}, headers={"Idempotency-Key": "refused"}
            ) as accepted:
                assert accepted.status == 201
    finally:
        caller.close()
    assert upstream.count == 2


async def read_slowly(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, *, seconds: float
) -> bytes:
    """POST for a 20 MB answer and read it in 64 KiB pieces spread over `seconds`."""
    pieces = TWENTY_MB // (1 << 16) + 1
    async with session.post(
        f"{gateway.url}{PATH}?size={TWENTY_MB}",
        data=json.dumps({"key": key}).encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    ) as response:
        assert response.status == 201
        received = bytearray()
        while chunk := await response.content.read(1 << 16):
            received += chunk
            await asyncio.sleep(seconds / pieces)
    return bytes(received)


# -- MCP: a caller that stops reading while the server streams ------------------------

MCP_PREFIX = "/tools"


def mcp_call(key: str, tool: str, arguments: dict[str, Any], *, accept: str) -> bytes:
    """A protected `tools/call` as one raw POST (2025-06-18, stateless server)."""
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 7,
            "method": "tools/call",
            "params": {
                "name": tool,
                "arguments": arguments,
                "_meta": {"idempotencyKey": key, "progressToken": "p-1"},
            },
        }
    ).encode()
    return (
        f"POST {MCP_PREFIX} HTTP/1.1\r\nHost: gateway\r\nAccept: {accept}\r\n"
        f"MCP-Protocol-Version: 2025-06-18\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def mcp_gateway(
    processes: list[GatewayProcess], tmp_path: Path, server: CountingMcpServer, **route: Any
) -> GatewayProcess:
    route = {"name": "tools", "prefix": MCP_PREFIX, "upstream": server.url, "kind": "mcp"} | route
    return spawn(
        processes,
        tmp_path,
        server.url,
        route={**route, "max_call": "5s"},
        server={"write_timeout": "1s"},
        logging={"level": "info"},
    )


async def test_a_frozen_mcp_caller_of_a_streamed_answer_leaves_the_receipt_whole(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """The server streams 20 MB of progress, then its response, to a caller that reads
    nothing: the gateway reads on, the call is completed with the tool's own result
    (the retry replays it), and the caller is let go of after `write_timeout`."""
    async with CountingMcpServer(stateless=True) as server:
        gateway = mcp_gateway(processes, tmp_path, server)
        arguments = {"title": "chatty", "notes": 1000, "note_size": 20_000}
        caller = FrozenCaller(
            gateway,
            mcp_call("frozen-sse", "chatty_ticket", arguments, accept=f"{JSON}, {EVENT_STREAM}"),
        )
        try:
            async with aiohttp.ClientSession() as session:
                await wait_for_state(session, gateway, "frozen-sse", "completed")
            await wait_for_log(gateway, f"POST {MCP_PREFIX} 200")
            assert len(await caller.read_rest()) < 1000 * 20_000
        finally:
            caller.close()
        async with mcp_client(gateway.url + MCP_PREFIX) as client:
            retry = await call_with_key(client, "chatty_ticket", arguments, "frozen-sse")
        assert retry.is_error is False
        assert retry.structured_content == {"id": "T-1", "title": "chatty"}
        assert server.count == 1


async def test_a_frozen_mcp_caller_of_a_json_answer_is_let_go_of(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """A JSON answer of 10 MB (more than the sockets' buffers hold) to a caller that
    reads nothing: completed, and the gateway lets go of the caller after
    `write_timeout` instead of waiting on it for ever; a caller that comes back to read
    finds its copy cut short."""
    async with CountingMcpServer(stateless=True, json_response=True) as server:
        gateway = mcp_gateway(processes, tmp_path, server, max_stored_response="16MiB")
        arguments = {"title": "big", "size": 5_000_000}  # twice in the result: 10 MB
        caller = FrozenCaller(
            gateway, mcp_call("frozen-json", "large_ticket", arguments, accept=JSON)
        )
        try:
            async with aiohttp.ClientSession() as session:
                await wait_for_state(session, gateway, "frozen-json", "completed")
            await wait_for_log(gateway, f"POST {MCP_PREFIX} 200")
            assert len(await caller.read_rest()) < 2 * 5_000_000
        finally:
            caller.close()
        assert server.count == 1
