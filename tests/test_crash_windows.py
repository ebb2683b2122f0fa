"""The crash table: a gateway killed (or frozen) in each window of a request's life.

Each test runs `python -m gateway serve` as production does, arms a test-only
fault (or kills the process by hand), restarts a new process without the fault
on the same SQLite file, then retries and looks the key up. What must hold in
every window: never a second effect for a key, `unknown` whenever the effect
may have happened, and no retry forwarded while a key is `unknown`.
"""

from __future__ import annotations

import asyncio
import json
import signal
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from harness import GatewayProcess, calibration_sample, effects_for_key, spawn, wait_until_stopped
from multidict import CIMultiDictProxy
from upstream import CountingUpstream, effects_probe

pytestmark = pytest.mark.slow

ISSUES = "/tickets/v1/issues"


def body_for(key: str) -> bytes:
    """The request of one key: each key means its own effect, so each has its own body
    (the same body under two keys is refused as the same request while one is unsettled)."""
    return json.dumps({"title": "crash", "for": key}).encode()


REQUEST_SECONDS = 60.0
"""Upper bound for any one client call: only a hung call takes it (no upstream answer in this
file is slow by a delay; the held ones are released by the test)."""
EVENT_SECONDS = 60.0
"""Upper bound for waiting on a state or an effect that must come: generous, since on a loaded
machine a restarted gateway and its first probes can take seconds."""

PROBE = effects_probe()
FAST_LEASE = {"lease": "1s"}


@dataclass(frozen=True)
class Answer:
    """A gateway response, read whole."""

    status: int
    headers: CIMultiDictProxy[str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)

    @property
    def problem_type(self) -> str:
        """The last path segment of the problem's `type` URI."""
        return str(self.json()["type"]).rsplit("/", 1)[-1]


async def send(session: aiohttp.ClientSession, url: str, key: str, query: str = "") -> Answer:
    async with (
        asyncio.timeout(REQUEST_SECONDS),
        session.post(
            f"{url}{ISSUES}{query}",
            data=body_for(key),
            headers={"Idempotency-Key": key, "Content-Type": "application/json"},
        ) as response,
    ):
        return Answer(response.status, response.headers, await response.read())


async def dropped(session: aiohttp.ClientSession, url: str, key: str, query: str = "") -> None:
    """Send a request that the gateway dies on: the client sees the connection drop."""
    with pytest.raises(aiohttp.ClientConnectionError):
        await send(session, url, key, query)


async def lookup(session: aiohttp.ClientSession, url: str, key: str) -> Answer:
    async with (
        asyncio.timeout(REQUEST_SECONDS),
        session.get(f"{url}/operations/{quote(key, safe='')}") as response,
    ):
        return Answer(response.status, response.headers, await response.read())


async def state_of(session: aiohttp.ClientSession, url: str, key: str) -> dict[str, Any]:
    found = await lookup(session, url, key)
    assert found.status == 200, found.body
    document: dict[str, Any] = found.json()
    return document


async def poll_state(
    session: aiohttp.ClientSession, url: str, key: str, want: str, *, seconds: float
) -> dict[str, Any]:
    """Look the key up every 100 ms (each lookup may probe) until it reaches `want`."""
    document: dict[str, Any] = {}
    try:
        async with asyncio.timeout(seconds):
            while document.get("state") != want:
                await asyncio.sleep(0.1)
                document = await state_of(session, url, key)
    except TimeoutError:
        pytest.fail(f"{key} did not become {want} within {seconds} s: {document}")
    return document


def _seconds(timestamp: str) -> float:
    """An operation document's RFC 3339 time as POSIX seconds."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def assert_outcome_unknown(answer: Answer) -> None:
    assert answer.status == 409, answer.body
    assert answer.problem_type == "outcome-unknown"
    assert answer.json()["safe_to_retry"] is False
    assert answer.headers["Idempotency-Status"] == "unknown"


def restart(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream, **options: Any
) -> GatewayProcess:
    """A new gateway process, without any fault, on the dead one's database."""
    return spawn(processes, tmp_path, upstream.url, **options)


