"""A release waits for the whole call, and for the clock that judges it (third round).

The reviews found two ways a key was released while its first send could still
land. A gateway paused past its lease (a VM pause, a GC stall, a store
failover) had its lease lapse; the probe's grace then counted from that lapse,
although the route's timeout let the tool apply the send far later: the probe
released the key, the retry was sent, two effects, and the first attempt's
real answer was thrown away as a stale write. And on MCP routes a person's
release was judged against the route's `timeout`, a silence limit, when
`max_call` is what bounds a call. A third: the store's clock stepping back by
an hour for less than the two seconds between periodic witnesses, during a
claim, went unseen, and a probe counted an hour of grace that never passed.

Each runs the gateway as production does (a subprocess on SQLite) in front of a
real upstream that counts effects.
"""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from harness import (
    ADMIN_ENV,
    ADMIN_TOKEN,
    GatewayProcess,
    SteppedClock,
    calibration_sample,
    spawn,
)
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client
from upstream import CountingUpstream, effects_probe

LIMIT = 60.0
"""Seconds before a wait is taken for a hang: only a broken gateway comes near it."""
KEY = "pay-7"
BODY = json.dumps({"amount": 7}).encode()


async def post(
    session: aiohttp.ClientSession, gateway: GatewayProcess, query: str = ""
) -> tuple[int, Any]:
    async with session.post(
        f"{gateway.url}/tickets/v1/issues{query}",
        data=BODY,
        headers={"Idempotency-Key": KEY, "Content-Type": "application/json"},
    ) as response:
        return response.status, await response.json(content_type=None)


async def lookup(session: aiohttp.ClientSession, gateway: GatewayProcess) -> dict[str, Any]:
    async with session.get(f"{gateway.url}/operations/{quote(KEY, safe='')}") as response:
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
        return document


async def admin(
    session: aiohttp.ClientSession, gateway: GatewayProcess, path: str, body: Any = None
) -> tuple[int, Any]:
    assert gateway.admin_url is not None
    async with session.post(
        gateway.admin_url + path, json=body, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}
    ) as response:
        return response.status, await response.json(content_type=None)


async def until_state(
    session: aiohttp.ClientSession, gateway: GatewayProcess, want: str
) -> dict[str, Any]:
    async with asyncio.timeout(LIMIT):
        document = await lookup(session, gateway)
        while document["state"] != want:
            await asyncio.sleep(0.1)
            document = await lookup(session, gateway)
    return document


async def test_a_paused_gateway_never_releases_a_call_that_is_still_running(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The report's pause: route timeout 40 s, lease 1 s, probe grace 1 s, a tool still
    holding the call, the gateway stopped (SIGSTOP) past its lease. Its lease lapses and
    the record says so, but the probe's "not found" is too soon until the whole call could
    have ended: the retry is refused, never sent. When the tool answers, the paused
    holder's real 201 is the receipt (its send and answer in the history); one effect."""
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        env=ADMIN_ENV,
        route={"timeout": "40s", "probe": effects_probe(not_applied_after="1s")},
        idempotency={"lease": "1s", "sweep_interval": "200ms"},
    )
    async with aiohttp.ClientSession() as session:
        await calibration_sample(session, gateway.url)  # effect 1: the probe can see
        first = asyncio.create_task(post(session, gateway, "?hold=1"))
        await upstream.wait_for_held(1, seconds=LIMIT)  # on the wire, held by the tool
        gateway.kill(signal.SIGSTOP)
        await asyncio.sleep(2.5)  # past the lease (1 s) and its grace (1 s)
        gateway.kill(signal.SIGCONT)

        lapsed = await until_state(session, gateway, "unknown")
        assert any("lease" in event["type"] for event in lapsed["history"]), lapsed["history"]
        status, probed = await admin(session, gateway, f"/admin/operations/{lapsed['id']}/probe")
        assert (status, probed["state"]) == (200, "unknown"), probed
        too_soon = [e for e in probed["history"] if e["type"] == "probe"][-1]
        assert too_soon["verdict"] == "not_applied_too_soon", too_soon
        assert "timeout" in too_soon["detail"]
        status, refused = await post(session, gateway, "?hold=1")
        assert status == 409, refused
        assert upstream.count == 1  # the sample only: the held call has not applied yet

        upstream.release_held()  # the tool applies the first send and answers 201
        answered, _ = await first
        assert answered == 201
        settled = await until_state(session, gateway, "completed")
        assert settled["resolution"]["by"] == "upstream"
        attempt = [e for e in settled["history"] if e.get("attempt") == 1]
        assert [e["type"] for e in attempt if e["type"] in ("sent", "answered")] == [
            "sent",
            "answered",
        ]
        status, _ = await post(session, gateway, "?hold=1")
        assert status == 201  # the receipt, replayed
    assert upstream.count == 2  # the sample and the one effect of the key


