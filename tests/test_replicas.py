"""Two gateway replicas (real `python -m gateway serve` processes) on one PostgreSQL schema.

What docs/deploy.md promises for several replicas, tested end to end: one claim
wins across replicas, orphans of a dead replica become `unknown` and are never
forwarded again, a paused replica cannot overwrite what another one decided,
`Prefer: wait` is woken across replicas, and a PostgreSQL restart turns into
`503 store-unavailable` (never a blind forward) until the pool reconnects.
"""

from __future__ import annotations

import asyncio
import collections
import json
import math
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from harness import GatewayProcess, spawn
from pg import restart_alone, share_again
from upstream import CountingUpstream

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

PATH = "/tickets/v1/issues"
TIMEOUT = aiohttp.ClientTimeout(total=20)

Start = Callable[..., GatewayProcess]


@pytest.fixture
def start(
    postgres_url: str,
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
) -> Start:
    """Start a replica named `name` on the test's schema (stopped before the schema is dropped)."""

    def start_replica(name: str, **idempotency: str) -> GatewayProcess:
        # One agent fleet in one scope, forwarding its keys as they came ("key" is
        # allowed for a single scope): the upstream's per-key counts are then exact
        # even for requests the gateway refused without a record.
        return spawn(
            processes,
            tmp_path,
            upstream.url,
            name=name,
            store_url=postgres_url,
            route={"forward_key": "key"},
            idempotency={"scope_headers": [], **idempotency},
        )

    return start_replica


@pytest_asyncio.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    """One client session for the test (connection pool large enough for the load tests)."""
    connector = aiohttp.TCPConnector(limit=200)
    async with aiohttp.ClientSession(connector=connector, timeout=TIMEOUT) as client:
        yield client


class Answer:
    """A response read to the end: status, headers, body and the problem type if any."""

    def __init__(self, status: int, headers: Any, body: bytes) -> None:
        self.status = status
        self.headers = headers
        self.body = body

    @property
    def replayed(self) -> bool:
        return self.headers.get("Idempotent-Replayed") == "true"

    @property
    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def problem(self) -> str | None:
        if not self.headers.get("Content-Type", "").startswith("application/problem+json"):
            return None
        return str(self.json["type"]).rsplit("/", 1)[-1]

    def __repr__(self) -> str:
        return f"<Answer {self.status} {self.body[:200]!r}>"


async def post(
    session: aiohttp.ClientSession,
    replica: GatewayProcess,
    key: str,
    *,
    query: str = "",
    body: object = None,
    headers: dict[str, str] | None = None,
) -> Answer:
    sent = {"Idempotency-Key": key, "Content-Type": "application/json", **(headers or {})}
    data = json.dumps(body if body is not None else {"key": key}).encode()
    async with session.post(f"{replica.url}{PATH}{query}", data=data, headers=sent) as response:
        return Answer(response.status, response.headers, await response.read())


async def lookup(session: aiohttp.ClientSession, replica: GatewayProcess, key: str) -> Answer:
    async with session.get(f"{replica.url}/operations/{key}") as response:
        return Answer(response.status, response.headers, await response.read())


async def wait_for_state(
    session: aiohttp.ClientSession,
    replica: GatewayProcess,
    key: str,
    state: str,
    *,
    seconds: float,
    until: Callable[[dict[str, Any]], bool] = lambda _operation: True,
) -> dict[str, Any]:
    """Poll the replica's lookup until the key is in `state` (and `until` holds); bounded."""
    deadline = time.monotonic() + seconds
    seen: Answer | None = None
    while time.monotonic() < deadline:
        seen = await lookup(session, replica, key)
        if seen.status == 200 and seen.json["state"] == state and until(seen.json):
            return dict(seen.json)
        await asyncio.sleep(0.1)
    pytest.fail(f"{key} did not reach {state!r} within {seconds}s; last lookup: {seen!r}")


# -- 1. one claim wins across replicas --------------------------------------------------------


