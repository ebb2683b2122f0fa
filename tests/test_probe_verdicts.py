"""A probe's verdict is about one attempt (issue: "never twice, proven", defect 1).

A slow probe asked about attempt 1 must not settle attempt 2, which was sent
after the probe left: its "not applied" says nothing about a request it never
saw. These tests run the gateway as production does (a subprocess on SQLite)
in front of a real upstream whose probe answers are decided when they arrive
and held back until the test releases them, as a slow upstream would.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from harness import ADMIN_ENV, GatewayProcess, calibration_sample, force_release, spawn
from upstream import CountingUpstream, effects_probe

KEY = "pay-42"
PROBE = effects_probe(by="operation_id")
# The timeout (probes' too) is not the subject: a held probe is held for well under it. It
# bounds the window a release waits for (lease, then the whole call, then the grace).
ROUTE = {"forward_key": "operation_id", "probe": PROBE, "timeout": "3s"}
IDEMPOTENCY = {"lease": "1s", "sweep_interval": "60s"}  # no background probes: the test drives


async def post(session: aiohttp.ClientSession, gateway: GatewayProcess) -> tuple[int, Any]:
    async with session.post(
        f"{gateway.url}/tickets/v1/issues",
        data=json.dumps({"amount": 42}).encode(),
        headers={"Idempotency-Key": KEY, "Content-Type": "application/json"},
    ) as response:
        return response.status, await response.json(content_type=None)


async def lookup(session: aiohttp.ClientSession, gateway: GatewayProcess) -> dict[str, Any]:
    async with session.get(f"{gateway.url}/operations/{KEY}") as response:
        assert response.status == 200, await response.text()
        document: dict[str, Any] = await response.json()
        return document


async def unknown_first_attempt(
    session: aiohttp.ClientSession, gateway: GatewayProcess, upstream: CountingUpstream
) -> None:
    """Attempt 1 is dropped before the upstream applies it (the gateway cannot tell): unknown.
    Attempt 2, sent later, is applied and then dropped: unknown too. The probe can be
    calibrated: an operation of the kind completed just before."""
    await calibration_sample(session, gateway.url)  # effect 1
    upstream.script[:] = [{"drop": "before_effect"}, {"drop": "after_effect"}]
    status, problem = await post(session, gateway)
    assert (status, problem["state"]) == (502, "unknown"), problem
    # Past the lease (1 s), the whole call (3 s) and not_applied_after (1 s): probes may judge.
    await asyncio.sleep(5.2)


async def test_a_slow_probe_about_attempt_1_does_not_release_attempt_2(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A probe that left before attempt 2 was sent answers "not applied" after it: the answer
    is kept as evidence, attempt 2 stays unknown, and a retry is not sent a third time."""
    gateway = spawn(processes, tmp_path, upstream.url, route=ROUTE, idempotency=IDEMPOTENCY)
    async with aiohttp.ClientSession() as session:
        await unknown_first_attempt(session, gateway, upstream)
        p1 = asyncio.Event()
        upstream.probe_holds[:] = [p1]  # P1: decided when it arrives (404), answered on p1
        probed = len(upstream.probes)
        slow_lookup = asyncio.create_task(lookup(session, gateway))
        await upstream.wait_for_probes(probed + 1)
        await asyncio.sleep(1.2)  # the prober's backoff for this operation (1 s) runs out

        # The retry probes again (P2, fast: 404), releases attempt 1, sends attempt 2.
        status, problem = await post(session, gateway)
        assert (status, problem["state"]) == (502, "unknown"), problem
        assert upstream.count == 2  # the sample, and attempt 2

        p1.set()
        await slow_lookup  # P1's "not applied" arrives now, about attempt 1
        operation = await lookup(session, gateway)
        assert operation["attempts"] == 2
        assert operation["state"] in ("unknown", "completed"), operation  # never released
        assert any("no longer current" in item["detail"] for item in operation["evidence"])

        status, _ = await post(session, gateway)
        assert status != 502
    assert upstream.count == 2, [effect.number for effect in upstream.effects]


async def test_a_slow_probe_does_not_undo_an_operator_resolution_and_the_next_attempt(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """An operator says not_applied while a probe is out; the retry sends attempt 2; the
    probe's late "not applied" (about attempt 1) changes nothing."""
    gateway = spawn(
        processes, tmp_path, upstream.url, route=ROUTE, idempotency=IDEMPOTENCY, env=ADMIN_ENV
    )
    async with aiohttp.ClientSession() as session:
        await unknown_first_attempt(session, gateway, upstream)
        p1 = asyncio.Event()
        upstream.probe_holds[:] = [p1]  # P1: decided when it arrives (404), answered on p1
        probed = len(upstream.probes)
        slow_lookup = asyncio.create_task(lookup(session, gateway))
        await upstream.wait_for_probes(probed + 1)  # P1 has left

        await force_release(session, gateway, KEY, note="not in the ledger")
        status, problem = await post(session, gateway)  # attempt 2: applied, then dropped
        assert (status, problem["state"]) == (502, "unknown"), problem

        p1.set()
        await slow_lookup
        operation = await lookup(session, gateway)
        assert operation["attempts"] == 2
        assert operation["state"] in ("unknown", "completed"), operation

        status, _ = await post(session, gateway)
        assert status != 502
    assert upstream.count == 2, [effect.number for effect in upstream.effects]
