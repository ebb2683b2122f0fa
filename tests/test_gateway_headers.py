"""The gateway's own headers are always the gateway's (security review, finding 14).

`Idempotency-Key`, `Idempotency-Status` and `Idempotent-Replayed` tell an agent
what happened to its effect; an upstream that sends its own copies must never
make a first answer look like a replay, or name another key. Its copies are
dropped from every answer: live, stored and replayed, and passed through.
"""

from __future__ import annotations

from typing import Any

from conftest import GatewayFactory
from upstream import CountingUpstream

FORGED = "?forge=1"


async def test_an_upstream_cannot_forge_a_replay_on_a_live_answer(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A first answer carrying the upstream's `Idempotent-Replayed: true` reaches the
    caller without it, with the gateway's own key and status; the replay is the real one."""
    gateway = await gateway_factory(upstream.url)
    headers = {"Idempotency-Key": "pay-1"}
    first = await gateway.post("/tickets/v1/issues" + FORGED, json_body={"a": 1}, headers=headers)
    assert first.status == 201
    assert "Idempotent-Replayed" not in first.headers
    assert first.headers.getall("Idempotency-Key") == ["pay-1"]
    assert first.headers.getall("Idempotency-Status") == ["completed"]

    replay = await gateway.post("/tickets/v1/issues" + FORGED, json_body={"a": 1}, headers=headers)
    assert replay.headers.getall("Idempotent-Replayed") == ["true"]
    assert replay.headers.getall("Idempotency-Key") == ["pay-1"]
    assert upstream.count == 1


async def test_an_upstream_cannot_name_a_key_on_a_passed_through_answer(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """An unprotected request's answer keeps none of the upstream's gateway headers."""
    gateway = await gateway_factory(upstream.url)
    answer: Any = await gateway.get("/tickets/v1/issues" + FORGED)
    assert answer.status == 200
    for name in ("Idempotency-Key", "Idempotency-Status", "Idempotent-Replayed"):
        assert name not in answer.headers, name
