"""Answers too large to keep (issue: "never twice, proven", defect 9).

A response over `max_stored_response` passes through once and its body is not
kept. It is a receipt only if it arrived whole: cut off mid-body, nobody can
say what the upstream meant, so the key is `unknown`, and a retry is never
told the answer was "delivered once". A caller that leaves mid-body cancels
nothing: the answer still runs to its end and is recorded.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
from harness import GatewayProcess, spawn
from upstream import CountingUpstream

PATH = "/tickets/v1/issues"
ROUTE = {"max_stored_response": "1KiB", "timeout": "10s"}


async def lookup(session: aiohttp.ClientSession, gateway: GatewayProcess, key: str) -> Any:
    async with session.get(f"{gateway.url}/operations/{key}") as response:
        assert response.status == 200, await response.text()
        return await response.json()


def post(
    session: aiohttp.ClientSession, gateway: GatewayProcess, key: str, query: str
) -> Any:  # the request context manager
    return session.post(
        f"{gateway.url}{PATH}{query}",
        data=json.dumps({"key": key}).encode(),
        headers={"Idempotency-Key": key, "Content-Type": "application/json"},
    )


async def test_a_large_answer_cut_off_mid_body_is_unknown(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The caller gets the truncated answer; the key turns unknown, and the retry is told
    so (409 outcome-unknown), not "delivered once"."""
    gateway = spawn(processes, tmp_path, upstream.url, route=ROUTE)
    async with aiohttp.ClientSession() as session:
        async with post(session, gateway, "big-cut", "?size=200000&drop=mid_body") as response:
            assert response.status == 201
            assert response.headers["Idempotency-Status"] == "in_flight"
            try:
                await response.read()
            except aiohttp.ClientPayloadError:
                pass  # the body was cut off, as the upstream cut it
            else:
                raise AssertionError("the truncated body arrived whole")

        operation = await lookup(session, gateway, "big-cut")
        assert operation["state"] == "unknown", operation
        async with post(session, gateway, "big-cut", "?size=200000&drop=mid_body") as retry:
            problem = await retry.json(content_type=None)
            assert retry.status == 409
            assert problem["type"].endswith("/outcome-unknown")
    assert upstream.count == 1


async def test_a_large_answer_received_whole_is_a_receipt_without_its_body(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Streamed whole, the answer is recorded completed with its body not kept."""
    gateway = spawn(processes, tmp_path, upstream.url, route=ROUTE)
    async with aiohttp.ClientSession() as session:
        async with post(session, gateway, "big-whole", "?size=200000") as response:
            assert response.status == 201
            assert len(await response.read()) == 200_000

        operation = await lookup(session, gateway, "big-whole")
        assert (operation["state"], operation["body_retained"]) == ("completed", False)
        async with post(session, gateway, "big-whole", "?size=200000") as retry:
            problem = await retry.json(content_type=None)
            assert (retry.status, problem["type"].rsplit("/", 1)[-1]) == (
                409,
                "receipt-not-retained",
            )
    assert upstream.count == 1


async def test_a_caller_that_leaves_mid_body_cancels_nothing(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The caller hangs up after the first bytes of a slow large answer: the gateway reads
    the rest from the upstream and records the receipt, ready for the retry."""
    gateway = spawn(processes, tmp_path, upstream.url, route=ROUTE)
    async with aiohttp.ClientSession() as session:
        response = await post(session, gateway, "big-left", "?size=400000&trickle=0.1")
        assert response.status == 201
        await response.content.readexactly(1024)
        response.close()  # drops the connection mid-body

        async with asyncio.timeout(60):
            while True:  # the rest of the body takes about 0.6 s to arrive
                if (await lookup(session, gateway, "big-left"))["state"] == "completed":
                    break
                await asyncio.sleep(0.1)
    assert upstream.count == 1