async def test_crash_before_claim_records_nothing_and_the_retry_is_forwarded(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A gateway that dies before the claim leaves no record, so the retry is forwarded once."""
    first = spawn(processes, tmp_path, upstream.url, fault="crash_before_claim")
    async with aiohttp.ClientSession() as session:
        await dropped(session, first.url, "before-claim")
        assert upstream.count == 0

        second = restart(processes, tmp_path, upstream)
        missing = await lookup(session, second.url, "before-claim")
        assert missing.status == 404
        assert missing.problem_type == "unknown-key"

        retry = await send(session, second.url, "before-claim")
        assert retry.status == 201
        assert "Idempotent-Replayed" not in retry.headers
        assert (await state_of(session, second.url, "before-claim"))["state"] == "completed"
    assert upstream.count == 1
    assert await effects_for_key(upstream, second.url, "before-claim") == 1


async def test_crash_after_claim_is_unknown_without_a_probe(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A claim left by a dead process is unknown after restart and stays refused without a probe."""
    first = spawn(processes, tmp_path, upstream.url, fault="crash_after_claim")
    async with aiohttp.ClientSession() as session:
        await dropped(session, first.url, "after-claim")

        second = restart(processes, tmp_path, upstream)
        operation = await state_of(session, second.url, "after-claim")
        assert operation["state"] == "unknown"
        assert operation["safe_to_retry"] is False
        assert any(item["source"] == "lease" for item in operation["evidence"])

        assert_outcome_unknown(await send(session, second.url, "after-claim"))
        assert_outcome_unknown(await send(session, second.url, "after-claim"))
        assert (await state_of(session, second.url, "after-claim"))["state"] == "unknown"
    assert upstream.count == 0
    assert upstream.probes == []


async def test_crash_after_claim_is_kept_unknown_by_a_too_early_not_applied_probe(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A probe's 404 less than not_applied_after after the claim's lease is evidence only:
    the claim stays unknown and the retry is refused, not sent."""
    probe = effects_probe(not_applied_after="10m")  # a grace no run of this test outlasts
    options: dict[str, Any] = {"route": {"probe": probe}, "idempotency": FAST_LEASE}
    first = spawn(processes, tmp_path, upstream.url, fault="crash_after_claim", **options)
    async with aiohttp.ClientSession() as session:
        await dropped(session, first.url, "claim-early")

        second = restart(processes, tmp_path, upstream, **options)
        operation = await state_of(session, second.url, "claim-early")  # probes: 404
        assert operation["state"] == "unknown"
        assert any(
            item["source"] == "probe" and item["status"] == 404 for item in operation["evidence"]
        ), operation
        assert_outcome_unknown(await send(session, second.url, "claim-early"))
        assert (await state_of(session, second.url, "claim-early"))["state"] == "unknown"
    assert upstream.count == 0
    assert upstream.probes


async def test_crash_after_claim_is_released_by_a_late_enough_not_applied_probe(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """An unknown claim is released only once the probe's 404 is older than not_applied_after."""
    options: dict[str, Any] = {
        "route": {"probe": PROBE, "timeout": "1s"},
        "idempotency": FAST_LEASE,
    }
    first = spawn(processes, tmp_path, upstream.url, fault="crash_after_claim", **options)
    async with aiohttp.ClientSession() as session:
        await dropped(session, first.url, "claim-probe")

        # Released by the probe once the grace (1 s) has passed since the dead claim's lease
        # ran out and its whole call (timeout 1 s) could have ended: however long the
        # restart took, and however the new process counts it. Something of its kind
        # completed meanwhile, so the probe is calibrated.
        second = restart(processes, tmp_path, upstream, **options)
        await calibration_sample(session, second.url)
        released = await poll_state(
            session, second.url, "claim-probe", "released", seconds=EVENT_SECONDS
        )
        # A 404 released it (no effect arrived); whether an earlier probe's 404, too soon,
        # was kept as evidence first depends on how soon the new process looked.
        assert released["resolution"]["by"] == "probe"
        assert upstream.probes
        # On the store's clock, the one the verdict is judged on: never before the grace.
        assert (
            _seconds(released["resolution"]["at"]) >= _seconds(released["lease_expires_at"]) + 1.0
        ), released
        assert upstream.count == 1  # the calibration sample

        retry = await send(session, second.url, "claim-probe")
        assert retry.status == 201
        assert "Idempotent-Replayed" not in retry.headers
        completed = await state_of(session, second.url, "claim-probe")
        assert completed["state"] == "completed"
        assert completed["attempts"] == 2
    assert upstream.count == 2
    assert await effects_for_key(upstream, second.url, "claim-probe") == 1


async def _die_after_the_effect(
    processes: list[GatewayProcess],
    tmp_path: Path,
    upstream: CountingUpstream,
    session: aiohttp.ClientSession,
    key: str,
    window: str,
    options: dict[str, Any],
) -> str:
    """Kill a gateway in `window` once the upstream applied the effect; the query to retry with."""
    if window == "on_the_wire":
        # No fault: the upstream applies the effect and holds its answer; kill in between.
        query = "?hold_answer=1"
        first = spawn(processes, tmp_path, upstream.url, **options)
        request = asyncio.create_task(dropped(session, first.url, key, query))
        await upstream.wait_for_count(1, seconds=EVENT_SECONDS)
        first.kill(signal.SIGKILL)
        await request
    else:
        query = ""
        first = spawn(processes, tmp_path, upstream.url, fault=f"crash_{window}", **options)
        await dropped(session, first.url, key)
    assert upstream.count == 1  # the gateway is dead: the one request is this key's
    return query


AFTER_EFFECT_WINDOWS = pytest.mark.parametrize(
    "window", ["on_the_wire", "after_send", "after_response"]
)


@AFTER_EFFECT_WINDOWS
async def test_crash_after_the_effect_is_unknown_and_never_resent(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream, window: str
) -> None:
    """A gateway that dies after sending, before the receipt, leaves `unknown`: no second send."""
    key = f"effect-{window}"
    async with aiohttp.ClientSession() as session:
        query = await _die_after_the_effect(processes, tmp_path, upstream, session, key, window, {})

        second = restart(processes, tmp_path, upstream)
        operation = await state_of(session, second.url, key)
        assert operation["state"] == "unknown"
        assert operation["response"] is None
        assert_outcome_unknown(await send(session, second.url, key, query))
        assert (await state_of(session, second.url, key))["state"] == "unknown"
    assert upstream.count == 1
    assert await effects_for_key(upstream, second.url, key) == 1


@AFTER_EFFECT_WINDOWS
async def test_crash_after_the_effect_is_settled_by_an_applied_probe(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream, window: str
) -> None:
    """A probe that finds the effect completes the operation; the retry is replayed, not resent."""
    key = f"probed-{window}"
    options: dict[str, Any] = {"route": {"probe": PROBE}}
    async with aiohttp.ClientSession() as session:
        query = await _die_after_the_effect(
            processes, tmp_path, upstream, session, key, window, options
        )

        second = restart(processes, tmp_path, upstream, **options)
        operation = await poll_state(session, second.url, key, "completed", seconds=EVENT_SECONDS)
        assert operation["resolution"]["by"] == "probe"
        assert operation["response"]["status"] == 200
        assert upstream.probes

        retry = await send(session, second.url, key, query)
        assert retry.status == 200
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert retry.headers["X-Effect-Id"] == "1"
        assert retry.json()["key"] == operation["id"]  # the effect the probe found
    assert upstream.count == 1
    assert await effects_for_key(upstream, second.url, key) == 1


async def test_crash_after_the_receipt_is_replayed_after_restart(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A receipt written just before the crash is replayed, though the caller never saw it."""
    first = spawn(processes, tmp_path, upstream.url, fault="crash_after_receipt")
    async with aiohttp.ClientSession() as session:
        await dropped(session, first.url, "after-receipt")

        second = restart(processes, tmp_path, upstream)
        operation = await state_of(session, second.url, "after-receipt")
        assert operation["state"] == "completed"
        assert operation["resolution"]["by"] == "upstream"

        retry = await send(session, second.url, "after-receipt")
        assert retry.status == 201
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert retry.headers["X-Effect-Id"] == "1"
    assert upstream.count == 1
    assert await effects_for_key(upstream, second.url, "after-receipt") == 1


async def test_kill_9_during_a_storm_of_in_flight_keys_never_doubles_an_effect(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """50 keys in flight at a kill -9 all come back `unknown`, and their retries all get 409."""
    keys = [f"storm-{i}" for i in range(50)]
    first = spawn(processes, tmp_path, upstream.url)
    async with aiohttp.ClientSession() as session:
        # Each effect is applied and its answer held: however long the 50 take to arrive,
        # none is answered before the kill.
        requests = [
            asyncio.create_task(dropped(session, first.url, key, "?hold_answer=1")) for key in keys
        ]
        await upstream.wait_for_count(len(keys), seconds=EVENT_SECONDS)
        first.kill(signal.SIGKILL)
        await asyncio.gather(*requests)

        second = restart(processes, tmp_path, upstream)
        retries = await asyncio.gather(
            *(send(session, second.url, k, "?hold_answer=1") for k in keys)
        )
        for retry in retries:
            assert_outcome_unknown(retry)
        operations = await asyncio.gather(*(state_of(session, second.url, k) for k in keys))
        assert [operation["state"] for operation in operations] == ["unknown"] * len(keys)
    assert upstream.count == len(keys)
    counts = {key: await effects_for_key(upstream, second.url, key) for key in keys}
    assert counts == dict.fromkeys(keys, 1)


async def test_a_late_answer_after_a_pause_is_the_receipt_while_its_attempt_is_current(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """An answer arriving after the sweeper expired the frozen holder's lease (unknown, same
    token) is recorded as the receipt, and the retry replays it: nobody settled it first."""
    process = spawn(
        processes,
        tmp_path,
        upstream.url,
        route={"timeout": "10m"},  # the answer comes when the test releases it
        idempotency={"lease": "1s", "sweep_interval": "200ms"},
    )
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(send(session, process.url, "late-writer", "?hold_answer=1"))
        await upstream.wait_for_count(1, seconds=EVENT_SECONDS)
        process.kill(signal.SIGSTOP)
        await asyncio.sleep(2.5)  # past the 1 s lease: no renewal, the sweeper acts on resume
        process.kill(signal.SIGCONT)
        await poll_state(session, process.url, "late-writer", "unknown", seconds=EVENT_SECONDS)
        upstream.release_answers()  # the answer arrives after the sweeper's, never before

        late = await request
        assert late.status == 201  # the effect happened: the caller gets its answer

        operation = await state_of(session, process.url, "late-writer")
        assert operation["state"] == "completed"
        assert operation["response"]["status"] == 201
        assert any(item["source"] == "lease" for item in operation["evidence"])

        replay = await send(session, process.url, "late-writer", "?hold_answer=1")
        assert replay.status == 201
        assert replay.headers["Idempotent-Replayed"] == "true"
        assert replay.body == late.body
    assert upstream.count == 1
    assert await effects_for_key(upstream, process.url, "late-writer") == 1
    assert late.headers["Idempotency-Status"] == "completed"


async def test_a_late_answer_fills_an_applied_resolution_that_has_no_receipt(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Once the owner settled the lapsed attempt applied without a receipt, its holder's
    late answer becomes that receipt (the resolution stays the owner's), the history shows
    the attempt's send and answer, and a retry replays it."""
    process = spawn(
        processes,
        tmp_path,
        upstream.url,
        route={"timeout": "10m"},  # the answer comes when the test releases it
        idempotency={"lease": "1s", "sweep_interval": "200ms"},
    )
    async with aiohttp.ClientSession() as session:
        request = asyncio.create_task(send(session, process.url, "late-writer", "?hold_answer=1"))
        await upstream.wait_for_count(1, seconds=EVENT_SECONDS)
        process.kill(signal.SIGSTOP)
        await asyncio.sleep(1.5)  # past the 1 s lease
        process.kill(signal.SIGCONT)
        await poll_state(session, process.url, "late-writer", "unknown", seconds=EVENT_SECONDS)
        resolved = await session.post(
            f"{process.url}/operations/late-writer/resolve",
            json={"outcome": "applied", "note": "seen in the ticket system"},
        )
        assert resolved.status == 200, await resolved.text()
        upstream.release_answers()  # the answer arrives after the resolution, never before

        late = await request
        assert late.status == 201  # the effect happened: the caller still gets its answer
        assert late.headers["Idempotency-Status"] == "completed"

        operation = await state_of(session, process.url, "late-writer")
        assert operation["state"] == "completed"
        assert operation["resolution"]["by"] == "owner"
        assert operation["response"]["status"] == 201  # the upstream's own answer, attached
        types = [event["type"] for event in operation["history"]]
        assert types[-3:] == ["resolved", "sent", "answered"], types
        replay = await send(session, process.url, "late-writer", "?hold_answer=1")
        assert replay.status == 201
        assert replay.headers.get("Idempotent-Replayed") == "true"
        assert replay.body == late.body
    assert upstream.count == 1


async def test_a_holder_paused_between_claim_and_send_does_not_send(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A holder frozen past its lease after the claim sends nothing and answers lease-lost."""
    options: dict[str, Any] = {"idempotency": {"lease": "1s", "sweep_interval": "60s"}}
    first = spawn(processes, tmp_path, upstream.url, fault="pause_after_claim", **options)
    async with aiohttp.ClientSession() as session:
        started = time.monotonic()
        request = asyncio.create_task(send(session, first.url, "paused-holder"))
        await wait_until_stopped(first)
        await asyncio.sleep(max(0.0, started + 2.0 - time.monotonic()))
        first.kill(signal.SIGCONT)

        refused = await request
        assert refused.status == 503, refused.body
        assert refused.problem_type == "lease-lost"
        assert refused.json()["safe_to_retry"] is True
        assert refused.headers["Idempotency-Status"] == "released"
        assert upstream.count == 0

        operation = await state_of(session, first.url, "paused-holder")
        assert operation["state"] == "released"
        assert operation["safe_to_retry"] is True

        # The fault is armed for every request of that process: retry through a clean one.
        first.stop()
        second = restart(processes, tmp_path, upstream, **options)
        retry = await send(session, second.url, "paused-holder")
        assert retry.status == 201
        assert "Idempotent-Replayed" not in retry.headers
        completed = await state_of(session, second.url, "paused-holder")
        assert completed["state"] == "completed"
        assert completed["attempts"] == 2
    assert upstream.count == 1
    assert await effects_for_key(upstream, second.url, "paused-holder") == 1
