"""Per-scope quotas, slow request bodies, erasure, and the separate admin listener."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, assert_names_the_key
from upstream import CountingUpstream

PROBLEM = "application/problem+json"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


def kind(document: dict[str, Any]) -> str:
    return str(document["type"]).rsplit("/", 1)[-1]


async def test_new_keys_per_minute_is_enforced_per_scope(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Past its new-key rate a scope gets 429 quota-exceeded (naming the key); replays and
    other scopes pass."""
    gateway = await gateway_factory(upstream.url, quotas={"new_keys_per_minute": 3})
    alice = {"Authorization": "Bearer alice"}
    for n in range(3):
        response = await gateway.post(
            "/tickets/v1/issues", key=f"q{n}", json_body={}, headers=alice
        )
        assert response.status == 201
    refused = await gateway.post("/tickets/v1/issues", key="q3", json_body={}, headers=alice)
    assert refused.status == 429
    document = await refused.json(content_type=PROBLEM)
    assert kind(document) == "quota-exceeded"
    assert document["safe_to_retry"] is True
    assert int(refused.headers["Retry-After"]) >= 1
    assert_names_the_key(refused.headers, document, "q3")
    assert (await gateway.get("/operations/q3", headers=alice)).status == 404
    replay = await gateway.post("/tickets/v1/issues", key="q0", json_body={}, headers=alice)
    assert replay.headers["Idempotent-Replayed"] == "true"
    bob = await gateway.post(
        "/tickets/v1/issues", key="q3", json_body={}, headers={"Authorization": "Bearer bob"}
    )
    assert bob.status == 201
    assert upstream.count == 4


async def test_max_operations_caps_the_records_a_scope_keeps(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A scope holding max_operations records cannot start another key."""
    gateway = await gateway_factory(upstream.url, quotas={"max_operations": 2})
    for n in range(2):
        assert (await gateway.post("/tickets/v1/issues", key=f"m{n}", json_body={})).status == 201
    refused = await gateway.post("/tickets/v1/issues", key="m2", json_body={})
    assert refused.status == 429
    assert kind(await refused.json(content_type=PROBLEM)) == "quota-exceeded"
    assert upstream.count == 2


async def test_max_in_flight_refuses_a_scopes_extra_concurrent_request(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A scope at max_in_flight gets 429 for another concurrent request, nothing recorded."""
    gateway = await gateway_factory(upstream.url, quotas={"max_in_flight": 1})
    slow = asyncio.create_task(gateway.post("/tickets/v1/issues?delay=0.5", key="f1", json_body={}))
    await upstream.wait_for_count(1)
    refused = await gateway.post("/tickets/v1/issues", key="f2", json_body={})
    assert refused.status == 429
    assert (await gateway.get("/operations/f2")).status == 404
    assert (await slow).status == 201
    assert (await gateway.post("/tickets/v1/issues", key="f2", json_body={})).status == 201
    assert upstream.count == 2


async def test_a_body_that_never_finishes_is_408_and_never_forwarded(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A caller that stalls mid-body gets 408 request-timeout, naming the key; nothing is
    recorded or sent."""
    gateway = await gateway_factory(upstream.url, server={"client_timeout": "300ms"})
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /tickets/v1/issues HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow\r\n"
        b'Content-Length: 100\r\nContent-Type: application/json\r\n\r\n{"partial": '
    )
    await writer.drain()
    status_line = await asyncio.wait_for(reader.readline(), 5)
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    headers = dict(line.split(": ", 1) for line in head.decode().strip().split("\r\n"))
    body = await asyncio.wait_for(reader.readexactly(int(headers["Content-Length"])), 5)
    writer.close()
    assert b" 408 " in status_line
    assert_names_the_key(headers, json.loads(body), "slow")
    assert (await gateway.get("/operations/slow")).status == 404
    assert upstream.count == 0


async def test_redaction_erases_the_receipt_and_keeps_the_key_used(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """An operator erases a receipt's body; the key stays used and the audit entry remains."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN})
    await gateway.post("/tickets/v1/issues", key="pii", json_body={"email": "a@example.com"})
    lookup = await (await gateway.get("/operations/pii")).json()
    url = f"{gateway.admin_url}/admin/operations/{lookup['id']}/redact"
    assert (await gateway.session.post(url, json={"reason": "x"})).status == 401
    bad = await gateway.session.post(url, json={}, headers=ADMIN)
    assert bad.status == 400
    response = await gateway.session.post(url, json={"reason": "GDPR request #12"}, headers=ADMIN)
    assert response.status == 200
    document = await response.json()
    assert document["response"] is None
    assert document["state"] == "completed"
    assert any(item["source"] == "redaction" for item in document["evidence"])
    redacted = document["history"][-1]
    assert (redacted["type"], redacted["reason"]) == ("redacted", "GDPR request #12")
    retry = await gateway.post(
        "/tickets/v1/issues", key="pii", json_body={"email": "a@example.com"}
    )
    assert retry.status == 409
    problem = await retry.json(content_type=PROBLEM)
    assert kind(problem) == "receipt-not-retained"
    assert "erased" in problem["detail"]
    again = await gateway.session.post(url, json={"reason": "twice"}, headers=ADMIN)
    assert again.status == 200  # idempotent: still erased, a second audit entry
    assert upstream.count == 1


async def test_admin_endpoints_live_only_on_the_admin_listener(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """/admin answers on [admin] host:port and 404 on the main listener, and vice versa."""
    gateway = await gateway_factory(
        upstream.url, admin={"token": ADMIN_TOKEN, "host": "127.0.0.1", "port": 0}
    )
    assert gateway.admin_url is not None
    assert gateway.admin_url != gateway.url
    main = await gateway.get("/admin/operations", headers=ADMIN)
    assert main.status == 404
    async with aiohttp.ClientSession() as session:
        admin = await session.get(gateway.admin_url + "/admin/operations", headers=ADMIN)
        assert admin.status == 200
        proxied = await session.post(
            gateway.admin_url + "/tickets/v1/issues",
            data=b"{}",
            headers={"Idempotency-Key": "a1"},
        )
        assert proxied.status == 404
        assert (await session.get(gateway.admin_url + "/healthz")).status == 200
    assert upstream.count == 0


async def test_a_waiting_duplicate_does_not_hold_an_upstream_slot(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A retry waiting with Prefer: wait leaves the route's slot to new requests."""
    gateway = await gateway_factory(upstream.url, route={"max_concurrency": 2})
    first = asyncio.create_task(gateway.post("/tickets/v1/issues?delay=1", key="w1", json_body={}))
    await upstream.wait_for_count(1)
    waiting = asyncio.create_task(
        gateway.post(
            "/tickets/v1/issues?delay=1", key="w1", json_body={}, headers={"Prefer": "wait=5"}
        )
    )
    await asyncio.sleep(0.2)  # the duplicate is waiting now
    other = await gateway.post("/tickets/v1/issues", key="w2", json_body={})
    assert other.status == 201
    assert (await first).status == 201
    replay = await waiting
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 2
