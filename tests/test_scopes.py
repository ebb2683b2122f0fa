"""Scopes: the same key in two scopes is two operations, and no scope sees another's."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from harness import RunningGateway, settings_for, start_gateway, stop_gateway
from upstream import CountingUpstream

GatewayFactory = Callable[..., Awaitable[RunningGateway]]

PROBLEM_JSON = "application/problem+json"


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


CLIENTS = [
    {"name": "agent-a", "token_sha256": [sha256("tok-a1"), sha256("tok-a2")]},
    {"name": "agent-b", "token_sha256": [sha256("tok-b")]},
]


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def problem_of(response: aiohttp.ClientResponse, status: int, problem_type: str) -> Any:
    """Check that a response is the named problem and return its document."""
    assert response.status == status
    assert response.content_type == PROBLEM_JSON
    document = json.loads(await response.read())
    assert document["type"].rsplit("/", 1)[-1] == problem_type
    return document


async def test_authorization_values_are_separate_scopes(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Without [[clients]], one key under two Authorization values is two operations."""
    one, two = bearer("one"), bearer("two")
    first_one = await gateway.post("/tickets/v1/issues", key="shared", data=b"x", headers=one)
    first_two = await gateway.post("/tickets/v1/issues", key="shared", data=b"x", headers=two)
    assert first_one.status == first_two.status == 201
    assert "Idempotent-Replayed" not in first_two.headers
    assert upstream.count == 2

    retry_two = await gateway.post("/tickets/v1/issues", key="shared", data=b"x", headers=two)
    retry_one = await gateway.post("/tickets/v1/issues", key="shared", data=b"x", headers=one)
    assert retry_one.headers["Idempotent-Replayed"] == "true"
    assert retry_two.headers["Idempotent-Replayed"] == "true"
    assert await retry_one.read() == await first_one.read()
    assert await retry_two.read() == await first_two.read()
    assert retry_one.headers["X-Effect-Id"] == "1"
    assert retry_two.headers["X-Effect-Id"] == "2"

    ids = [
        (await (await gateway.get("/operations/shared", headers=headers)).json())["id"]
        for headers in (one, two)
    ]
    assert ids[0] != ids[1]
    assert upstream.count == 2


