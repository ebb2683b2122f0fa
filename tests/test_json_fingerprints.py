"""JSON compared as JSON: a re-serialised request is the same request (third round).

Agents re-serialise: a model writes its arguments afresh on every attempt. The
reviews sent, while a twin was `unknown`, nine trivial re-serialisations of one
request under new keys, and every one went through (ten effects); the same key
with the body re-serialised got `422 key-mismatch` with `fix-request`, and an
agent that followed that advice with a new key made a second effect. These
tests send the bytes an agent would, through a real gateway, and count effects.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest
from harness import RunningGateway, stop_gateway
from upstream import CountingUpstream

from gateway.engine.fingerprint import legacy_fingerprint_request

GatewayFactory = Any
PATH = "/tickets/v1/issues?a=1&b=2"
BODY = b'{"title": "Printer on fire", "priority": 1, "tags": ["b"]}'
JSON = {"Content-Type": "application/json"}

RESERIALISED: list[tuple[str, str, bytes, dict[str, str]]] = [
    ("member order", PATH, b'{"tags": ["b"], "priority": 1, "title": "Printer on fire"}', JSON),
    ("whitespace", PATH, b'{"title":"Printer on fire","priority":1,"tags":["b"]}', JSON),
    ("1.0 for 1", PATH, b'{"title": "Printer on fire", "priority": 1.0, "tags": ["b"]}', JSON),
    ("an escape", PATH, b'{"title": "Printer on fire", "priority": 1, "tags": ["\\u0062"]}', JSON),
    ("1e0 for 1", PATH, b'{"title": "Printer on fire", "priority": 1e0, "tags": ["b"]}', JSON),
    ("a charset", PATH, BODY, {"Content-Type": "application/json; charset=utf-8"}),
    ("query order", "/tickets/v1/issues?b=2&a=1", BODY, JSON),
    ("%61 for a", "/tickets/v1/issues?%61=1&b=2", BODY, JSON),
    (
        "all of them",
        "/tickets/v1/issues?b=2&%61=1",
        b'{ "tags" : [ "\\u0062" ] , "priority" : 10e-1 , "title" : "Printer on fire" }',
        {"Content-Type": "Application/JSON;charset=UTF-8"},
    ),
]


async def send(
    gateway: RunningGateway, key: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, Any]:
    async with gateway.session.post(
        gateway.url + path, data=body, headers={**headers, "Idempotency-Key": key}
    ) as response:
        return response.status, await response.json(content_type=None)


async def test_reserialised_requests_under_new_keys_are_refused_beside_an_unknown_twin(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """While the request's first key is `unknown`, each re-serialisation of it under a
    new key is the same request: 409 similar-operation naming that key, nothing sent."""
    gateway = await gateway_factory(upstream.url)
    status, _ = await send(gateway, "first", PATH + "&drop=after_effect", BODY, JSON)
    assert status == 502  # applied; its answer lost: unknown

    # The twin is the dropped request itself: re-send its exact path with each form.
    for label, path, body, headers in RESERIALISED:
        status, problem = await send(
            gateway, f"new-{label}", path + "&drop=after_effect", body, headers
        )
        assert status == 409, (label, problem)
        assert problem["type"].endswith("/similar-operation"), (label, problem)
        assert problem["similar_operation"]["key"] == "first"
    assert upstream.count == 1


@pytest.mark.parametrize(("label", "path", "body", "headers"), RESERIALISED)
async def test_the_same_key_re_serialised_is_the_same_request(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    label: str,
    path: str,
    body: bytes,
    headers: dict[str, str],
) -> None:
    """A completed key retried with its body re-serialised is replayed (never 422), and
    while it is unknown the retry is `outcome-unknown`, never `key-mismatch`."""
    gateway = await gateway_factory(upstream.url)
    status, _ = await send(gateway, "done", PATH, BODY, JSON)
    assert status == 201
    status, replayed = await send(gateway, "done", path, body, headers)
    assert status == 201, (label, replayed)
    status, _ = await send(gateway, "lost", PATH + "&drop=after_effect", BODY, JSON)
    assert status == 502
    status, problem = await send(gateway, "lost", path + "&drop=after_effect", body, headers)
    assert (status, problem["type"].rsplit("/", 1)[-1]) == (409, "outcome-unknown"), problem
    assert upstream.count == 2


async def test_a_different_request_under_an_unsettled_key_says_reconcile(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Another request under a key whose first call is unknown gets 422
    key-mismatch-unsettled with `next_action: reconcile` (the first call may have
    happened); under a completed key, plain key-mismatch with `fix-request`."""
    gateway = await gateway_factory(upstream.url)
    other = b'{"title": "Printer on fire", "priority": 2, "tags": ["b"]}'
    await send(gateway, "lost", PATH + "&drop=after_effect", BODY, JSON)
    status, problem = await send(gateway, "lost", PATH + "&drop=after_effect", other, JSON)
    assert status == 422
    assert problem["type"].endswith("/key-mismatch-unsettled")
    assert (problem["next_action"], problem["state"]) == ("reconcile", "unknown")
    await send(gateway, "done", PATH, BODY, JSON)
    status, problem = await send(gateway, "done", PATH, other, JSON)
    assert status == 422
    assert problem["type"].endswith("/key-mismatch")
    assert problem["next_action"] == "fix-request"
    assert upstream.count == 2


