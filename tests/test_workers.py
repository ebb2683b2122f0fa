"""A gateway with worker processes (`[server] workers = 2`), as production runs it.

One supervisor, two workers on one port and one SQLite file. What must hold is
what holds for one process: one effect per key whichever worker each request
reaches, `unknown` (never released, never resent) for the calls of a worker
killed mid-call, every receipt recorded when the gateway drains, and one
gateway per database file.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import pytest
from harness import GatewayProcess, spawn
from mcp_upstream import ACCEPT_BOTH, INITIALIZE, CountingMcpServer
from prometheus_client.parser import text_string_to_metric_families
from upstream import CountingUpstream
from worker_processes import (
    connections,
    holder,
    is_running,
    wait_for_workers,
    wait_until_exited,
    worker_pids,
)

pytestmark = pytest.mark.slow

WORKERS = {"server": {"workers": 2}}
ISSUES = "/tickets/v1/issues"


def port_of(url: str) -> int:
    port = urlsplit(url).port
    assert port is not None
    return port


def supervisor_pid(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    return gateway.process.pid


async def post(
    session: aiohttp.ClientSession, url: str, key: str, *, query: str = "", wait: float = 0
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    if wait:
        headers["Prefer"] = f"wait={wait:g}"
    async with session.post(
        f"{url}{ISSUES}{query}", data=json.dumps({"key": key}).encode(), headers=headers
    ) as response:
        return response.status, dict(response.headers), await response.read()


async def state_of(session: aiohttp.ClientSession, url: str, key: str) -> dict[str, object]:
    async with session.get(f"{url}/operations/{key}") as response:
        assert response.status == 200, await response.text()
        body: dict[str, object] = await response.json()
        return body


async def settled_state(
    session: aiohttp.ClientSession, url: str, key: str, *, seconds: float
) -> dict[str, object]:
    """The operation once it is no longer in flight, polled for at most `seconds`.

    A lookup whose connection the kernel queued on the listening socket of the worker
    that just died is reset before it was sent (each worker has its own socket on the
    shared port): a GET never sent is asked again, as a client would."""
    async with asyncio.timeout(seconds):
        while True:
            try:
                operation = await state_of(session, url, key)
            except aiohttp.ClientConnectorError:
                await asyncio.sleep(0.05)
                continue
            if operation["state"] != "in_flight":
                return operation
            await asyncio.sleep(0.05)


async def held_connections(workers: list[int], port: int, *, total: int) -> list[int]:
    """Each worker's connections on `port`, once they come to `total` (at most 60 s)."""
    async with asyncio.timeout(60):
        while True:
            held = [connections(pid, local_port=port) for pid in workers]
            if sum(held) >= total:
                return held
            await asyncio.sleep(0.05)


def fresh_connections() -> aiohttp.ClientSession:
    """A session whose requests each open a connection, so SO_REUSEPORT spreads them."""
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(force_close=True, limit=0))