async def test_other_credential_cannot_look_up_a_key(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A key used under one Authorization is unknown to another and to the anonymous scope."""
    response = await gateway.post(
        "/tickets/v1/issues", key="only-a", data=b"x", headers=bearer("a")
    )
    assert response.status == 201

    assert (await gateway.get("/operations/only-a", headers=bearer("a"))).status == 200
    for headers in (bearer("b"), {}):
        lookup = await gateway.get("/operations/only-a", headers=headers)
        document = await problem_of(lookup, 404, "unknown-key")
        assert document["safe_to_retry"] is False
    assert upstream.count == 1


async def test_requests_without_authorization_share_the_anonymous_scope(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Two callers without Authorization share one scope: the second gets the first's receipt."""
    first = await gateway.post("/tickets/v1/issues", key="anon", data=b"x")
    retry = await gateway.post("/tickets/v1/issues", key="anon", data=b"x")

    assert first.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert (await gateway.get("/operations/anon")).status == 200
    await problem_of(await gateway.get("/operations/anon", headers=bearer("x")), 404, "unknown-key")
    assert upstream.count == 1


async def test_authorization_is_forwarded_without_clients(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Without [[clients]] the caller's Authorization belongs to the upstream and is forwarded."""
    response = await gateway.post(
        "/tickets/v1/issues", key="fw-auth", data=b"x", headers=bearer("tool-api-token")
    )
    assert response.status == 201

    assert upstream.count == 1
    assert upstream.effects[0].headers["authorization"] == "Bearer tool-api-token"


async def test_scope_headers_choose_the_scope(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """With scope_headers = ["X-Api-Key"] the scope follows X-Api-Key, not Authorization."""
    gateway = await gateway_factory(upstream.url, idempotency={"scope_headers": ["X-Api-Key"]})

    first = await gateway.post(
        "/tickets/v1/issues", key="sh", data=b"x", headers={"X-Api-Key": "k1", **bearer("one")}
    )
    same_api_key = await gateway.post(
        "/tickets/v1/issues", key="sh", data=b"x", headers={"X-Api-Key": "k1", **bearer("two")}
    )
    other_api_key = await gateway.post(
        "/tickets/v1/issues", key="sh", data=b"x", headers={"X-Api-Key": "k2", **bearer("one")}
    )

    assert first.status == 201
    assert same_api_key.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in other_api_key.headers
    assert other_api_key.status == 201
    assert upstream.count == 2


async def test_clients_require_a_known_token(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """With [[clients]], a missing or unknown bearer token is a 401 and nothing is forwarded."""
    gateway = await gateway_factory(upstream.url, clients=CLIENTS)

    for headers in ({}, bearer("tok-unknown"), {"Authorization": "Basic dG9rLWE="}):
        response = await gateway.post(
            "/tickets/v1/issues", key="auth-1", data=b"x", headers=headers
        )
        await problem_of(response, 401, "unauthorized")
    await problem_of(await gateway.get("/operations/auth-1"), 401, "unauthorized")
    assert upstream.count == 0


async def test_client_tokens_rotate_within_one_scope(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A client's two tokens share its scope; another client with the same key does not."""
    gateway = await gateway_factory(upstream.url, clients=CLIENTS)

    first = await gateway.post("/tickets/v1/issues", key="rot", data=b"x", headers=bearer("tok-a1"))
    rotated = await gateway.post(
        "/tickets/v1/issues", key="rot", data=b"x", headers=bearer("tok-a2")
    )
    assert first.status == 201
    assert rotated.headers["Idempotent-Replayed"] == "true"
    assert await rotated.read() == await first.read()
    assert upstream.count == 1

    other = await gateway.post("/tickets/v1/issues", key="rot", data=b"x", headers=bearer("tok-b"))
    assert other.status == 201
    assert "Idempotent-Replayed" not in other.headers
    assert other.headers["X-Effect-Id"] == "2"
    assert upstream.count == 2


async def test_client_token_is_replaced_by_upstream_headers(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """The client's token never goes upstream; the route's upstream_headers do."""
    gateway = await gateway_factory(
        upstream.url,
        clients=CLIENTS,
        route={"upstream_headers": {"Authorization": "Bearer upstream-secret"}},
        extra_routes=[{"name": "plain", "prefix": "/plain", "upstream": upstream.url}],
    )

    headers = bearer("tok-a1")
    assert (await gateway.post("/tickets/a", key="up-1", data=b"x", headers=headers)).status == 201
    assert (await gateway.post("/plain/b", key="up-2", data=b"x", headers=headers)).status == 201

    assert upstream.count == 2
    with_secret, plain = upstream.effects
    assert with_secret.headers["authorization"] == "Bearer upstream-secret"
    assert "authorization" not in plain.headers
    for effect in upstream.effects:
        assert "tok-a1" not in json.dumps(effect.headers)


async def test_scope_secret_survives_a_restart(tmp_path: Path, upstream: CountingUpstream) -> None:
    """The HMAC secret is kept in the store: the same credential replays after a restart."""
    settings = settings_for(tmp_path, upstream.url)
    headers = bearer("persistent")

    first_gateway = await start_gateway(settings)
    try:
        first = await first_gateway.post(
            "/tickets/v1/issues", key="restart", data=b"x", headers=headers
        )
        body = await first.read()
        assert first.status == 201
    finally:
        await stop_gateway(first_gateway)

    second_gateway = await start_gateway(settings)
    try:
        retry = await second_gateway.post(
            "/tickets/v1/issues", key="restart", data=b"x", headers=headers
        )
        assert retry.status == 201
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert await retry.read() == body
    finally:
        await stop_gateway(second_gateway)
    assert upstream.count == 1
