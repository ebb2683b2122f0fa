"""The same request under a new key: refused while its twin is unsettled, unless marked distinct.

A real gateway (on SQLite, the default store, and on PostgreSQL) in front of the counting upstream:
an agent that lost its key sends the same request again under a new one; the
gateway names the other operation and sends nothing, keeps naming it for the
refused key after the twin completed, lets a request marked
`Idempotency-Distinct: ?1` through (and notes it in both histories), never
looks across scopes or at other requests, and follows the route's
`similar_guard` and `similar_window`.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway
from upstream import CountingUpstream

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
BODY = {"title": "printer on fire", "priority": 1}


async def _problem(response: aiohttp.ClientResponse) -> dict[str, Any]:
    assert response.headers["Content-Type"].startswith("application/problem+json")
    document: dict[str, Any] = json.loads(await response.read())
    return document


async def _lookup(gateway: RunningGateway, key: str, **headers: str) -> tuple[int, Any]:
    async with gateway.session.get(
        f"{gateway.url}/operations/{key}", headers={"Authorization": "Bearer agent", **headers}
    ) as response:
        return response.status, json.loads(await response.read())


async def _admin_op(gateway: RunningGateway, key: str) -> dict[str, Any]:
    async with gateway.session.get(
        f"{gateway.admin_url}/admin/operations", params={"key": key}, headers=ADMIN
    ) as response:
        assert response.status == 200
        listing = json.loads(await response.read())
    (item,) = listing["items"]
    async with gateway.session.get(
        f"{gateway.admin_url}/admin/operations/{item['id']}", headers=ADMIN
    ) as response:
        document: dict[str, Any] = json.loads(await response.read())
        return document


HELD = "?hold=1"
"""The upstream holds the request until the test releases it (or, once released, not)."""


async def _post(
    gateway: RunningGateway, key: str, *, query: str = HELD, body: Any = None, **headers: str
) -> aiohttp.ClientResponse:
    """POST the same request (`BODY`, `query`) under `key`, in the scope of one agent."""
    return await gateway.post(
        f"/tickets/v1/issues{query}",
        key=key,
        json_body=BODY if body is None else body,
        headers={"Authorization": "Bearer agent", **headers},
    )


async def _unknown(gateway: RunningGateway, upstream: CountingUpstream, key: str) -> None:
    """`key`'s operation sent and timed out: `unknown`, its effect not yet applied."""
    response = await _post(gateway, key)
    assert response.status == 504, await response.read()
    await upstream.wait_for_held(1)


async def _guarded(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    store_url: str | None,
    **route: Any,
) -> RunningGateway:
    return await gateway_factory(
        upstream.url,
        store_url=store_url,
        route={"timeout": "1s", **route},
        admin={"token": ADMIN_TOKEN},
    )


async def test_a_new_key_for_an_in_flight_request_is_refused_naming_it(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url, timeout="30s")
    first = asyncio.ensure_future(_post(gateway, "run-1:0:c1", query="?hold=1"))
    await upstream.wait_for_held(1)

    again = await _post(gateway, "run-2:0:c1", query="?hold=1")
    assert again.status == 409
    problem = await _problem(again)
    assert problem["type"].endswith("/similar-operation")
    assert problem["next_action"] == "reconcile"
    assert problem["safe_to_retry"] is False
    assert problem["key"] == "run-2:0:c1"
    assert "state" not in problem
    twin = problem["similar_operation"]
    assert (twin["key"], twin["state"], twin["operation"]) == (
        "run-1:0:c1", "in_flight", "/operations/run-1%3A0%3Ac1",
    )  # fmt: skip
    assert again.headers["Idempotency-Key"] == "run-2:0:c1"
    assert "Idempotency-Status" not in again.headers
    assert "distinct" not in problem["detail"].lower()
    assert "force" not in problem["detail"]
    status, _ = await _lookup(gateway, "run-2:0:c1")
    assert status == 404  # nothing was recorded under the new key

    upstream.release_held()
    assert (await first).status == 201
    assert upstream.count == 1


async def test_an_unknown_twin_keeps_the_refused_key_bound_after_it_completes(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    await _unknown(gateway, upstream, "lost-1")
    refused = await _post(gateway, "lost-2")
    assert refused.status == 409
    assert (await _problem(refused))["similar_operation"]["state"] == "unknown"

    upstream.release_held()
    await upstream.wait_for_effects(1)
    twin = await _admin_op(gateway, "lost-1")
    async with gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{twin['id']}/resolve",
        json={"outcome": "applied", "response": {"status": 201, "body": '{"n": 1}'}},
        headers=ADMIN,
    ) as response:
        assert response.status == 200, await response.read()

    # The refused key stays bound: its retry is refused, now naming a completed twin.
    again = await _post(gateway, "lost-2")
    assert again.status == 409
    assert (await _problem(again))["similar_operation"]["state"] == "completed"
    # A key never refused meets a completed twin: sent, and the answer names the twin.
    fresh = await _post(gateway, "lost-3")
    assert fresh.status == 201
    assert fresh.headers["Idempotency-Similar"] == "/operations/lost-1"
    assert upstream.count == 2


