"""Worker deaths never end a gateway that has served (`[server] workers = 3`).

The gateway runs as production runs it, `python -m gateway serve` with a config
file, and the tests `kill -9` its workers from outside, reading their pids
from /proc. Once the first worker serves, no death ends the supervisor: not a
serving worker's, not a starting one's, not its replacement's. Each slot is
restarted with backoff, `/readyz` says `degraded` while fewer than 3 have
served for longer than 10 s, `worker_restarts_total` counts the replacements,
and a key still makes one effect. Before anything has served, a first worker
killed by a signal is started again a bounded number of times, and one that
exits with its own error stops the gateway as it always did.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import re
import select
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from harness import ROOT, GatewayProcess, settings_for, spawn, write_config
from prometheus_client.parser import text_string_to_metric_families
from upstream import CountingUpstream
from worker_processes import is_running, listening_ports, worker_pids

from gateway.workers.supervisor import Supervisor

pytestmark = pytest.mark.slow

WORKERS = 3
SERVER = {"workers": WORKERS}
STORM_SECONDS = 4.0
STORM_ROUNDS = 400
"""The storm is bounded in time and in rounds: whichever ends first."""
ROUND_PAUSE = 0.01
"""Between two rounds of kills: replacements appear, and are killed while they start."""
ISSUES = "/tickets/v1/issues"


def launch(
    processes: list[GatewayProcess], tmp_path: Path, upstream_url: str, **options: Any
) -> GatewayProcess:
    """`python -m gateway serve` with workers, not waiting for its "listening on" line
    (the storm starts before it); `processes` stops it after the test whatever happens."""
    settings = settings_for(tmp_path, upstream_url, server=SERVER, **options)
    gateway = GatewayProcess(config_path=write_config(settings, tmp_path / "gw.toml"))
    gateway.log_path = tmp_path / "gw.log"
    with open(gateway.log_path, "a") as log:
        gateway.process = subprocess.Popen(
            [sys.executable, "-m", "gateway", "serve", "--config", str(gateway.config_path)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
    processes.append(gateway)
    return gateway


def pid_of(gateway: GatewayProcess) -> int:
    assert gateway.process is not None
    return gateway.process.pid


def alive(gateway: GatewayProcess) -> bool:
    assert gateway.process is not None
    return gateway.process.poll() is None


def why_not(gateway: GatewayProcess) -> str:
    """What the supervisor said, for an assertion's message."""
    assert gateway.process is not None
    assert gateway.log_path is not None
    log = gateway.log_path.read_text().strip().splitlines()
    return f"supervisor exit code {gateway.process.poll()}; its last lines:\n" + "\n".join(log[-8:])


def children(gateway: GatewayProcess) -> list[int]:
    """Its workers, [] once the supervisor is gone."""
    try:
        return worker_pids(pid_of(gateway))
    except OSError:
        return []


async def first_serving_port(gateway: GatewayProcess, *, seconds: float) -> int:
    """Wait until a worker listens, and return its port (the gateway's one port)."""
    async with asyncio.timeout(seconds):
        while True:
            assert alive(gateway), why_not(gateway)
            for pid in children(gateway):
                if ports := listening_ports(pid):
                    return ports[0]
            await asyncio.sleep(0.01)


async def get(session: aiohttp.ClientSession, url: str) -> tuple[int, Any] | None:
    """(status, JSON body), or None when the worker that took the connection died."""
    try:
        async with asyncio.timeout(5), session.get(url) as response:
            return response.status, await response.json(content_type=None)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError):
        return None


async def post(
    session: aiohttp.ClientSession, url: str, key: str
) -> tuple[int, dict[str, str], bytes]:
    headers = {"Idempotency-Key": key, "Content-Type": "application/json"}
    async with session.post(f"{url}{ISSUES}", data=b'{"title": "t"}', headers=headers) as answer:
        return answer.status, dict(answer.headers), await answer.read()


