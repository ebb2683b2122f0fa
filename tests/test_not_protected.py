"""A key on a method the route does not protect is passed through, never silently.

An agent that sends `PUT` or `DELETE` with an `Idempotency-Key` to a route that
protects only `POST` and `PATCH` believes it is protected. The request is
forwarded without a record (the route says so), but the answer tells the agent:
`Idempotency-Status: not-protected`, and the request log records the outcome.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import GatewayProcess, spawn
from upstream import CountingUpstream

FORGED = "?forge=1"  # the upstream answers with its own gateway headers


@pytest.mark.parametrize("method", ["PUT", "DELETE", "GET"])
async def test_a_key_on_an_unprotected_method_is_answered_not_protected(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, method: str
) -> None:
    gateway = await gateway_factory(upstream.url)
    answer: Any = await gateway.session.request(
        method,
        gateway.url + "/tickets/v1/issues/7" + FORGED,
        headers={"Idempotency-Key": "run-7:0:c1"},
    )
    await answer.read()
    assert answer.status < 500
    assert answer.headers.getall("Idempotency-Status") == ["not-protected"]
    assert "Idempotent-Replayed" not in answer.headers
    assert "Idempotency-Key" not in answer.headers  # no record carries the key
    assert upstream.count == 1
    looked_up = await gateway.get("/operations/run-7%3A0%3Ac1")
    assert looked_up.status == 404  # nothing was recorded


async def test_without_a_key_an_unprotected_method_says_nothing(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    gateway = await gateway_factory(upstream.url)
    answer: Any = await gateway.session.put(gateway.url + "/tickets/v1/issues/7" + FORGED)
    await answer.read()
    assert "Idempotency-Status" not in answer.headers


async def test_the_request_log_records_a_key_that_was_not_protected(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """The access line of a keyed DELETE says `not-protected`."""
    gateway = spawn(processes, tmp_path, upstream.url, logging={"level": "info", "format": "json"})
    async with (
        aiohttp.ClientSession() as session,
        session.delete(
            gateway.url + "/tickets/v1/issues/7", headers={"Idempotency-Key": "k-9"}
        ) as answer,
    ):
        await answer.read()
        request_id = answer.headers["X-Request-Id"]
    gateway.stop()  # the line is written by the time the gateway has stopped
    assert gateway.log_path is not None
    lines = [json.loads(line) for line in gateway.log_path.read_text().splitlines()]
    outcomes = [line.get("outcome") for line in lines if line.get("request_id") == request_id]
    assert outcomes == ["not-protected"], outcomes