async def test_a_stale_holders_answer_after_a_forced_release_completes_it_and_alerts(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """An admin forced the release of a paused holder's call (no retry came yet); its late
    201 proves the effect happened: the operation is completed by the upstream's answer,
    a retry replays it, and the late answer is counted (`late_answers`)."""
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        env=ADMIN_ENV,
        route={"timeout": "40s"},
        idempotency={"lease": "1s", "sweep_interval": "200ms"},
    )
    async with aiohttp.ClientSession() as session:
        first = asyncio.create_task(post(session, gateway, "?hold=1"))
        await upstream.wait_for_held(1, seconds=LIMIT)
        gateway.kill(signal.SIGSTOP)
        await asyncio.sleep(1.5)  # past the lease
        gateway.kill(signal.SIGCONT)
        lapsed = await until_state(session, gateway, "unknown")
        status, released = await admin(
            session,
            gateway,
            f"/admin/operations/{lapsed['id']}/resolve",
            {"outcome": "not_applied", "force": True, "note": "the ledger shows nothing"},
        )
        assert (status, released["state"]) == (200, "released"), released

        upstream.release_held()
        answered, _ = await first
        assert answered == 201
        settled = await until_state(session, gateway, "completed")
        assert settled["resolution"]["by"] == "upstream"
        status, _ = await post(session, gateway, "?hold=1")
        assert status == 201  # a replay: never sent again
        async with session.get(gateway.url + "/metrics") as metrics:
            text = await metrics.text()
        assert (
            'idempotency_gateway_late_answers_total{outcome="completed_released",'
            'route="tickets"} 1.0' in text
        )
    assert upstream.count == 1


@pytest.mark.slow
async def test_a_short_backward_step_during_a_claim_does_not_release_it(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The host's clock (SQLite's: the store's) steps back an hour while a claim is made and
    comes back before the next periodic witness. The claim's own reading is a witness:
    the step is seen, the probe's "not found" counts from it, not from an hour before, the
    retry is refused while the tool may still apply the first send; one effect."""
    clock = SteppedClock(tmp_path / "clock")
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        env=clock.env,
        route={"timeout": "1s", "probe": effects_probe(not_applied_after="2s")},
        idempotency={"lease": "2s", "sweep_interval": "1h"},
    )
    async with aiohttp.ClientSession() as session:
        await calibration_sample(session, gateway.url)  # effect 1
        # Up long enough that the process's own start vouches for more than the window.
        await asyncio.sleep(6.0)
        clock.step(-3600.0)
        first = asyncio.create_task(post(session, gateway, "?hold=1"))
        await upstream.wait_for_held(1, seconds=LIMIT)  # claimed during the step
        clock.step(3600.0)  # back, well within the 2 s between periodic witnesses
        status, problem = await first
        assert status == 504, problem

        operation = await lookup(session, gateway)  # probes: 404, the tool holds it
        assert operation["state"] == "unknown", operation
        status, refused = await post(session, gateway, "?hold=1")
        assert status == 409, refused

        upstream.release_held()
        await upstream.wait_for_count(2, seconds=LIMIT)
        settled = await until_state(session, gateway, "completed")
        assert settled["resolution"]["by"] == "probe"
    assert upstream.held == 1, "the retry was sent while the first send could still land"
    assert upstream.count == 2


MCP_PREFIX = "/tools"


async def test_an_mcp_release_waits_for_max_call_not_the_silence_limit(
    processes: list[GatewayProcess], tmp_path: Path
) -> None:
    """On an MCP route `timeout` is the longest silence, `max_call` the longest call: a
    person's `not_applied` is `too-early` until max_call (and the grace) passed since the
    send, however long the silence limit has been over."""
    async with CountingMcpServer() as server:
        gateway = spawn(
            processes,
            tmp_path,
            server.url,
            env=ADMIN_ENV,
            route={
                "name": "tools",
                "prefix": MCP_PREFIX,
                "kind": "mcp",
                "timeout": "1s",
                "max_call": "1h",
                "not_applied_after": "1s",
            },
            idempotency={"lease": "1s"},
        )
        async with asyncio.timeout(LIMIT), mcp_client(gateway.url + MCP_PREFIX) as client:
            await call_with_key(client, "lose_connection", {"title": "Printer"}, "mcp-1")
        await asyncio.sleep(3.2)  # the silence limit, the lease and the grace: all over
        async with aiohttp.ClientSession() as session:
            async with session.get(f"{gateway.url}/operations/mcp-1") as found:
                operation = await found.json()
            assert operation["state"] == "unknown", operation
            status, refused = await admin(
                session,
                gateway,
                f"/admin/operations/{operation['id']}/resolve",
                {"outcome": "not_applied", "note": "not in the ticket system"},
            )
        assert status == 409, refused
        assert refused["type"].endswith("/too-early")
        assert "allowed_at" in refused
        assert server.count == 1


async def test_a_deferred_release_is_probed_again_when_it_becomes_allowed(
    gateway_factory: Any, upstream: CountingUpstream
) -> None:
    """A probe's "not found" that came too soon schedules one probe at the instant the
    release becomes allowed: the key is released then, with no lookup, retry or sweep
    to ask again (the sweep runs hourly here)."""
    from gateway.web.appkeys import STORE

    gateway = await gateway_factory(
        upstream.url,
        route={"timeout": "1s", "probe": effects_probe(not_applied_after="500ms")},
        idempotency={"lease": "1s", "sweep_interval": "1h"},
    )
    await calibration_sample(gateway.session, gateway.url)
    lost = await gateway.post("/tickets/v1/issues?drop=before_effect", key="d-1", json_body={})
    assert lost.status == 502
    async with gateway.session.get(f"{gateway.url}/operations/d-1") as found:
        operation = await found.json()  # the lookup probes: 404, too soon
    assert operation["state"] == "unknown"
    assert [event["verdict"] for event in operation["history"] if event["type"] == "probe"] == [
        "not_applied_too_soon"
    ]
    store = gateway.app[STORE]
    async with asyncio.timeout(LIMIT):  # reads of the store: none of them probes
        current = await store.get("anonymous", "d-1")
        while current is not None and current.state.value == "unknown":
            await asyncio.sleep(0.1)
            current = await store.get("anonymous", "d-1")
    assert current is not None
    assert current.state.value == "released"
    assert current.resolution is not None
    assert current.resolution.by == "probe"