def kill(pids: list[int], killed: set[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)


async def storm(gateway: GatewayProcess) -> set[int]:
    """kill -9 every worker the supervisor has, round after round, replacements still
    starting included, for `STORM_SECONDS` or `STORM_ROUNDS`; the pids it killed."""
    killed: set[int] = set()
    loop = asyncio.get_running_loop()
    end = loop.time() + STORM_SECONDS
    for _ in range(STORM_ROUNDS):
        if loop.time() >= end or not alive(gateway):
            break
        kill(children(gateway), killed)
        await asyncio.sleep(ROUND_PAUSE)
    return killed


async def until_degraded(
    gateway: GatewayProcess, session: aiohttp.ClientSession, url: str, killed: set[int]
) -> dict[str, Any]:
    """Spare one worker and go on killing the others until `/readyz`, answered by the
    spared one, says degraded; its body."""
    spared: int | None = None
    async with asyncio.timeout(60):
        for _ in range(2000):
            assert alive(gateway), why_not(gateway)
            pids = children(gateway)
            if spared not in pids:
                spared = pids[0] if pids else None
            kill([pid for pid in pids if pid != spared], killed)
            answer = await get(session, f"{url}/readyz")
            if answer is not None and answer[0] == 503:
                body: dict[str, Any] = answer[1]
                return body
            await asyncio.sleep(0.05)
    raise AssertionError("/readyz never said degraded")


async def until_all_serve(
    gateway: GatewayProcess, session: aiohttp.ClientSession, url: str
) -> dict[str, Any]:
    """Wait for `/readyz` to count every worker serving again; its body."""
    async with asyncio.timeout(90):
        while True:
            assert alive(gateway), why_not(gateway)
            answer = await get(session, f"{url}/readyz")
            if answer is not None and answer[0] == 200:
                body: dict[str, Any] = answer[1]
                if body.get("serving_workers") == WORKERS:
                    return body
            await asyncio.sleep(0.1)


async def announced_url(gateway: GatewayProcess, *, seconds: float) -> str:
    """The URL of the supervisor's "listening on" line, waited for at most `seconds`."""
    assert gateway.process is not None
    assert gateway.process.stdout is not None
    stdout = gateway.process.stdout
    ready, _, _ = await asyncio.to_thread(select.select, [stdout], [], [], seconds)
    line = stdout.readline() if ready else ""
    assert "listening on" in line, f"{line!r}; {why_not(gateway)}"
    return line.strip().rsplit(" ", 1)[-1]


async def restarts_counted(session: aiohttp.ClientSession, url: str) -> float:
    async with session.get(f"{url}/metrics") as response:
        text = await response.text()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    (sample,) = families["idempotency_gateway_worker_restarts"].samples
    return float(sample.value)


async def test_a_storm_of_kill_9_never_ends_a_gateway_that_has_served(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """kill -9 of every worker for seconds, from the moment the first one serves and
    replacements still starting included, leaves the supervisor running: all 3 workers
    serve again, `/readyz` said degraded meanwhile, the restarts are counted, and a key
    still makes exactly one effect."""
    gateway = launch(processes, tmp_path, upstream.url)
    port = await first_serving_port(gateway, seconds=60)
    url = f"http://127.0.0.1:{port}"
    async with aiohttp.ClientSession() as session:
        status, _, _ = await post(session, url, "before-the-storm")
        assert status == 201

        killed = await storm(gateway)
        assert alive(gateway), why_not(gateway)
        degraded = await until_degraded(gateway, session, url, killed)
        healthy = await until_all_serve(gateway, session, url)

        assert alive(gateway), why_not(gateway)
        assert await announced_url(gateway, seconds=30) == url
        assert len(children(gateway)) == WORKERS
        assert await get(session, f"{url}/healthz") == (200, {"status": "ok"})
        restarts = await restarts_counted(session, url)
        replayed = await post(session, url, "before-the-storm")
        first = await post(session, url, "after-the-storm")
        again = await post(session, url, "after-the-storm")

    assert len(killed) >= WORKERS
    assert degraded["status"] == "degraded"
    assert degraded["workers"] == WORKERS
    assert degraded["serving_workers"] < WORKERS
    assert healthy == {"status": "ready", "serving_workers": WORKERS, "workers": WORKERS}
    assert restarts >= len(killed)  # one replacement at least for each worker killed
    assert replayed[0] == 201
    assert replayed[1]["Idempotent-Replayed"] == "true"
    assert first[0] == 201
    assert "Idempotent-Replayed" not in first[1]
    assert again[0] == 201
    assert again[1]["Idempotent-Replayed"] == "true"
    assert again[2] == first[2]
    assert upstream.count == 2
    assert sorted(Counter(effect.key for effect in upstream.effects).values()) == [1, 1]


async def test_a_first_worker_killed_before_it_listens_is_started_again(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The first worker killed by SIGKILL while it starts, before anything has served, is
    not a configuration error: the supervisor starts it again and the gateway serves."""
    gateway = launch(processes, tmp_path, upstream.url)
    async with asyncio.timeout(60):
        while not (pids := children(gateway)):
            assert alive(gateway), why_not(gateway)
            await asyncio.sleep(0.005)
    (first,) = pids
    assert not listening_ports(first)
    os.kill(first, signal.SIGKILL)

    url = await announced_url(gateway, seconds=60)
    async with aiohttp.ClientSession() as session:
        await until_all_serve(gateway, session, url)
        assert await restarts_counted(session, url) == 1
    assert first not in children(gateway)
    assert gateway.log_path is not None
    log = gateway.log_path.read_text()
    assert f"worker 0 (pid {first}) was killed by SIGKILL before it listened" in log, log


async def test_a_first_worker_killed_at_every_start_stops_the_gateway_with_one_line(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A first worker killed before it listens, start after start, stops the gateway after
    a few tries: exit 1 with one line saying how many, nothing announced."""
    gateway = launch(processes, tmp_path, upstream.url)
    killed: set[int] = set()
    async with asyncio.timeout(120):
        for _ in range(100_000):
            if not alive(gateway):
                break
            pids = children(gateway)
            assert not any(listening_ports(pid) for pid in pids), "a worker listened"
            kill(pids, killed)
            await asyncio.sleep(0.005)
    assert gateway.process is not None
    assert gateway.process.stdout is not None
    assert gateway.process.wait() == 1
    assert "listening" not in gateway.process.stdout.read()
    assert gateway.log_path is not None
    last = gateway.log_path.read_text().strip().splitlines()[-1]
    stopped = re.fullmatch(
        r"idempotency-gateway: cannot start: worker 0 was killed by SIGKILL (\d+) times "
        r"before it listened",
        last,
    )
    assert stopped is not None, last
    assert len(killed) == int(stopped[1]) > 1


async def test_a_first_worker_that_exits_with_its_own_error_stops_the_gateway(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A store the first worker refuses (its scope secret is gone) stops a gateway with
    workers at once, as before: the worker's own line, then the supervisor's, exit 1,
    and no worker is started again."""
    single = spawn(processes, tmp_path, upstream.url, name="single")
    async with aiohttp.ClientSession() as session:
        assert (await post(session, single.url, "k1"))[0] == 201
    single.stop()
    with closing(sqlite3.connect(tmp_path / "gateway.db")) as connection, connection:
        connection.execute("DELETE FROM gateway_meta WHERE name = 'scope_secret'")

    gateway = launch(processes, tmp_path, upstream.url)
    assert gateway.process is not None
    assert gateway.process.stdout is not None
    assert await asyncio.to_thread(gateway.process.wait, 60) == 1
    assert "listening" not in gateway.process.stdout.read()
    assert gateway.log_path is not None
    lines = gateway.log_path.read_text().strip().splitlines()
    assert lines[-1] == "idempotency-gateway: cannot start: worker 0 did not start (exit code 1)"
    assert lines[-2].startswith("idempotency-gateway: cannot start: the store holds operations")
    assert len(lines) == 2, lines
    assert not is_running(pid_of(gateway))
    assert upstream.count == 1


async def test_a_failed_spawn_or_a_worker_dead_before_its_settings_is_restarted(
    tmp_path: Path, upstream: CountingUpstream, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the first worker listens, a worker that cannot be spawned, and one that dies
    before its settings reach it (a broken pipe), are deaths like any other: `start()`
    returns, the slot is started again, and both restarts are counted."""
    spawn_process = asyncio.create_subprocess_exec
    spawned = 0

    async def flaky(*args: Any, **kwargs: Any) -> asyncio.subprocess.Process:
        nonlocal spawned
        spawned += 1
        if spawned == 2:  # worker 1's first start
            raise OSError(errno.EAGAIN, "no process for worker 1 (the test says so)")
        process = await spawn_process(*args, **kwargs)
        if spawned == 3:  # its first replacement dies before it reads its settings
            process.kill()
            await process.wait()
        return process

    monkeypatch.setattr(asyncio, "create_subprocess_exec", flaky)
    supervisor = Supervisor(settings_for(tmp_path, upstream.url, server={"workers": 2}))
    try:
        url, *_ = await supervisor.start()
        async with asyncio.timeout(60):
            while True:
                if supervisor.serving_workers == 2:
                    break
                await asyncio.sleep(0.05)
        async with aiohttp.ClientSession() as session:
            assert await restarts_counted(session, url) == 2
            assert (await post(session, url, "spawned"))[0] == 201
    finally:
        await supervisor.stop()
    assert spawned == 4
    assert upstream.count == 1