async def test_the_distinct_marker_sends_and_both_histories_name_the_other(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    await _unknown(gateway, upstream, "pay-1")
    upstream.release_held()
    second = await _post(gateway, "pay-2", **{"Idempotency-Distinct": "?1"})
    assert second.status == 201
    assert second.headers["Idempotency-Similar"] == "/operations/pay-1"
    first, other = await _admin_op(gateway, "pay-1"), await _admin_op(gateway, "pay-2")
    claimed = next(e for e in other["history"] if e["type"] == "claimed")
    assert claimed["distinct_from"] == first["id"]
    noted = [e for e in first["history"] if e["type"] == "distinct-twin"]
    assert [e["operation"] for e in noted] == [other["id"]]
    # `?0` is "not marked": refused like no marker at all.
    third = await _post(gateway, "pay-3", **{"Idempotency-Distinct": "?0"})
    assert third.status == 409


async def test_a_malformed_distinct_marker_is_refused_and_nothing_is_sent(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    for value in ("true", "1", "?1;x", "?2"):
        response = await _post(gateway, f"bad-{value}", **{"Idempotency-Distinct": value})
        assert response.status == 400, value
        problem = await _problem(response)
        assert problem["type"].endswith("/invalid-request")
        assert problem["next_action"] == "fix-request"
    assert upstream.count == 0


async def test_other_scopes_other_requests_and_derived_guards_are_not_affected(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    await _unknown(gateway, upstream, "a-1")
    upstream.release_held()
    other_scope = await gateway.post(
        "/tickets/v1/issues" + HELD,
        key="b-1",
        json_body=BODY,
        headers={"Authorization": "Bearer other"},
    )
    assert other_scope.status == 201
    assert "Idempotency-Similar" not in other_scope.headers
    other_body = await _post(gateway, "a-2", body={**BODY, "priority": 2})
    assert other_body.status == 201
    other_path = await gateway.post(
        "/tickets/v1/comments" + HELD,
        key="a-3",
        json_body=BODY,
        headers={"Authorization": "Bearer agent"},
    )
    assert other_path.status == 201


@pytest.mark.parametrize("setting", [{"similar_guard": "off"}, {"similar_window": "0s"}])
async def test_the_guard_can_be_turned_off(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    store_url: str | None,
    setting: dict[str, str],
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url, **setting)
    await _unknown(gateway, upstream, "off-1")
    upstream.release_held()
    again = await _post(gateway, "off-2")
    assert again.status == 201


async def test_guard_all_refuses_a_completed_twin_too(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url, similar_guard="all")
    assert (await _post(gateway, "all-1", query="")).status == 201
    again = await _post(gateway, "all-2", query="")
    assert again.status == 409
    twin = (await _problem(again))["similar_operation"]
    assert (twin["key"], twin["state"]) == ("all-1", "completed")
    assert upstream.count == 1


async def test_a_released_keys_new_attempt_is_guarded_like_a_new_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    upstream.script.append({"hold": "0", "status": "429"})
    refused = await _post(gateway, "rel-1")
    assert refused.status == 429  # a release status: the key is released
    marked = asyncio.ensure_future(_post(gateway, "rel-2", **{"Idempotency-Distinct": "?1"}))
    await upstream.wait_for_held(1)
    retry = await _post(gateway, "rel-1")
    assert retry.status == 409  # the released key's twin is in flight under rel-2
    problem = await _problem(retry)
    assert problem["similar_operation"]["key"] == "rel-2"
    upstream.release_held()
    await marked


async def test_the_window_passes_once_this_process_vouches_for_it(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    """A twin whose attempt began longer ago than `similar_window` no longer refuses, but
    only once the gateway has watched the store's clock for a whole window."""
    gateway = await _guarded(gateway_factory, upstream, store_url, similar_window="2s")
    await _unknown(gateway, upstream, "old-1")
    assert (await _post(gateway, "old-2")).status == 409
    upstream.release_held()  # from here on a request that is sent completes at once
    for _ in range(200):
        await asyncio.sleep(0.1)
        again = await _post(gateway, "old-3")
        if again.status == 201:
            break
        assert again.status == 409
    else:
        pytest.fail("the window never passed")
    # The key refused within the window is bound no longer either: sent, with old-3
    # (completed) named as its twin.
    bound_no_more = await _post(gateway, "old-2")
    assert bound_no_more.status == 201
    assert bound_no_more.headers["Idempotency-Similar"] == "/operations/old-3"


async def test_an_upstreams_similar_and_distinct_headers_are_dropped(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    response = await _post(gateway, "h-1", query="?forge=1")
    assert response.status == 201
    assert "Idempotency-Similar" not in response.headers
    assert "Idempotency-Distinct" not in response.headers


async def test_the_marker_is_not_forwarded_nor_part_of_the_fingerprint(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    marked = await _post(gateway, "m-1", query="", **{"Idempotency-Distinct": "?1"})
    assert marked.status == 201
    assert "idempotency-distinct" not in upstream.effects[0].headers
    replay = await _post(gateway, "m-1", query="")  # the same request without the marker: a replay
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"


async def test_a_refusal_counts_as_a_suppressed_duplicate(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await _guarded(gateway_factory, upstream, store_url)
    await _unknown(gateway, upstream, "c-1")
    assert (await _post(gateway, "c-2")).status == 409
    text = await (await gateway.get("/metrics")).text()
    assert 'idempotency_gateway_requests_total{outcome="similar",route="tickets"} 1.0' in text
    assert 'idempotency_gateway_duplicates_suppressed_total{route="tickets"} 1.0' in text
