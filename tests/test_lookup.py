"""`GET /operations/<key>`, health endpoints and metrics: what the agent and operator see."""

from __future__ import annotations

import base64
import json
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import quote

import aiohttp
import pytest
from harness import RunningGateway
from upstream import CountingUpstream
from yarl import URL

PROBLEM_JSON = "application/problem+json"

CONTRACT_FIELDS = {
    "id",
    "key",
    "state",
    "route",
    "method",
    "path",
    "fingerprint",
    "attempts",
    "created_at",
    "updated_at",
    "expires_at",
    "forgotten_at",
    "response",
    "resolution",
    "evidence",
    "safe_to_retry",
}


async def problem_of(response: aiohttp.ClientResponse, status: int, problem_type: str) -> Any:
    """Check that a response is the named problem and return its document."""
    assert response.status == status
    assert response.content_type == PROBLEM_JSON
    document = json.loads(await response.read())
    assert document["type"].rsplit("/", 1)[-1] == problem_type
    return document


def timestamp(value: str) -> datetime:
    """An RFC 3339 UTC timestamp written with a `Z`."""
    assert isinstance(value, str)
    assert value.endswith("Z")
    return datetime.fromisoformat(value)


async def lookup(gateway: RunningGateway, key: str, **kwargs: Any) -> aiohttp.ClientResponse:
    """GET /operations/<key> with the key percent-encoded as one path segment."""
    url = URL(f"{gateway.url}/operations/{quote(key, safe='')}", encoded=True)
    response = await gateway.session.get(url, **kwargs)
    await response.read()
    return response


