"""Each row of the contract's status table, against a real upstream that counts effects."""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import RunningGateway, assert_names_the_key
from upstream import CountingUpstream

PROBLEM = "application/problem+json"


async def problem_of(response: aiohttp.ClientResponse) -> dict[str, Any]:
    assert response.content_type == PROBLEM, await response.text()
    document: dict[str, Any] = await response.json(content_type=PROBLEM)
    assert document["status"] == response.status
    assert document["type"].endswith("/" + document["type"].rsplit("/", 1)[-1])
    return document


def problem_type(document: dict[str, Any]) -> str:
    return str(document["type"]).rsplit("/", 1)[-1]


async def lookup_state(gateway: RunningGateway, key: str) -> str:
    response = await gateway.get("/operations/" + key)
    assert response.status == 200, await response.text()
    return str((await response.json())["state"])


async def test_missing_key_is_400_and_never_forwarded(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A protected POST without a key is refused with missing-key."""
    response = await gateway.post("/tickets/v1/issues", json_body={"t": 1})
    assert response.status == 400
    document = await problem_of(response)
    assert problem_type(document) == "missing-key"
    assert document["safe_to_retry"] is False
    assert upstream.count == 0


@pytest.mark.parametrize(
    "value",
    ["", "x" * 256, "caf\u00e9", "tab\there", '"unterminated', '"a"b'],
    ids=["empty", "too-long", "non-ascii", "control", "bad-sf", "sf-trailing"],
)
async def test_invalid_key_is_400_and_never_forwarded(
    gateway: RunningGateway, upstream: CountingUpstream, value: str
) -> None:
    """Empty, over-long, non-printable and malformed keys are refused with invalid-key."""
    response = await gateway.session.post(
        gateway.url + "/tickets/v1/issues",
        data=b"{}",
        headers={"Idempotency-Key": value.encode("utf-8").decode("latin-1")},
    )
    assert response.status == 400
    assert problem_type(await problem_of(response)) == "invalid-key"
    assert upstream.count == 0


async def test_key_sent_twice_is_400(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    """Two Idempotency-Key headers are ambiguous and refused."""
    headers = [("Idempotency-Key", "a"), ("Idempotency-Key", "b")]
    response = await gateway.session.post(
        gateway.url + "/tickets/v1/issues", data=b"{}", headers=headers
    )
    assert response.status == 400
    assert problem_type(await problem_of(response)) == "invalid-key"
    assert upstream.count == 0


async def test_structured_field_and_bare_key_are_the_same_key(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """`"abc"` (an sf-string) and `abc` (a bare token) name one operation."""
    first = await gateway.post("/tickets/v1/issues", key='"abc"', json_body={"t": 1})
    retry = await gateway.post("/tickets/v1/issues", key="abc", json_body={"t": 1})
    assert first.status == 201
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert retry.headers["Idempotency-Key"] == "abc"
    assert upstream.count == 1


async def test_body_over_the_limit_is_413(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A body larger than the route's max_body is refused before anything is recorded;
    the answer still names the key."""
    gateway = await gateway_factory(upstream.url, route={"max_body": "1KiB"})
    response = await gateway.post("/tickets/v1/issues", key="big", data=b"x" * 1025)
    assert response.status == 413
    document = await problem_of(response)
    assert problem_type(document) == "payload-too-large"
    assert_names_the_key(response.headers, document, "big")
    assert (await gateway.get("/operations/big")).status == 404
    assert upstream.count == 0


async def test_retry_replays_the_receipt_byte_for_byte(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A completed key answers retries with the stored status, headers and body."""
    first = await gateway.post("/tickets/v1/issues?status=202", key="k1", json_body={"a": 1})
    first_body = await first.read()
    for _ in range(3):
        retry = await gateway.post("/tickets/v1/issues?status=202", key="k1", json_body={"a": 1})
        assert retry.status == 202
        assert await retry.read() == first_body
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert retry.headers["Idempotency-Status"] == "completed"
        assert retry.headers["X-Effect-Id"] == first.headers["X-Effect-Id"]
        assert retry.headers["Content-Type"] == first.headers["Content-Type"]
    assert "Idempotent-Replayed" not in first.headers
    assert first.headers["Idempotency-Status"] == "completed"
    assert upstream.count == 1


async def test_same_key_different_request_is_422(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A key reused with another body, path or query is refused with key-mismatch."""
    await gateway.post("/tickets/v1/issues", key="k2", json_body={"a": 1})
    for path, body in [
        ("/tickets/v1/issues", {"a": 2}),
        ("/tickets/v1/other", {"a": 1}),
        ("/tickets/v1/issues?x=1", {"a": 1}),
    ]:
        response = await gateway.post(path, key="k2", json_body=body)
        assert response.status == 422
        document = await problem_of(response)
        assert problem_type(document) == "key-mismatch"
        assert document["safe_to_retry"] is False
        assert document["key"] == "k2"
        assert response.headers["Idempotency-Status"] == "completed"
    assert upstream.count == 1


async def test_retry_while_in_flight_is_409_with_retry_after(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A retry during the first attempt gets in-progress and Retry-After, not a second effect."""
    first = asyncio.create_task(
        gateway.post("/tickets/v1/issues?delay=0.5", key="slow", json_body={})
    )
    await upstream.wait_for_count(1)
    retry = await gateway.post("/tickets/v1/issues?delay=0.5", key="slow", json_body={})
    assert retry.status == 409
    document = await problem_of(retry)
    assert problem_type(document) == "in-progress"
    assert document["safe_to_retry"] is True
    assert int(retry.headers["Retry-After"]) >= 1
    assert retry.headers["Idempotency-Status"] == "in_flight"
    assert (await first).status == 201
    assert upstream.count == 1


async def test_timeout_after_sending_is_504_and_unknown(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """No complete answer in time makes the key unknown; the retry is refused, not forwarded."""
    gateway = await gateway_factory(upstream.url, route={"timeout": "300ms"})
    response = await gateway.post("/tickets/v1/issues?delay=1", key="t1", json_body={})
    assert response.status == 504
    document = await problem_of(response)
    assert problem_type(document) == "upstream-timeout"
    assert document["safe_to_retry"] is False
    assert document["state"] == "unknown"
    assert await lookup_state(gateway, "t1") == "unknown"

    retry = await gateway.post("/tickets/v1/issues?delay=1", key="t1", json_body={})
    assert retry.status == 409
    assert problem_type(await problem_of(retry)) == "outcome-unknown"
    assert upstream.count == 1


@pytest.mark.parametrize("drop", ["after_effect", "mid_body"])
async def test_connection_lost_after_sending_is_502_and_unknown(
    gateway: RunningGateway, upstream: CountingUpstream, drop: str
) -> None:
    """A connection lost before a complete answer makes the key unknown, never failed."""
    path = f"/tickets/v1/issues?drop={drop}"
    response = await gateway.post(path, key="lost", json_body={})
    assert response.status == 502
    document = await problem_of(response)
    assert problem_type(document) == "upstream-connection-lost"
    assert document["safe_to_retry"] is False
    assert await lookup_state(gateway, "lost") == "unknown"

    retry = await gateway.post(path, key="lost", json_body={})
    assert retry.status == 409
    document = await problem_of(retry)
    assert problem_type(document) == "outcome-unknown"
    assert document["safe_to_retry"] is False
    assert upstream.count == 1


async def test_unreachable_upstream_is_502_and_released(
    gateway_factory: GatewayFactory, tmp_path: Path, refused_port: int
) -> None:
    """A refused connection proves nothing was sent: the key is released for a new attempt."""
    gateway = await gateway_factory(f"http://127.0.0.1:{refused_port}")
    for attempt in (1, 2):
        response = await gateway.post("/tickets/v1/issues", key="u1", json_body={})
        assert response.status == 502
        document = await problem_of(response)
        assert problem_type(document) == "upstream-unreachable"
        assert document["safe_to_retry"] is True
        lookup = await (await gateway.get("/operations/u1")).json()
        assert lookup["state"] == "released"
        assert lookup["attempts"] == attempt


async def test_release_status_passes_the_refusal_through_and_releases(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """An upstream 429 reaches the caller as it came, unstored, and the key may be retried."""
    first = await gateway.post("/tickets/v1/issues?status=429", key="r1", json_body={})
    assert first.status == 429
    assert first.headers["Idempotency-Status"] == "released"
    assert "Idempotent-Replayed" not in first.headers
    second = await gateway.post("/tickets/v1/issues?status=429", key="r1", json_body={})
    assert second.status == 429
    lookup = await (await gateway.get("/operations/r1")).json()
    assert lookup["state"] == "released"
    assert lookup["attempts"] == 2
    assert lookup["response"] is None
    assert upstream.count == 2


async def test_expired_receipt_is_409_and_never_forwarded(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """After `retention` the key stays used: a retry gets receipt-expired, not a second effect,
    and the lookup says the body is no longer kept (`body_retained` false), swept or not."""
    gateway = await gateway_factory(upstream.url, idempotency={"retention": "300ms"})
    assert (await gateway.post("/tickets/v1/issues", key="e1", json_body={})).status == 201
    kept = await (await gateway.get("/operations/e1")).json()
    assert (kept["body_retained"], kept["response"]["status"]) == (True, 201)
    await asyncio.sleep(0.4)  # past retention (at least): the sweep has not run yet
    retry = await gateway.post("/tickets/v1/issues", key="e1", json_body={})
    assert retry.status == 409
    document = await problem_of(retry)
    assert problem_type(document) == "receipt-expired"
    assert document["safe_to_retry"] is False
    lookup = await (await gateway.get("/operations/e1")).json()
    assert lookup["response"] is None
    assert lookup["body_retained"] is False
    assert lookup["response_status"] == 201
    assert lookup["safe_to_retry"] is False
    assert upstream.count == 1


async def test_response_too_large_to_keep_passes_once_then_409(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A response over max_stored_response is delivered whole once; a retry is refused."""
    gateway = await gateway_factory(upstream.url, route={"max_stored_response": "1KiB"})
    first = await gateway.post("/tickets/v1/issues?size=5000", key="big", json_body={})
    assert first.status == 201
    assert len(await first.read()) == 5000
    retry = await gateway.post("/tickets/v1/issues?size=5000", key="big", json_body={})
    assert retry.status == 409
    document = await problem_of(retry)
    assert problem_type(document) == "receipt-not-retained"
    assert document["safe_to_retry"] is False
    assert await lookup_state(gateway, "big") == "completed"
    assert upstream.count == 1


async def test_store_unavailable_is_503_and_never_forwarded(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """When the claim cannot be committed nothing is forwarded; once the store is back, it is."""
    gateway = await gateway_factory(upstream.url, store={"busy_timeout": "200ms"})
    blocker = sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")  # a real writer holding the database lock
    try:
        response = await gateway.post("/tickets/v1/issues", key="s1", json_body={})
        assert response.status == 503
        document = await problem_of(response)
        assert problem_type(document) == "store-unavailable"
        assert document["safe_to_retry"] is True
        assert upstream.count == 0
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    retry = await gateway.post("/tickets/v1/issues", key="s1", json_body={})
    assert retry.status == 201
    assert upstream.count == 1


async def test_route_at_its_concurrency_limit_is_503_and_records_nothing(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Past max_concurrency a request is refused with route-saturated and no record; the
    answer still names the key."""
    gateway = await gateway_factory(upstream.url, route={"max_concurrency": 1})
    slow = asyncio.create_task(gateway.post("/tickets/v1/issues?delay=0.5", key="a", json_body={}))
    await upstream.wait_for_count(1)
    refused = await gateway.post("/tickets/v1/issues", key="b", json_body={})
    assert refused.status == 503
    document = await problem_of(refused)
    assert problem_type(document) == "route-saturated"
    assert document["safe_to_retry"] is True
    assert int(refused.headers["Retry-After"]) >= 1
    assert_names_the_key(refused.headers, document, "b")
    assert (await gateway.get("/operations/b")).status == 404
    assert (await slow).status == 201
    assert (await gateway.post("/tickets/v1/issues", key="b", json_body={})).status == 201
    assert upstream.count == 2


async def test_a_store_that_cannot_record_the_claim_is_503_naming_the_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """Another process holds the database's write lock past `busy_timeout` (an operator's
    shell, a backup): 503 store-unavailable, naming the key; nothing is sent."""
    gateway = await gateway_factory(upstream.url, store={"busy_timeout": "200ms"})
    with closing(sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")
        try:
            refused = await gateway.post("/tickets/v1/issues", key="down", json_body={})
        finally:
            holder.execute("ROLLBACK")
    assert refused.status == 503
    document = await problem_of(refused)
    assert problem_type(document) == "store-unavailable"
    assert document["safe_to_retry"] is True
    assert refused.headers["Idempotency-Key"] == "down"
    assert (document["key"], document["operation"]) == ("down", "/operations/down")
    assert upstream.count == 0


async def test_a_saturated_route_still_replays_completed_keys(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """max_concurrency limits upstream calls: a replay makes none, so it is still answered."""
    gateway = await gateway_factory(upstream.url, route={"max_concurrency": 1})
    assert (await gateway.post("/tickets/v1/issues", key="done", json_body={})).status == 201
    slow = asyncio.create_task(gateway.post("/tickets/v1/issues?delay=0.5", key="a", json_body={}))
    await upstream.wait_for_count(2)

    replay = await gateway.post("/tickets/v1/issues", key="done", json_body={})
    assert replay.status == 201
    assert replay.headers["Idempotent-Replayed"] == "true"
    mismatch = await gateway.post("/tickets/v1/issues", key="done", json_body={"other": 1})
    assert mismatch.status == 422
    refused = await gateway.post("/tickets/v1/issues", key="b", json_body={})
    assert refused.status == 503
    assert (await slow).status == 201
    assert upstream.count == 2


async def test_no_route_is_404(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    """A path outside every route prefix is refused with no-route; nothing is contacted."""
    for path in ("/nowhere", "/ticketsx/v1"):
        response = await gateway.post(path, key="n1", json_body={})
        assert response.status == 404
        assert problem_type(await problem_of(response)) == "no-route"
    assert upstream.count == 0


async def test_problem_documents_carry_the_contract_fields(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Problems about a key name it, its state, its lookup URL and safe_to_retry."""
    await gateway.post("/tickets/v1/issues", key="p/1 x", json_body={"a": 1})
    response = await gateway.post("/tickets/v1/issues", key="p/1 x", json_body={"a": 2})
    document = await problem_of(response)
    assert set(document) >= {"type", "title", "status", "detail", "key", "state", "operation"}
    assert document["operation"] == "/operations/p%2F1%20x"
    assert document["type"].startswith("https://")
    assert response.headers["Idempotency-Key"] == "p/1 x"
    assert (await gateway.get(document["operation"])).status == 200
    assert upstream.count == 1


@pytest.mark.parametrize(
    ("path", "route", "status", "kind"),
    [
        ("/tickets/v1/issues?delay=1", {"timeout": "300ms"}, 504, "upstream-timeout"),
        ("/tickets/v1/issues?drop=after_effect", {}, 502, "upstream-connection-lost"),
    ],
    ids=["timeout", "connection-lost"],
)
async def test_an_unknown_outcome_names_its_operation_as_the_retry_does(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    path: str,
    route: dict[str, Any],
    status: int,
    kind: str,
) -> None:
    """The first answer of an unknown outcome (504/502) carries the operation's lookup URL
    and id, as the retry's 409 outcome-unknown does: the agent can look it up or hand the
    id to an operator from either."""
    gateway = await gateway_factory(upstream.url, route=route)
    first = await problem_of(await gateway.post(path, key="named", json_body={}))
    retry = await problem_of(await gateway.post(path, key="named", json_body={}))
    operation = await (await gateway.get("/operations/named")).json()

    assert (first["status"], problem_type(first)) == (status, kind)
    assert problem_type(retry) == "outcome-unknown"
    for document in (first, retry):
        assert document["operation"] == "/operations/named"
        assert document["operation_id"] == operation["id"]
        assert document["state"] == "unknown"
    assert upstream.count == 1


async def test_an_unreachable_upstream_names_the_released_operation(
    gateway_factory: GatewayFactory, refused_port: int
) -> None:
    """502 upstream-unreachable: the key's operation exists (released); the problem names it."""
    gateway = await gateway_factory(f"http://127.0.0.1:{refused_port}")
    document = await problem_of(await gateway.post("/tickets/v1/issues", key="u2", json_body={}))
    operation = await (await gateway.get("/operations/u2")).json()

    assert problem_type(document) == "upstream-unreachable"
    assert document["operation"] == "/operations/u2"
    assert document["operation_id"] == operation["id"]
    assert document["state"] == operation["state"] == "released"