async def test_a_storm_of_one_key_against_two_workers_makes_one_effect(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """80 requests with one key, held open on both workers at once, forward it once."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    workers = worker_pids(supervisor_pid(gateway))
    assert len(workers) == 2
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        answers = await asyncio.gather(
            *(post(session, gateway.url, "storm", query="?delay=0.5") for _ in range(80))
        )
        # Every request had its own connection (all were in flight together); each
        # worker accepted some of them.
        held = [connections(pid, local_port=port_of(gateway.url)) for pid in workers]
        statuses = Counter(status for status, _, _ in answers)
        assert statuses[201] + statuses[409] == 80, statuses
        first_answers = [h for s, h, _ in answers if s == 201 and "Idempotent-Replayed" not in h]
        assert len(first_answers) == 1
        replay = await post(session, gateway.url, "storm", query="?delay=0.5")
    assert all(count > 0 for count in held), held
    assert replay[0] == 201
    assert replay[1]["Idempotent-Replayed"] == "true"
    assert upstream.count == 1


async def test_100_keys_three_times_each_across_workers_make_100_effects(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Claims of many keys from both workers at once interleave in one file: one effect each."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    async with fresh_connections() as session:
        answers = await asyncio.gather(
            *(post(session, gateway.url, f"k{n}") for n in range(100) for _ in range(3))
        )
        assert {status for status, _, _ in answers} <= {201, 409}
        replays = await asyncio.gather(*(post(session, gateway.url, f"k{n}") for n in range(100)))
    assert all(s == 201 and h["Idempotent-Replayed"] == "true" for s, h, _ in replays)
    assert upstream.count == 100
    assert sorted(Counter(effect.key for effect in upstream.effects).values()) == [1] * 100


async def test_kill_9_of_a_worker_mid_call_leaves_unknown_and_the_supervisor_restarts_it(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The worker that sent a call dies by SIGKILL before the answer: its operation turns
    unknown at once (the lease is 30 s), a new worker takes its place, nothing is resent."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    supervisor = supervisor_pid(gateway)
    before = worker_pids(supervisor)
    async with aiohttp.ClientSession() as session:
        # Applied, its answer held: the worker is killed on the wire however slow the test is.
        call = asyncio.create_task(post(session, gateway.url, "killed", query="?hold_answer=1"))
        await upstream.wait_for_count(1, seconds=60)
        upstream_port = port_of(upstream.url)
        (sender,) = [pid for pid in before if connections(pid, remote_port=upstream_port)]
        os.kill(sender, signal.SIGKILL)
        with pytest.raises(aiohttp.ClientError):
            await call
        after = await wait_for_workers(supervisor, 2, besides={sender})
        assert set(before) - {sender} <= set(after)

        # The replacement turns the dead worker's claims unknown before it listens; the
        # lease (30 s) is far off, so nothing else can have done it within this wait.
        operation = await settled_state(session, gateway.url, "killed", seconds=10)
        assert operation["state"] == "unknown"
        assert operation["safe_to_retry"] is False
        evidence = operation["evidence"]
        assert isinstance(evidence, list)
        assert any("is gone" in item["detail"] for item in evidence), evidence
        for _ in range(4):  # whichever worker each retry reaches
            status, headers, body = await post(
                session, gateway.url, "killed", query="?hold_answer=1"
            )
            assert status == 409, body
            assert headers["Idempotency-Status"] == "unknown"
    assert upstream.count == 1


async def test_sigterm_drains_calls_in_flight_on_every_worker(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """SIGTERM while both workers wait on upstream calls: every caller gets its answer,
    every receipt is recorded, and the gateway exits 0."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    workers = worker_pids(supervisor_pid(gateway))
    async with fresh_connections() as session:
        calls = [
            asyncio.create_task(post(session, gateway.url, f"drain-{n}", query="?delay=1.5"))
            for n in range(16)
        ]
        await upstream.wait_for_count(16, seconds=10)
        upstream_port = port_of(upstream.url)
        assert all(connections(pid, remote_port=upstream_port) > 0 for pid in workers)
        assert gateway.process is not None
        gateway.process.send_signal(signal.SIGTERM)
        answers = await asyncio.gather(*calls)
    assert [status for status, _, _ in answers] == [201] * 16
    assert await asyncio.to_thread(gateway.process.wait, 30) == 0
    assert not any(is_running(pid) for pid in workers)

    restarted = spawn(processes, tmp_path, upstream.url, **WORKERS)
    async with aiohttp.ClientSession() as session:
        for n in range(16):
            assert (await state_of(session, restarted.url, f"drain-{n}"))["state"] == "completed"
            status, headers, _ = await post(
                session, restarted.url, f"drain-{n}", query="?delay=1.5"
            )
            assert status == 201
            assert headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 16


async def test_one_gateway_per_database_file_whatever_its_workers(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A gateway with workers holds the file: a second gateway, with or without workers,
    is refused, also through a symbolic link; once the first stops, the file is free."""
    first = spawn(processes, tmp_path, upstream.url, **WORKERS)
    with pytest.raises(RuntimeError, match="in use by another gateway"):
        spawn(processes, tmp_path, upstream.url, name="single")
    with pytest.raises(RuntimeError, match="in use by another gateway"):
        spawn(processes, tmp_path, upstream.url, name="workers", **WORKERS)
    link = tmp_path / "link.db"
    link.symlink_to(tmp_path / "gateway.db")
    with pytest.raises(RuntimeError, match="in use by another gateway"):
        spawn(processes, tmp_path, upstream.url, name="link", store={"url": f"sqlite:///{link}"})
    first.stop()
    spawn(processes, tmp_path, upstream.url, name="after")


async def test_a_waiting_retry_is_woken_by_the_other_workers_receipt(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """`Prefer: wait` on a key the other worker holds ends with the receipt: every waiter,
    on either worker, gets the replay, and the upstream sees the call once."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    workers = worker_pids(supervisor_pid(gateway))
    async with fresh_connections() as session:
        # The first call's answer is held until every waiter is on a worker, waiting.
        first = asyncio.create_task(post(session, gateway.url, "waited", query="?hold_answer=1"))
        await upstream.wait_for_count(1, seconds=60)
        waiters = [
            asyncio.create_task(
                post(session, gateway.url, "waited", query="?hold_answer=1", wait=20)
            )
            for _ in range(12)
        ]
        held = await held_connections(workers, port_of(gateway.url), total=13)
        upstream.release_answers()
        answers = await asyncio.gather(first, *waiters)
    assert all(count > 0 for count in held), held  # waiters on both workers
    assert [status for status, _, _ in answers] == [201] * 13
    assert all(h.get("Idempotent-Replayed") == "true" for _, h, _ in answers[1:])
    assert len({body for _, _, body in answers}) == 1
    assert upstream.count == 1


CRASH_WINDOWS = pytest.mark.parametrize(
    ("window", "effects", "state"),
    [
        ("after_claim", 0, "unknown"),
        ("after_send", 1, "unknown"),
        ("after_response", 1, "unknown"),
        ("after_receipt", 1, "completed"),
    ],
)


@CRASH_WINDOWS
async def test_a_worker_crashing_in_each_window_leaves_an_honest_state(
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
    window: str,
    effects: int,
    state: str,
) -> None:
    """The crash table with two workers: the worker that took the call dies by SIGKILL in
    the window, the other serves on, the replacement settles the dead one's claim, and no
    retry, on either worker, sends the call again."""
    gateway = spawn(processes, tmp_path, upstream.url, fault=f"crash_{window}", **WORKERS)
    supervisor = supervisor_pid(gateway)
    before = worker_pids(supervisor)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            await post(session, gateway.url, f"crash-{window}")
        operation = await settled_state(session, gateway.url, f"crash-{window}", seconds=10)
        assert operation["state"] == state
        for _ in range(4):
            status, headers, _ = await post(session, gateway.url, f"crash-{window}")
            if state == "unknown":
                assert status == 409
                assert headers["Idempotency-Status"] == "unknown"
            else:
                assert status == 201
                assert headers["Idempotent-Replayed"] == "true"
    assert upstream.count == effects
    # The replays can be answered by the other worker before the supervisor has seen the
    # death: wait for the replacement (a worker not there before) to run.
    await wait_for_workers(supervisor, 1, besides=set(before), seconds=60)
    assert len(set(worker_pids(supervisor)) - set(before)) == 1  # one worker was replaced


async def test_kill_9_of_the_supervisor_lets_the_workers_finish_their_calls(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Workers outlive a supervisor killed by SIGKILL only to drain: the call in flight gets
    its answer and its receipt, then they exit and free the file for the next gateway."""
    # Its metrics directory outlives it (nobody is left to remove it): keep it in tmp_path.
    gateway = spawn(processes, tmp_path, upstream.url, env={"TMPDIR": str(tmp_path)}, **WORKERS)
    workers = worker_pids(supervisor_pid(gateway))
    async with aiohttp.ClientSession() as session:
        call = asyncio.create_task(post(session, gateway.url, "orphaned", query="?delay=1"))
        await upstream.wait_for_count(1, seconds=10)
        gateway.kill(signal.SIGKILL)
        status, _, _ = await call
        assert status == 201
        await wait_until_exited(workers, seconds=15)
        restarted = spawn(processes, tmp_path, upstream.url, name="next")
        assert (await state_of(session, restarted.url, "orphaned"))["state"] == "completed"
    assert upstream.count == 1


async def test_one_metrics_endpoint_counts_every_worker(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """40 calls spread over two workers: scrapes, whichever worker answers them, count 40
    once every worker's snapshot is in (at most a second), and never more."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    async with fresh_connections() as session:
        await asyncio.gather(*(post(session, gateway.url, f"m{n}") for n in range(40)))
        seen: list[float] = []
        async with asyncio.timeout(60):  # bounds a hang only
            while seen[-3:] != [40, 40, 40]:
                families = await scrape(session, gateway.url)
                seen.append(forwarded_count(families))
                assert families["idempotency_gateway_ready"].samples[0].value == 1
                await asyncio.sleep(0.1)
    assert max(seen) == 40, seen


async def scrape(session: aiohttp.ClientSession, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    return {family.name: family for family in text_string_to_metric_families(text)}


def forwarded_count(families: dict[str, Any]) -> float:
    return sum(
        sample.value
        for sample in families["idempotency_gateway_requests"].samples
        if sample.name.endswith("_total") and sample.labels["outcome"] == "forwarded"
    )


async def test_a_waiter_on_the_other_worker_is_woken_not_left_to_poll(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Waiters on both workers answer within moments of the holder's receipt. Left to the
    store-polling fallback, the poll schedule (0.05 s doubling to 1 s) would answer the
    ones on the other worker about 0.9 s late for a call that ends 1.6 s into the wait."""
    gateway = spawn(processes, tmp_path, upstream.url, **WORKERS)
    workers = worker_pids(supervisor_pid(gateway))
    loop = asyncio.get_running_loop()

    async def timed(wait: float) -> float:
        await post(session, gateway.url, "woken", query="?delay=2", wait=wait)
        return loop.time()

    async with fresh_connections() as session:
        first = asyncio.create_task(timed(0))
        await upstream.wait_for_count(1, seconds=10)
        await asyncio.sleep(0.4)
        waiters = [asyncio.create_task(timed(20)) for _ in range(12)]
        await asyncio.sleep(0.2)
        held = [connections(pid, local_port=port_of(gateway.url)) for pid in workers]
        done = await asyncio.gather(first, *waiters)
    assert all(count > 0 for count in held), held
    assert max(done[1:]) - done[0] < 0.5, [round(t - done[0], 3) for t in done]
    assert upstream.count == 1


@pytest.mark.postgres
async def test_workers_on_postgresql_are_replicas_of_one_store(
    postgres_url: str, processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Two workers on PostgreSQL: a storm of one key and 60 keys twice, one effect each."""
    gateway = spawn(processes, tmp_path, upstream.url, store_url=postgres_url, **WORKERS)
    async with fresh_connections() as session:
        storm = await asyncio.gather(
            *(post(session, gateway.url, "pg-storm", query="?delay=0.3") for _ in range(40))
        )
        keys = await asyncio.gather(
            *(post(session, gateway.url, f"pg-{n}") for n in range(60) for _ in range(2))
        )
    assert Counter(status for status, _, _ in storm) <= Counter({201: 40, 409: 40})
    assert {status for status, _, _ in keys} <= {201, 409}
    assert upstream.count == 61
    assert sorted(Counter(effect.key for effect in upstream.effects).values()) == [1] * 61


MCP_ACCEPT = {**ACCEPT_BOTH, "Content-Type": "application/json"}


async def test_a_cancellation_reaching_another_worker_is_still_held_back(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """An MCP client's `notifications/cancelled` for a protected call in flight on one
    worker, sent on a connection the other worker accepted, is held back all the same: the
    call runs on to its receipt, and the server never hears of the cancellation."""
    async with CountingMcpServer() as server:
        route = {"name": "tools", "prefix": "/tools", "upstream": server.url, "kind": "mcp"}
        gateway = spawn(processes, tmp_path, upstream.url, extra_routes=[route], **WORKERS)
        workers = worker_pids(supervisor_pid(gateway))
        url, port = gateway.url + "/tools", port_of(gateway.url)
        async with aiohttp.ClientSession() as session:
            async with session.post(url, json=INITIALIZE, headers=MCP_ACCEPT) as opened:
                assert opened.status == 200
                headers = {
                    **MCP_ACCEPT,
                    "Mcp-Session-Id": opened.headers["Mcp-Session-Id"],
                    "MCP-Protocol-Version": "2025-11-25",
                }
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            async with session.post(url, json=initialized, headers=headers) as done:
                assert done.status == 202
            call = {
                "jsonrpc": "2.0",
                "id": 7,
                "method": "tools/call",
                "params": {
                    "name": "slow_ticket",
                    "arguments": {"title": "slow", "seconds": 1.5},
                    "_meta": {"idempotencyKey": "cancelled-elsewhere"},
                },
            }
            # The call goes on a connection whose worker is known: the one that sends it.
            path = urlsplit(url).path
            reader, writer, sender = await _connection(workers, port)
            await _send_post(writer, path, call, headers)
            await server.wait_for_count(1, seconds=10)
            other = next(pid for pid in workers if pid != sender)
            cancel = {
                "jsonrpc": "2.0",
                "method": "notifications/cancelled",
                "params": {"requestId": 7, "reason": "the client gave up"},
            }
            cancel_reader, cancel_writer, _ = await _connection(workers, port, on=other)
            await _send_post(cancel_writer, path, cancel, headers)
            assert (await cancel_reader.readline()).split()[1] == b"202"
            cancel_writer.close()
            async with asyncio.timeout(10):
                answer = await reader.read()  # to the end: the request said Connection: close
            writer.close()
        status_line, _, body = answer.partition(b"\r\n")
        assert status_line.split()[1] == b"200", answer
        assert b'"isError":false' in body.replace(b" ", b"")
        methods = [e.json.get("method") for e in server.requests if isinstance(e.json, dict)]
        assert "notifications/cancelled" not in methods
        assert server.count == 1


async def _connection(
    workers: list[int], port: int, *, on: int | None = None
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, int]:
    """A new connection to the gateway and the worker that accepted it; with `on`,
    connections are opened until that worker accepts one (SO_REUSEPORT decides)."""
    for _ in range(64):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        source_port = writer.get_extra_info("sockname")[1]
        await asyncio.sleep(0.02)  # accepted by then
        accepted_by = holder(workers, local_port=port, remote_port=source_port)
        if accepted_by is not None and on in (None, accepted_by):
            return reader, writer, accepted_by
        writer.close()
        await writer.wait_closed()
    raise AssertionError(f"no connection of 64 landed on worker {on}")


async def _send_post(
    writer: asyncio.StreamWriter, path: str, document: dict[str, Any], headers: dict[str, str]
) -> None:
    """POST `document` as the only request on the connection (`Connection: close`)."""
    body = json.dumps(document).encode()
    lines = [f"POST {path} HTTP/1.1", "Host: 127.0.0.1", f"Content-Length: {len(body)}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    writer.write("\r\n".join([*lines, "Connection: close", "", ""]).encode() + body)
    await writer.drain()
