"""A replay says who made its receipt (issue "The operator's second hour": a probe-made
receipt is 200 where the tool's create answers 201: say so where an agent reads it).

HTTP replays carry `Idempotency-Receipt-Source: upstream | probe | operator`, on the
fast replay path and the full one alike, and both clients expose it.
"""

from __future__ import annotations

from conftest import GatewayFactory
from harness import ADMIN_TOKEN
from idempotency_gateway_client import GatewayClient
from test_cli import DROP, make_unknown, operation_id
from upstream import CountingUpstream

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


async def test_a_replay_names_who_made_its_receipt(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store_url=store_url)
    first = await gateway.post("/tickets/v1/issues", key="made", json_body={"title": "a"})
    assert (first.status, first.headers.get("Idempotency-Receipt-Source")) == (201, None)
    again = await gateway.post("/tickets/v1/issues", key="made", json_body={"title": "a"})
    assert again.headers["Idempotency-Receipt-Source"] == "upstream"

    await make_unknown(gateway, "settled")
    assert gateway.admin_url is not None
    async with gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{await operation_id(gateway, 'settled')}/resolve",
        json={
            "outcome": "applied",
            "note": "found by lookup",
            "response": {"status": 200, "body": "{}"},
        },
        headers=ADMIN,
    ) as resolved:
        assert resolved.status == 200
    retry = await gateway.post(DROP, key="settled", json_body={"title": "settled"})
    assert (retry.status, retry.headers["Idempotency-Receipt-Source"]) == (200, "operator")

    async with GatewayClient(gateway.url) as client:
        read = await client.request("POST", DROP, key="settled", json={"title": "settled"})
        live = await client.request("POST", "/tickets/v1/issues", key="new", json={"title": "n"})
    assert (read.replayed, read.status, read.receipt_source) == (True, 200, "operator")
    assert live.receipt_source is None
    assert upstream.count == 3
