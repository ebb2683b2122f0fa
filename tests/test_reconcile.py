"""Settling unknown outcomes: resolve, admin, probes, Prefer: wait, retention, store outages."""

from __future__ import annotations

import asyncio
import base64
import sqlite3
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import (
    ADMIN_TOKEN,
    RELEASE_SOON,
    RunningGateway,
    calibration_sample,
    resolve_when_allowed,
)
from upstream import CountingUpstream, effects_probe

from gateway.engine.sweeper import Sweeper
from gateway.web.appkeys import ENGINE, METRICS, STORE

PROBLEM = "application/problem+json"
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PROBE = effects_probe(not_applied_after="300ms")


async def make_unknown(gateway: RunningGateway, key: str, body: Any = None) -> None:
    """The upstream applies the effect and drops the connection: the key becomes unknown."""
    response = await gateway.post(
        "/tickets/v1/issues?drop=after_effect", key=key, json_body=body or {}
    )
    assert response.status == 502


async def lookup(gateway: RunningGateway, key: str) -> tuple[dict[str, Any], str]:
    response = await gateway.get("/operations/" + key)
    assert response.status == 200, await response.text()
    return await response.json(), response.headers["ETag"]


async def resolve(
    gateway: RunningGateway, key: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    response = await gateway.session.post(
        f"{gateway.url}/operations/{key}/resolve", json=body, headers=headers or {}
    )
    await response.read()
    return response


def kind(document: dict[str, Any]) -> str:
    return str(document["type"]).rsplit("/", 1)[-1]


async def test_resolve_applied_makes_the_given_response_the_receipt(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """An owner's `applied` resolution completes the key; retries replay what it vouched for."""
    await make_unknown(gateway, "u1")
    response = await resolve(
        gateway,
        "u1",
        {
            "outcome": "applied",
            "response": {"status": 201, "headers": {"content-type": "application/json"},
                         "body": '{"id": "T-9"}'},
            "note": "found it in the tool's UI",
        },
    )  # fmt: skip
    assert response.status == 200
    document = await response.json()
    assert document["state"] == "completed"
    assert document["resolution"]["by"] == "owner"
    assert document["resolution"]["note"] == "found it in the tool's UI"
    assert document["evidence"][0]["source"] == "gateway"

    retry = await gateway.post("/tickets/v1/issues?drop=after_effect", key="u1", json_body={})
    assert retry.status == 201
    assert await retry.read() == b'{"id": "T-9"}'
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Content-Type"] == "application/json"
    assert upstream.count == 1


async def test_resolve_not_applied_releases_the_key_for_a_new_attempt(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """`not_applied` releases the key (once the tool can no longer apply the last send):
    the same request is forwarded again, once."""
    gateway = await gateway_factory(upstream.url, route=RELEASE_SOON, idempotency={"lease": "2s"})
    await make_unknown(gateway, "u2", {"a": 1})
    url = f"{gateway.url}/operations/u2/resolve"
    status, document = await resolve_when_allowed(gateway.session, url, {"outcome": "not_applied"})
    assert (status, document["state"]) == (200, "released")
    retry = await gateway.post("/tickets/v1/issues", key="u2", json_body={"a": 1})
    assert retry.status == 422  # the path differs from the first request: still bound
    retry = await gateway.post("/tickets/v1/issues?drop=after_effect", key="u2", json_body={"a": 1})
    assert retry.status == 502  # forwarded again (and lost again)
    document, _ = await lookup(gateway, "u2")
    assert document["attempts"] == 2
    assert upstream.count == 2


async def test_resolve_checks_if_match_and_state(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A stale ETag gets 412; resolving anything but an unknown operation gets 409."""
    await make_unknown(gateway, "u3")
    _, etag = await lookup(gateway, "u3")
    stale = etag.replace(".", ".9")
    response = await resolve(gateway, "u3", {"outcome": "applied"}, {"If-Match": stale})
    assert response.status == 412
    assert kind(await response.json(content_type=PROBLEM)) == "precondition-failed"

    response = await resolve(gateway, "u3", {"outcome": "applied"}, {"If-Match": etag})
    assert response.status == 200
    again = await resolve(gateway, "u3", {"outcome": "applied"}, {"If-Match": etag})
    assert again.status in (409, 412)
    again = await resolve(gateway, "u3", {"outcome": "applied"})
    assert again.status == 409
    assert kind(await again.json(content_type=PROBLEM)) == "not-resolvable"
    assert upstream.count == 1


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"outcome": "maybe"},
        {"outcome": "not_applied", "response": {"status": 200}},
        {"outcome": "applied", "response": {"status": 99}},
        {
            "outcome": "applied",
            "response": {"status": 200, "body": "@@", "body_encoding": "base64"},
        },
        {"outcome": "applied", "extra": 1},
        {"outcome": "applied", "response": {"status": 101}},
        {"outcome": "applied", "response": {"status": 200, "headers": {"bad name": "x"}}},
        {"outcome": "applied", "response": {"status": 200, "headers": {"x-a": "1\r\nx-b: 2"}}},
        {"outcome": "applied", "response": {"status": 200, "headers": {"": "x"}}},
    ],
)
async def test_invalid_resolve_bodies_are_400_and_change_nothing(
    gateway: RunningGateway, upstream: CountingUpstream, body: dict[str, Any]
) -> None:
    """A malformed resolution is refused with invalid-request and the operation stays unknown."""
    await make_unknown(gateway, "u4")
    response = await resolve(gateway, "u4", body)
    assert response.status == 400
    assert kind(await response.json(content_type=PROBLEM)) == "invalid-request"
    assert (await lookup(gateway, "u4"))[0]["state"] == "unknown"
    assert upstream.count == 1


async def test_resolve_is_scoped(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    """Another scope cannot see or resolve the key: 404."""
    await make_unknown(gateway, "u5")
    response = await resolve(
        gateway, "u5", {"outcome": "not_applied"}, {"Authorization": "Bearer someone-else"}
    )
    assert response.status == 404
    assert (await lookup(gateway, "u5"))[0]["state"] == "unknown"
    assert upstream.count == 1


async def test_admin_endpoints_need_a_configured_token(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Without an admin token the admin endpoints do not exist, nor their listener."""
    assert gateway.admin_url is None
    response = await gateway.get("/admin/operations", headers=ADMIN)
    assert response.status == 404
    assert upstream.count == 0


async def test_admin_lists_every_scope_with_cursor_pagination(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Operators page through unknown operations of all scopes and settle one by id."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN})
    for n in range(5):
        response = await gateway.post(
            "/tickets/v1/issues?drop=after_effect",
            key=f"a{n}",
            json_body={"n": n},
            headers={"Authorization": f"Bearer agent-{n % 2}"},
        )
        assert response.status == 502
    await gateway.post("/tickets/v1/issues", key="done", json_body={})

    assert (await gateway.admin_get("/admin/operations")).status == 401
    wrong = await gateway.admin_get("/admin/operations", headers={"Authorization": "Bearer nope"})
    assert wrong.status == 401

    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        params = {"state": "unknown", "limit": "2", **({"cursor": cursor} if cursor else {})}
        response = await gateway.admin_get("/admin/operations", params=params, headers=ADMIN)
        page = await response.json()
        assert len(page["items"]) <= 2
        seen.extend(page["items"])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert sorted(item["key"] for item in seen) == [f"a{n}" for n in range(5)]
    assert len({item["scope"] for item in seen}) == 2
    assert all(item["state"] == "unknown" for item in seen)

    target = seen[0]
    shown = await gateway.admin_get(f"/admin/operations/{target['id']}", headers=ADMIN)
    assert (await shown.json())["key"] == target["key"]
    settled = await gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{target['id']}/resolve",
        json={"outcome": "not_applied", "note": "checked the tool", "force": True},
        headers=ADMIN,
    )
    document = await settled.json()
    assert document["state"] == "released"
    assert document["resolution"] == {
        "by": "admin",
        "at": document["resolution"]["at"],
        "note": "checked the tool",
    }
    bad = await gateway.admin_get("/admin/operations", params={"state": "nope"}, headers=ADMIN)
    assert bad.status == 400
    bad = await gateway.admin_get("/admin/operations", params={"cursor": "!!"}, headers=ADMIN)
    assert bad.status == 400
    huge = base64.urlsafe_b64encode(b"s" + b"9" * 40).decode().rstrip("=")
    bad = await gateway.admin_get("/admin/operations", params={"cursor": huge}, headers=ADMIN)
    assert bad.status == 400
    assert upstream.count == 6


async def test_probe_settles_an_applied_effect_as_completed(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """When the probe finds the effect, its answer becomes the receipt and retries replay it."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": PROBE, "upstream_headers": {"X-Tool-Token": "route-secret"}},
    )
    response = await gateway.post(
        "/tickets/v1/issues?drop=after_effect",
        key="p1",
        json_body={},
        headers={"Authorization": "Bearer caller-credential"},
    )
    assert response.status == 502
    retry = await gateway.post(
        "/tickets/v1/issues?drop=after_effect",
        key="p1",
        json_body={},
        headers={"Authorization": "Bearer caller-credential"},
    )
    assert retry.status == 200  # the probe's answer, settled while the retry waited
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["X-Effect-Id"] == "1"
    document, _ = await lookup_as(gateway, "p1", "Bearer caller-credential")
    assert document["state"] == "completed"
    assert document["resolution"]["by"] == "probe"
    probe_headers = upstream.probes[0]
    assert probe_headers["x-tool-token"] == "route-secret"
    assert "authorization" not in probe_headers
    assert upstream.count == 1


async def test_probe_not_applied_releases_only_after_not_applied_after(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A 404 from the probe is only evidence until the last send is old enough; then it releases."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": {**PROBE, "not_applied_after": "1500ms"}, "timeout": "1s"},
        idempotency={"lease": "500ms"},
    )
    # Something of the kind completed, so the probe can be calibrated against it.
    await calibration_sample(gateway.session, gateway.url)
    # The request times out before the upstream applies anything: it never does (hold=1,
    # never released), however long the test takes.
    response = await gateway.post("/tickets/v1/issues?hold=1", key="p2", json_body={})
    assert response.status == 504
    document, _ = await lookup(gateway, "p2")
    assert document["state"] == "unknown"
    assert any(item["source"] == "probe" and item["status"] == 404 for item in document["evidence"])

    engine = gateway.app[ENGINE]
    store = gateway.app[STORE]
    deadline = time.monotonic() + 60  # bounds a hang only: the release is awaited, not timed
    while time.monotonic() < deadline:
        operation = await store.get("anonymous", "p2")
        assert operation is not None
        if operation.state.value != "unknown":
            break
        await engine.reconcile_unknown()
        await asyncio.sleep(0.2)
    document, _ = await lookup(gateway, "p2")
    assert document["state"] == "released"
    assert document["resolution"]["by"] == "probe"
    # Not before the whole call could have ended (lease 0.5 s + timeout 0.2 s) and the grace
    # after it (1.5 s): 2.2 s after the claim.
    assert time.time() - document_time(document["created_at"]) >= 2.2 - 0.1
    assert upstream.count == 1  # the calibration sample, never p2


async def test_a_late_applied_effect_is_completed_never_released(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A timed-out request the upstream applies late is settled completed by the probe."""
    gateway = await gateway_factory(
        upstream.url,
        # A grace no run of this test outlasts: a 404 can only ever be "too soon".
        route={"probe": {**PROBE, "not_applied_after": "10m"}, "timeout": "200ms"},
        idempotency={"lease": "500ms"},
    )
    response = await gateway.post("/tickets/v1/issues?hold=1", key="p3", json_body={})
    assert response.status == 504
    assert (await lookup(gateway, "p3"))[0]["state"] == "unknown"  # probe: 404, too soon
    upstream.release_held()  # the upstream applies it now, after the caller gave up
    await upstream.wait_for_count(1, seconds=60)
    engine = gateway.app[ENGINE]
    deadline = time.monotonic() + 60  # bounds a hang only
    document: dict[str, Any] = {}
    while time.monotonic() < deadline:
        await engine.reconcile_unknown()
        document, _ = await lookup(gateway, "p3")
        if document["state"] != "unknown":
            break
        await asyncio.sleep(0.2)
    assert document["state"] == "completed"
    assert document["resolution"]["by"] == "probe"
    retry = await gateway.post("/tickets/v1/issues?hold=1", key="p3", json_body={})
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1


async def test_inconclusive_probe_leaves_unknown(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A probe answer that is neither applied nor not applied keeps the key unknown."""
    gateway = await gateway_factory(
        upstream.url, route={"probe": {**PROBE, "applied_statuses": [299]}}
    )
    await make_unknown(gateway, "p4")
    document, _ = await lookup(gateway, "p4")
    assert document["state"] == "unknown"
    assert any(item["source"] == "probe" and item["status"] == 200 for item in document["evidence"])
    assert upstream.count == 1


async def test_prefer_wait_returns_the_outcome_once_known(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A retry with `Prefer: wait=5` waits for the first attempt and gets its replay."""
    first = asyncio.create_task(
        gateway.post("/tickets/v1/issues?delay=0.5", key="w1", json_body={})
    )
    await upstream.wait_for_count(1)
    retry = await gateway.post(
        "/tickets/v1/issues?delay=0.5", key="w1", json_body={}, headers={"Prefer": "wait=5"}
    )
    # Not timed: without the wait the retry would be a 409 in-progress, and a wait left to
    # run out would be a 409 too; only the first attempt's outcome makes it a replay.
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert (await first).status == 201
    assert upstream.count == 1


async def test_prefer_wait_gives_409_when_the_wait_runs_out(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """When N seconds pass first, the waiting retry gets 409 in-progress; max_wait caps N."""
    gateway = await gateway_factory(upstream.url, idempotency={"max_wait": "300ms"})
    first = asyncio.create_task(
        gateway.post("/tickets/v1/issues?delay=1.5", key="w2", json_body={})
    )
    await upstream.wait_for_count(1)
    started = time.monotonic()
    retry = await gateway.post(
        "/tickets/v1/issues?delay=1.5", key="w2", json_body={}, headers={"Prefer": "wait=60"}
    )
    waited = time.monotonic() - started
    # 409, not the replay the first attempt gives at 1.5 s: the wait ended at max_wait, not
    # at 60 s (an upper bound on `waited` would only measure the machine's load).
    assert retry.status == 409
    assert waited >= 0.25
    assert (await first).status == 201
    assert upstream.count == 1


async def test_sweep_drops_expired_bodies_forgets_tombstones_and_keeps_unknown(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Receipts go after `retention`, keys after `tombstone_retention`; unknown stays."""
    gateway = await gateway_factory(
        upstream.url, idempotency={"retention": "200ms", "tombstone_retention": "600ms"}
    )
    assert (await gateway.post("/tickets/v1/issues", key="s1", json_body={})).status == 201
    await make_unknown(gateway, "s2")
    app = gateway.app
    sweeper = Sweeper(app[STORE], app[ENGINE], app[METRICS], interval=3600)

    await asyncio.sleep(0.3)
    first = await sweeper.run_once()
    assert first.receipts_expired == 1
    retry = await gateway.post("/tickets/v1/issues", key="s1", json_body={})
    assert kind(await retry.json(content_type=PROBLEM)) == "receipt-expired"

    await asyncio.sleep(0.4)
    second = await sweeper.run_once()
    assert second.forgotten == 1
    assert (await gateway.get("/operations/s1")).status == 404
    assert (await lookup(gateway, "s2"))[0]["state"] == "unknown"
    # A forgotten key is a new key again.
    assert (await gateway.post("/tickets/v1/issues", key="s1", json_body={})).status == 201
    assert upstream.count == 3


async def test_receipt_written_after_a_store_outage(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """When the receipt cannot be written, the caller still gets its answer and the receipt
    is written once the store is back."""
    gateway = await gateway_factory(
        upstream.url, store={"busy_timeout": "100ms"}, idempotency={"lease": "600ms"}
    )
    first = asyncio.create_task(
        gateway.post("/tickets/v1/issues?delay=0.3", key="o1", json_body={})
    )
    await upstream.wait_for_count(1)
    blocker = sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        response = await first
        assert response.status == 201
        assert response.headers["Idempotency-Status"] == "in_flight"
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    deadline = time.monotonic() + 60  # bounds a hang only
    while time.monotonic() < deadline:
        operation = await gateway.app[STORE].get("anonymous", "o1")
        if operation is not None and operation.state.value == "completed":
            break
        await asyncio.sleep(0.1)
    retry = await gateway.post("/tickets/v1/issues?delay=0.3", key="o1", json_body={})
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1


async def lookup_as(
    gateway: RunningGateway, key: str, authorization: str
) -> tuple[dict[str, Any], str]:
    response = await gateway.get("/operations/" + key, headers={"Authorization": authorization})
    assert response.status == 200
    return await response.json(), response.headers["ETag"]


def document_time(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