async def test_a_key_recorded_before_version_2_is_compared_the_old_way(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """A receipt stored with a version-1 fingerprint (before the upgrade) is replayed to
    the same bytes, and another body under its key is still 422; the version-1 form of
    an unsettled record also refuses the same request under a new key after the upgrade."""
    gateway = await gateway_factory(upstream.url)
    await send(gateway, "old-done", PATH, BODY, JSON)
    await send(gateway, "old-lost", PATH + "&drop=after_effect", BODY, JSON)
    await stop_gateway(gateway)
    with sqlite3.connect(tmp_path / "gateway.db") as db:  # as the old gateway stored them
        for key, path in (("old-done", PATH), ("old-lost", PATH + "&drop=after_effect")):
            route_path, _, query = path.partition("?")
            v1 = legacy_fingerprint_request(
                method="POST",
                route="tickets",
                path=route_path,
                query=query,
                content_type="application/json",
                body=BODY,
            )
            db.execute("UPDATE operations SET fingerprint = ? WHERE key = ?", (v1, key))
        db.execute(
            "INSERT INTO gateway_meta (name, value) VALUES ('fingerprint_v2_since', "
            "CAST((julianday('now') - 2440587.5) * 86400.0 AS TEXT))"
        )
        # Stored plain, as then: the upgrade to keyed fingerprints keys them in place.
        for table in ("request_log", "request_counts"):  # what versions 9 and 10 added
            db.execute(f"DROP TABLE {table}")
        db.execute("UPDATE schema_version SET version = 8")
    again = await gateway_factory(upstream.url)

    status, _ = await send(again, "old-done", PATH, BODY, JSON)
    assert status == 201
    status, problem = await send(again, "old-done", PATH, b'{"title": "other"}', JSON)
    assert (status, problem["type"].rsplit("/", 1)[-1]) == (422, "key-mismatch")
    status, problem = await send(again, "new-key", PATH + "&drop=after_effect", BODY, JSON)
    assert status == 409, problem
    assert problem["similar_operation"]["key"] == "old-lost"
    assert upstream.count == 2


async def test_each_attempt_forwards_its_own_bytes_and_records_their_digest(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A released key retried with its body re-serialised is the same request (a new
    attempt, not a 422); the upstream gets the bytes this attempt received, and each
    attempt's `sent` event has a keyed digest of its own bytes."""
    gateway = await gateway_factory(upstream.url)
    first, again = RESERIALISED[0][2], RESERIALISED[1][2]
    status, _ = await send(gateway, "k", PATH + "&status=429", first, JSON)
    assert status == 429  # a release status: the key may be sent again
    status, _ = await send(gateway, "k", PATH + "&status=429", again, JSON)
    assert status == 429
    assert [effect.body for effect in upstream.effects] == [first, again]
    async with gateway.session.get(f"{gateway.url}/operations/k") as found:
        operation = await found.json()
    sent = [event for event in operation["history"] if event["type"] == "sent"]
    assert [event["attempt"] for event in sent] == [1, 2]
    digests = [event["body_digest"] for event in sent]
    assert all(digest.startswith("hmac-sha256:") for digest in digests)
    assert digests[0] != digests[1]
