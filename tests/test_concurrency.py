"""Concurrent duplicates, a client that walks away, and idle upstream connections."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from conftest import GatewayFactory
from harness import RunningGateway, effects_for_key
from upstream import CountingUpstream, UpstreamFactory


async def test_100_simultaneous_requests_with_one_key_make_one_effect(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Of 100 concurrent requests with one key, one is forwarded; the rest get 409."""
    responses = await asyncio.gather(
        *(
            gateway.post("/tickets/v1/issues?delay=0.3", key="same", json_body={"n": 1})
            for _ in range(100)
        )
    )
    statuses = Counter(response.status for response in responses)
    assert statuses[201] == 1
    assert statuses[409] == 99
    assert upstream.count == 1


async def test_300_keys_sent_three_times_at_once_make_300_effects(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """900 concurrent requests over 300 keys apply exactly one effect per key."""
    requests = [
        gateway.post("/tickets/v1/issues", key=f"key-{n}", json_body={"n": n})
        for n in range(300)
        for _ in range(3)
    ]
    responses = await asyncio.gather(*requests)
    assert {response.status for response in responses} <= {201, 409}
    assert upstream.count == 300
    counts = [await effects_for_key(upstream, gateway.url, f"key-{n}") for n in range(300)]
    assert counts == [1] * 300
    # Every key now replays, whatever its first three requests saw.
    replays = await asyncio.gather(
        *(
            gateway.post("/tickets/v1/issues", key=f"key-{n}", json_body={"n": n})
            for n in range(300)
        )
    )
    assert all(r.status == 201 and r.headers["Idempotent-Replayed"] == "true" for r in replays)
    assert upstream.count == 300


async def test_client_disconnect_cancels_nothing(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A caller that hangs up mid-call still gets its effect recorded; the retry replays it."""
    call = asyncio.create_task(
        gateway.session.post(
            gateway.url + "/tickets/v1/issues?delay=0.6",
            data=b"{}",
            headers={"Idempotency-Key": "gone", "Content-Type": "application/json"},
        )
    )
    # Hang up only once the effect happened upstream, so the test does not
    # depend on how fast a loaded machine carries the request there.
    await upstream.wait_for_count(1, seconds=60)
    call.cancel()
    with pytest.raises(asyncio.CancelledError):
        await call
    state = await _state_once_settled(gateway, "gone", seconds=60)
    assert state == "completed"
    retry = await gateway.post("/tickets/v1/issues?delay=0.6", key="gone", json_body={})
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1


async def _state_once_settled(gateway: RunningGateway, key: str, *, seconds: float) -> str:
    """The operation's state once it left in_flight, polled for at most ``seconds``."""
    async with asyncio.timeout(seconds):
        while True:
            lookup = await (await gateway.get(f"/operations/{key}")).json()
            if lookup["state"] != "in_flight":
                return str(lookup["state"])
            await asyncio.sleep(0.05)


async def test_upstream_closing_idle_connections_causes_no_unknown(
    gateway_factory: GatewayFactory, upstream_factory: UpstreamFactory
) -> None:
    """An upstream that drops idle keep-alive connections quickly causes no spurious unknown."""
    upstream = await upstream_factory(keepalive_timeout=0.3)
    gateway = await gateway_factory(upstream.url, route={"keepalive": "100ms"})
    for n in range(6):
        response = await gateway.post("/tickets/v1/issues", key=f"idle-{n}", json_body={})
        assert response.status == 201, await response.text()
        await asyncio.sleep(0.35 if n % 2 else 0.05)
    assert upstream.count == 6
    for n in range(6):
        lookup = await (await gateway.get(f"/operations/idle-{n}")).json()
        assert lookup["state"] == "completed"


async def test_dropped_pooled_connection_is_never_resent(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A GET whose pooled connection dies after sending is not retried by the forwarder."""
    assert (await gateway.get("/tickets/v1/warm")).status == 200  # pools a connection
    response = await gateway.get("/tickets/v1/issues?drop=after_effect")
    assert response.status == 502
    assert upstream.count == 2