async def test_concurrent_duplicates_across_replicas_reach_the_upstream_once(
    start: Start, upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """1000 concurrent requests (200 keys x 5) spread over two replicas make exactly 200 effects."""
    replicas = [start("a"), start("b")]
    keys = [f"dup-{n:03d}" for n in range(200)]
    limit = asyncio.Semaphore(100)

    async def send(replica: GatewayProcess, key: str) -> tuple[str, Answer]:
        async with limit:
            return key, await post(session, replica, key, query="?delay=0.05")

    sends = [
        send(replicas[(5 * index + copy) % 2], key)
        for index, key in enumerate(keys)
        for copy in range(5)
    ]
    async with asyncio.timeout(60):
        answers = await asyncio.gather(*sends)

    assert upstream.count == 200
    assert all(upstream.count_for(key) == 1 for key in keys)
    originals = collections.Counter[str]()
    first_body: dict[str, bytes] = {}
    for key, answer in answers:
        if answer.status == 201 and not answer.replayed:
            originals[key] += 1
            first_body[key] = answer.body
        elif answer.status == 201:
            pass  # a duplicate that came after the receipt: a replay
        else:
            assert (answer.status, answer.problem) == (409, "in-progress"), (key, answer)
    assert originals == dict.fromkeys(keys, 1)

    async with asyncio.timeout(30):
        replays = await asyncio.gather(*(send(r, key) for key in keys for r in replicas))
    for key, answer in replays:
        assert answer.status == 201, (key, answer)
        assert answer.replayed, (key, answer)
        assert answer.body == first_body[key]
    assert upstream.count == 200


# -- 2. a replica killed while holding keys ---------------------------------------------------


async def test_keys_of_a_killed_replica_become_unknown_and_are_never_forwarded_again(
    start: Start, upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """Keys in flight on a replica killed by SIGKILL turn unknown on the survivor, never resent."""
    a = start("a", lease="1s")
    b = start("b", lease="1s", sweep_interval="300ms")
    keys = [f"orphan-{n}" for n in range(10)]
    # Applied, their answers held: A dies with all ten on the wire, however slow the test is.
    in_flight = [asyncio.create_task(post(session, a, key, query="?hold_answer=1")) for key in keys]
    await upstream.wait_for_count(10, seconds=60)
    a.kill(signal.SIGKILL)
    outcomes = await asyncio.gather(*in_flight, return_exceptions=True)
    assert all(isinstance(outcome, aiohttp.ClientError) for outcome in outcomes), outcomes

    for key in keys:
        operation = await wait_for_state(session, b, key, "unknown", seconds=60)
        assert operation["safe_to_retry"] is False
        assert any(item["source"] == "lease" for item in operation["evidence"]), operation
    for key in keys:
        retry = await post(session, b, key, query="?hold_answer=1")
        assert (retry.status, retry.problem) == (409, "outcome-unknown"), retry
        assert retry.headers["Idempotency-Status"] == "unknown"
    assert upstream.count == 10
    assert all(upstream.count_for(key) == 1 for key in keys)


# -- 3. a replica paused past its lease -------------------------------------------------------


async def test_a_replica_paused_past_its_lease_still_records_the_answer_it_received(
    start: Start, upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """A replica resumed after another one saw its lease expire (the key turned unknown,
    the token unchanged) records the real answer as the receipt: nobody settled the
    attempt meanwhile, and the answer says exactly what happened."""
    a = start("a", lease="1s")
    b = start("b", lease="1s", sweep_interval="200ms")
    key = "paused-1"
    # The answer is held until A is frozen and B has seen the lease run out.
    first = asyncio.create_task(post(session, a, key, query="?hold_answer=1"))
    await upstream.wait_for_count(1, seconds=60)
    a.kill(signal.SIGSTOP)
    try:
        meanwhile = await wait_for_state(session, b, key, "unknown", seconds=60)
        retry = await post(session, b, key, query="?hold_answer=1")
        assert (retry.status, retry.problem) == (409, "outcome-unknown"), retry
    finally:
        upstream.release_answers()  # it reaches A while A is still frozen
        a.kill(signal.SIGCONT)
    late = await first
    assert late.status == 201, late  # the caller gets the upstream's answer
    assert late.headers["Idempotency-Status"] == "completed"

    operation = await wait_for_state(session, b, key, "completed", seconds=60)
    assert operation["response"]["status"] == 201
    assert operation["resolution"]["by"] == "upstream"
    assert operation["fencing_token"] == meanwhile["fencing_token"]
    assert any(item["source"] == "lease" for item in operation["evidence"])
    for replica in (a, b):
        replay = await post(session, replica, key, query="?hold_answer=1")
        assert replay.status == 201, replay
        assert replay.replayed
        assert replay.body == late.body
    assert upstream.count == 1


# -- 4. Prefer: wait across replicas ----------------------------------------------------------


async def test_prefer_wait_on_one_replica_is_woken_by_the_outcome_on_another(
    start: Start, upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """A waiter on replica B gets the receipt written by replica A as soon as it lands.

    The upstream takes 1.6 s: a waiter that missed the signal would only see the
    receipt on its next re-read, up to a second later (CROSS_PROCESS_POLL).
    """
    a = start("a")
    b = start("b")
    key = "wait-1"

    async def first_attempt() -> tuple[Answer, float]:
        answer = await post(session, a, key, query="?delay=1.6")
        return answer, time.monotonic()

    first = asyncio.create_task(first_attempt())
    await upstream.wait_for_count(1, seconds=60)
    waited = await post(session, b, key, query="?delay=1.6", headers={"Prefer": "wait=5"})
    waited_at = time.monotonic()
    original, original_at = await first
    assert original.status == 201
    assert not original.replayed
    assert waited.status == 201, waited
    assert waited.replayed
    assert waited.body == original.body
    lag = waited_at - original_at
    assert lag < 0.3, f"the waiter answered {lag:.2f}s after the receipt was written"
    assert upstream.count == 1


# -- 5. PostgreSQL restarted under load -------------------------------------------------------


def _cluster() -> list[str]:
    """`[version, "main"]` of the local cluster; skip (fail in CI) when it cannot be restarted."""
    reason = None
    versions = sorted(os.listdir("/etc/postgresql")) if os.path.isdir("/etc/postgresql") else []
    if not shutil.which("pg_ctlcluster") or not versions:
        reason = "pg_ctlcluster or /etc/postgresql is not available"
    elif os.geteuid() != 0 and os.stat(f"/etc/postgresql/{versions[-1]}/main").st_uid != (
        os.geteuid()
    ):
        reason = "not permitted to restart the PostgreSQL cluster (neither root nor its owner)"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the restart test must run in CI: {reason}")
        pytest.skip(reason)
    return [versions[-1], "main"]


def _pg_ctlcluster(cluster: list[str], action: str) -> None:
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, action],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _pg_ready() -> bool:
    probe = ["pg_isready", "-q", "-h", "127.0.0.1", "-p", "5432", "-t", "1"]
    return subprocess.run(probe, check=False, timeout=10).returncode == 0


def _ensure_pg_running(cluster: list[str]) -> None:
    if _pg_ready():
        return
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", *cluster, "start"],
        check=False,
        capture_output=True,
        timeout=60,
    )
    deadline = time.monotonic() + 30
    while not _pg_ready() and time.monotonic() < deadline:
        time.sleep(0.2)


async def test_postgres_restart_under_load_never_forwards_without_a_claim(
    start: Start, upstream: CountingUpstream, session: aiohttp.ClientSession
) -> None:
    """A PostgreSQL restart under load gives 503s, never an unrecorded effect, then serves again."""
    cluster = _cluster()
    # A short lease makes the keeper settle owed writes every second.
    gateway = start("solo", lease="3s", sweep_interval="500ms")
    answers: dict[str, Answer | BaseException] = {}
    answered_at: dict[str, float] = {}
    readiness: list[tuple[float, int | None]] = []
    restart: dict[str, float] = {}
    failures: list[str] = []
    stop = asyncio.Event()
    load_done = asyncio.Event()
    began = asyncio.Event()
    restarted = asyncio.Event()
    counter = iter(range(100_000))
    started = time.monotonic()

    async def worker(number: int) -> None:
        # The load runs for 8 s at least, and until the gateway has served a request after
        # PostgreSQL came back, however long the restart takes on a loaded machine (past the
        # caps on answers too, once the restart has ended).
        while not load_done.is_set():
            if not began.is_set() and len(answers) >= 1000:
                # Warmed up: the load waits for the restart to begin, however long other
                # workers' tests keep the server (a cap reached before the restart left no
                # request to meet the outage).
                await began.wait()
                continue
            if len(answers) - restart.get("answers_at_begin", 0) >= 5000 and not restarted.is_set():
                # The cap on the outage's answers: wait for the restart, then load again
                # (a worker that returned here left no request to be served after it).
                await restarted.wait()
                continue
            key = f"pg-{number:02d}-{next(counter):05d}"
            try:
                answer = answers[key] = await post(session, gateway, key, query="?delay=0.02")
            except (aiohttp.ClientError, TimeoutError) as exc:
                answers[key] = exc
                await asyncio.sleep(0.05)
                answer = None
            answered_at[key] = now = time.monotonic()
            if (
                answer is not None
                and answer.status == 201
                and now > restart.get("ended", math.inf)
                and now >= started + 8.0
            ):
                load_done.set()

    async def watch_readiness() -> None:
        while not stop.is_set() and len(readiness) < 20000:
            try:
                async with session.get(f"{gateway.url}/readyz") as response:
                    await response.read()
                    readiness.append((time.monotonic(), response.status))
            except (aiohttp.ClientError, TimeoutError):
                readiness.append((time.monotonic(), None))
            await asyncio.sleep(0.05)

    async def restart_postgres() -> None:
        await asyncio.sleep(2.0)
        # The server is this test's alone while it restarts (no other worker's test on it),
        # and only then: the others wait as long as it holds it.
        await asyncio.to_thread(restart_alone)
        restart["began"] = time.monotonic()
        restart["answers_at_begin"] = len(answers)
        began.set()
        try:
            await asyncio.to_thread(_pg_ctlcluster, cluster, "restart")
        except subprocess.CalledProcessError as exc:
            failures.append(f"pg_ctlcluster restart failed: {exc.stderr!r}")
            load_done.set()  # nothing to wait for: the test is skipped below
        finally:
            await asyncio.to_thread(_ensure_pg_running, cluster)
            share_again()
        restart["ended"] = time.monotonic()
        restarted.set()

    watcher = asyncio.create_task(watch_readiness())
    try:
        async with asyncio.timeout(300), asyncio.TaskGroup() as load:  # bounds a hang only
            load.create_task(restart_postgres())
            for number in range(20):
                load.create_task(worker(number))
        # /readyz is 200 again once the pool reconnects, without restarting the gateway.
        for _ in range(600):  # up to ~60 s: bounds a hang only
            if readiness and readiness[-1][0] > restart["ended"] and readiness[-1][1] == 200:
                break
            await asyncio.sleep(0.1)
    finally:
        stop.set()
        await asyncio.gather(watcher, return_exceptions=True)
        await asyncio.to_thread(_ensure_pg_running, cluster)
    if failures:
        if os.environ.get("CI") == "true":
            pytest.fail(failures[0])
        pytest.skip(failures[0])

    # Requests during the outage were refused (503 store-unavailable) or lost on the wire.
    refused = [key for key, answer in answers.items() if not isinstance(answer, Answer)]
    for key, answer in answers.items():
        if isinstance(answer, Answer) and answer.status != 201:
            assert (answer.status, answer.problem) == (503, "store-unavailable"), (
                key,
                answer,
                f"effects for this key: {upstream.count_for(key)}",
            )
            assert answer.json["safe_to_retry"] is True
            assert upstream.count_for(key) == 0, f"{key} got a 503 but reached the upstream"
            refused.append(key)
    assert refused, "no request met the outage: the restart was not observed"
    served_after = [
        key
        for key, answer in answers.items()
        if isinstance(answer, Answer)
        and answer.status == 201
        and answered_at[key] > restart["ended"]
    ]
    assert served_after, "the gateway did not serve again after PostgreSQL came back"
    assert any(status == 503 for _, status in readiness), "/readyz never reported the outage"
    assert readiness[-1][1] == 200, readiness[-10:]

    # No key has two effects, and every effect has its receipt (or the key is free again).
    effects = collections.Counter(effect.key for effect in upstream.effects)
    assert max(effects.values()) == 1, effects.most_common(3)
    assert set(effects) <= set(answers)
    settle_deadline = time.monotonic() + 15
    limit = asyncio.Semaphore(20)

    async def settled_state(key: str) -> tuple[str, str]:
        async with limit:
            while True:
                found = await lookup(session, gateway, key)
                if found.status == 404:
                    assert found.problem == "unknown-key", (key, found)
                    return key, "404"
                state = str(found.json["state"])
                if state != "in_flight" or time.monotonic() > settle_deadline:
                    return key, state
                await asyncio.sleep(0.2)

    async with asyncio.timeout(30):
        states = dict(await asyncio.gather(*(settled_state(key) for key in answers)))
    expected = {"completed": 1, "released": 0, "404": 0}
    for key, state in states.items():
        assert state in expected, f"{key} is {state} (effects: {upstream.count_for(key)})"
        assert upstream.count_for(key) == expected[state], (key, state)