async def test_completed_operation_json(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A completed key answers 200 with the contract's fields, an ETag and the key headers."""
    first = await gateway.post("/tickets/v1/issues", key="run-77:0:c1", json_body={"t": "x"})
    first_body = await first.read()
    assert first.status == 201

    response = await lookup(gateway, "run-77:0:c1")
    assert response.status == 200
    assert response.content_type == "application/json"
    assert response.headers["ETag"]
    assert response.headers["Idempotency-Key"] == "run-77:0:c1"
    assert response.headers["Idempotency-Status"] == "completed"
    document = await response.json()

    assert set(document) >= CONTRACT_FIELDS
    assert document["id"].startswith("op_")
    assert document["key"] == "run-77:0:c1"
    assert document["state"] == "completed"
    assert document["route"] == "tickets"
    assert document["method"] == "POST"
    assert document["path"] == "/tickets/v1/issues"
    assert document["fingerprint"].startswith("v2:hmac-sha256:")  # version 2, keyed per scope
    assert document["attempts"] == 1
    created = timestamp(document["created_at"])
    updated = timestamp(document["updated_at"])
    expires = timestamp(document["expires_at"])
    forgotten = timestamp(document["forgotten_at"])
    assert created <= updated
    assert abs(expires - updated - timedelta(hours=24)) < timedelta(seconds=5)
    assert abs(forgotten - updated - timedelta(days=30)) < timedelta(seconds=5)

    stored = document["response"]
    assert set(stored) >= {"status", "headers", "body", "body_encoding"}
    assert stored["status"] == 201
    assert stored["headers"]["content-type"] == "application/json"
    assert stored["headers"]["x-effect-id"] == "1"
    assert stored["body"] == first_body.decode()
    assert stored["body_encoding"] == "utf-8"
    assert document["resolution"]["by"] == "upstream"
    timestamp(document["resolution"]["at"])
    assert document["resolution"]["note"] is None
    assert document["evidence"] == []
    assert document["safe_to_retry"] is True
    # Settled for good: no lease is running, and nothing counts from the last one.
    assert document["lease_expires_at"] is None
    assert upstream.count == 1


async def test_key_with_reserved_characters_is_found(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A key with '/', spaces and '%' is looked up by its percent-encoded form."""
    key = "run/7 of 9: 100% done"
    assert (await gateway.post("/tickets/v1/issues", key=key, data=b"x")).status == 201

    response = await lookup(gateway, key)
    assert response.status == 200
    assert (await response.json())["key"] == key
    assert response.headers["Idempotency-Key"] == key
    assert upstream.count == 1


async def test_binary_body_is_base64(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    """A response body that is not UTF-8 is given as base64 and decodes to the exact bytes."""
    first = await gateway.post("/tickets/v1/issues?gzip=1", key="bin-1", data=b"x")
    raw = await first.read()
    assert first.status == 201

    stored = (await (await lookup(gateway, "bin-1")).json())["response"]
    assert stored["body_encoding"] == "base64"
    assert base64.b64decode(stored["body"]) == raw
    assert stored["headers"]["content-encoding"] == "gzip"
    assert upstream.count == 1


async def test_unknown_key_is_404(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    """A key never used in this scope is a 404 `unknown-key` that is not safe to retry."""
    document = await problem_of(await lookup(gateway, "never-used"), 404, "unknown-key")
    assert document["safe_to_retry"] is False
    assert document["key"] == "never-used"
    assert upstream.count == 0


@pytest.mark.parametrize(
    "encoded",
    [
        pytest.param("k" * 256, id="too-long"),
        pytest.param("caf%C3%A9", id="non-ascii"),
        pytest.param("bad%FFbyte", id="not-utf-8"),
        pytest.param("tab%09key", id="control-char"),
    ],
)
async def test_invalid_key_in_path_is_400(
    gateway: RunningGateway, upstream: CountingUpstream, encoded: str
) -> None:
    """A path key that could never be a valid Idempotency-Key is a 400 `invalid-key`."""
    url = URL(f"{gateway.url}/operations/{encoded}", encoded=True)
    response = await gateway.session.get(url)
    await response.read()

    document = await problem_of(response, 400, "invalid-key")
    assert document["safe_to_retry"] is False
    assert upstream.count == 0


async def test_etag_changes_with_the_operation(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A released key retried is a new attempt: attempts grows and the ETag changes."""
    path = "/tickets/v1/issues?status=429"
    first = await gateway.post(path, key="etag-1", data=b"x")
    assert first.status == 429
    assert first.headers["Idempotency-Status"] == "released"

    before = await lookup(gateway, "etag-1")
    before_document = await before.json()
    assert before_document["state"] == "released"
    assert before_document["attempts"] == 1
    assert before_document["response"] is None
    assert (await lookup(gateway, "etag-1")).headers["ETag"] == before.headers["ETag"]

    retry = await gateway.post(path, key="etag-1", data=b"x")
    assert retry.status == 429
    assert "Idempotent-Replayed" not in retry.headers

    after = await lookup(gateway, "etag-1")
    after_document = await after.json()
    assert after_document["state"] == "released"
    assert after_document["attempts"] == 2
    assert after_document["id"] == before_document["id"]
    assert after.headers["ETag"] != before.headers["ETag"]
    assert upstream.count == 2


async def test_health_endpoints(gateway: RunningGateway, upstream: CountingUpstream) -> None:
    """/healthz and /readyz answer 200 on a running gateway with a reachable store."""
    assert (await gateway.get("/healthz")).status == 200
    assert (await gateway.get("/readyz")).status == 200
    assert upstream.count == 0


async def test_metrics_count_forwarded_and_suppressed_requests(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """/metrics counts a forwarded request, a suppressed duplicate, and times both layers."""
    assert (await gateway.post("/tickets/v1/issues", key="m-1", data=b"x")).status == 201
    text = (await (await gateway.get("/metrics")).read()).decode()
    assert 'idempotency_gateway_requests_total{outcome="forwarded",route="tickets"} 1.0' in text
    assert 'idempotency_gateway_duplicates_suppressed_total{route="tickets"}' not in text

    retry = await gateway.post("/tickets/v1/issues", key="m-1", data=b"x")
    assert retry.headers["Idempotent-Replayed"] == "true"
    text = (await (await gateway.get("/metrics")).read()).decode()
    lines = text.splitlines()
    assert 'idempotency_gateway_requests_total{outcome="forwarded",route="tickets"} 1.0' in lines
    assert 'idempotency_gateway_requests_total{outcome="replayed",route="tickets"} 1.0' in lines
    assert 'idempotency_gateway_duplicates_suppressed_total{route="tickets"} 1.0' in lines
    assert 'idempotency_gateway_operations{state="completed"} 1.0' in lines
    assert 'idempotency_gateway_upstream_seconds_bucket{le="+Inf",route="tickets"} 1.0' in lines
    # The retry was answered from the committed record: no second claim.
    assert 'idempotency_gateway_store_seconds_bucket{le="+Inf",operation="claim"} 1.0' in lines
    assert 'idempotency_gateway_store_seconds_bucket{le="+Inf",operation="peek"} 1.0' in lines
    assert upstream.count == 1
