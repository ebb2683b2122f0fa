"""The forwarded key is per scope: two tenants with one key are two effects upstream.

Security finding 1: tenant A creates `order-7`; tenant B's own `order-7`
becomes `unknown`; B's lookup ran the route's probe with the caller's key,
found A's effect and settled B's operation `completed` with A's body. Both
tenants' requests also reached the upstream with the same `Idempotency-Key`,
so an upstream that dedupes answered B with A's object.

The forwarded key (route `forward_key`) is now one value per operation,
different in every scope: "operation_id" (the default), "scoped"
(`<label>:<key>`), and "key" only where a single scope can reach the route.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import RunningGateway, calibration_sample
from upstream import CountingUpstream, effects_probe

from gateway.config import load_settings
from gateway.engine.errors import ConfigError

ISSUES = "/tickets/v1/issues"
PROBE = effects_probe(not_applied_after="300ms")
TENANT_A = {"Authorization": "Bearer tenant-a-credential"}
TENANT_B = {"Authorization": "Bearer tenant-b-credential"}


def sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


CLIENTS = [
    {"name": "agent-a", "token_sha256": [sha256("tok-a")]},
    {"name": "agent-b", "token_sha256": [sha256("tok-b")]},
]
AGENT_A = {"Authorization": "Bearer tok-a"}
AGENT_B = {"Authorization": "Bearer tok-b"}


async def lookup(gateway: RunningGateway, key: str, headers: dict[str, str]) -> dict[str, Any]:
    response = await gateway.get(f"/operations/{key}", headers=headers)
    assert response.status == 200, await response.text()
    document: dict[str, Any] = await response.json()
    return document


async def test_a_tenants_probe_never_adopts_another_tenants_effect(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """B's `unknown` order-7 is probed by B's forwarded key: A's effect is never B's receipt."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": PROBE, "timeout": "1s"},
        idempotency={"shared_scope": False, "lease": "1s"},  # the grace counts from its end
    )
    created = await gateway.post(
        ISSUES, key="order-7", json_body={"card": "A's private data"}, headers=TENANT_A
    )
    assert created.status == 201
    # B's probe is calibrated on B's own completed effects, never on A's.
    await calibration_sample(gateway.session, gateway.url, headers=TENANT_B)
    lost = await gateway.post(
        ISSUES + "?drop=before_effect", key="order-7", json_body={"card": "B"}, headers=TENANT_B
    )
    assert lost.status == 502
    assert lost.headers["Idempotency-Status"] == "unknown"

    seen: list[dict[str, Any]] = []
    async with asyncio.timeout(60):  # bounds a hang only: the release is awaited
        while not seen or seen[-1]["state"] == "unknown":
            await asyncio.sleep(0.2)
            seen.append(await lookup(gateway, "order-7", TENANT_B))
    assert seen[-1]["state"] == "released", seen[-1]
    assert seen[-1]["resolution"]["by"] == "probe"
    for document in seen:
        assert "A's private data" not in json.dumps(document)
    assert upstream.probes, "the probe was never asked"
    assert upstream.count == 2  # A's effect and B's sample; B's order-7 never arrived
    assert (await lookup(gateway, "order-7", TENANT_A))["state"] == "completed"


@pytest.mark.parametrize(
    ("mode", "headers", "clients"),
    [
        pytest.param("operation_id", (TENANT_A, TENANT_B), None, id="operation_id"),
        pytest.param("scoped", (TENANT_A, TENANT_B), None, id="scoped-hmac"),
        pytest.param("scoped", (AGENT_A, AGENT_B), CLIENTS, id="scoped-clients"),
    ],
)
async def test_two_scopes_with_one_key_forward_two_different_keys(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    mode: str,
    headers: tuple[dict[str, str], dict[str, str]],
    clients: list[dict[str, Any]] | None,
) -> None:
    """An upstream that dedupes on Idempotency-Key sees two effects, never one; each key
    forwards the same value on every attempt (a released 429, then the retry)."""
    gateway = await gateway_factory(
        upstream.url,
        route={"forward_key": mode},
        idempotency={"shared_scope": False},
        clients=clients,
    )
    for caller in headers:
        refused = await gateway.post(
            ISSUES + "?status=429", key="order-7", data=b"{}", headers=caller
        )
        assert refused.status == 429
        upstream.script.append({"status": "201"})
        retried = await gateway.post(
            ISSUES + "?status=429", key="order-7", data=b"{}", headers=caller
        )
        assert retried.status == 201
    keys = [effect.key for effect in upstream.effects]
    assert len(keys) == 4
    assert keys[0] == keys[1] != keys[2] == keys[3]
    assert all(key is not None and len(key) <= 255 for key in keys)


async def test_scoped_keys_are_readable_and_bounded(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """`<client name>:<key>` with [[clients]]; a key too long for that is hashed, still
    under 255 characters; the probe asks for exactly what was sent."""
    gateway = await gateway_factory(
        upstream.url, route={"forward_key": "scoped", "probe": PROBE}, clients=CLIENTS
    )
    long_key = "k" * 255
    for key in ("order-7", long_key):
        assert (await gateway.post(ISSUES, key=key, data=b"{}", headers=AGENT_A)).status == 201
    short, hashed = (effect.key or "" for effect in upstream.effects)
    assert short == "agent-a:order-7"
    digest = hashlib.sha256(long_key.encode()).digest()
    assert hashed == "agent-a:~" + base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
    assert len(hashed) <= 255


async def test_scoped_keys_without_clients_carry_a_keyed_label(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """In HMAC mode the label is 22 base64url characters, never the credential or the
    scope digest the store keeps, and the same for every key of one credential."""
    gateway = await gateway_factory(
        upstream.url, route={"forward_key": "scoped"}, idempotency={"shared_scope": False}
    )
    for key in ("k1", "k2"):
        assert (await gateway.post(ISSUES, key=key, data=b"{}", headers=TENANT_A)).status == 201
    first, second = (effect.key or "" for effect in upstream.effects)
    assert re.fullmatch(r"[A-Za-z0-9_-]{22}:k1", first), first
    assert second == first[:22] + ":k2"
    assert "tenant-a" not in first


async def test_a_route_open_to_some_clients_refuses_the_others(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Route `clients = ["agent-a"]`: agent-b gets 403 client-not-allowed, nothing is
    forwarded or recorded; agent-a's key may then go upstream as it came."""
    gateway = await gateway_factory(
        upstream.url, route={"clients": ["agent-a"], "forward_key": "key"}, clients=CLIENTS
    )
    refused = await gateway.post(ISSUES, key="order-7", data=b"{}", headers=AGENT_B)
    assert refused.status == 403
    problem = await refused.json()
    assert problem["type"].rsplit("/", 1)[-1] == "client-not-allowed"
    assert problem["safe_to_retry"] is False
    unprotected = await gateway.get("/tickets/v1/issues", headers=AGENT_B)
    assert unprotected.status == 403
    assert upstream.count == 0
    missing = await gateway.get("/operations/order-7", headers=AGENT_B)
    assert missing.status == 404

    assert (await gateway.post(ISSUES, key="order-7", data=b"{}", headers=AGENT_A)).status == 201
    assert [effect.key for effect in upstream.effects] == ["order-7"]


def load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "gateway.toml"
    path.write_text(text)
    return load_settings(path, environ={})


ROUTE = '[[routes]]\nname = "{name}"\nprefix = "/{name}"\nupstream = "{upstream}"\n'
TWO_CLIENTS = "".join(
    f'[[clients]]\nname = "{client["name"]}"\ntoken_sha256 = ["{client["token_sha256"][0]}"]\n'
    for client in CLIENTS
)


def route(name: str, extra: str = "", upstream: str = "http://127.0.0.1:9000") -> str:
    return ROUTE.format(name=name, upstream=upstream) + extra


@pytest.mark.parametrize(
    ("text", "message"),
    [
        pytest.param(
            route("billing", 'forward_key = "key"\n'),
            'routes[0].forward_key: "key" forwards the caller\'s key as it came',
            id="key-with-hmac-scopes",
        ),
        pytest.param(
            route("billing", "forward_key = true\n"),
            'routes[0].forward_key: "key" forwards',
            id="old-true-gets-the-same-check",
        ),
        pytest.param(
            TWO_CLIENTS + route("billing", 'forward_key = "key"\n'),
            "routes[0].forward_key:",
            id="key-with-two-clients",
        ),
        pytest.param(
            TWO_CLIENTS
            + route("billing", 'forward_key = "key"\nclients = ["agent-a"]\n')
            + route("refunds", 'clients = ["agent-b"]\n', "http://127.0.0.1:9000/refunds"),
            "routes[0].forward_key:",
            id="key-with-another-client-on-the-same-origin",
        ),
        pytest.param(
            TWO_CLIENTS + route("billing", 'clients = ["agent-c"]\n'),
            "routes[0].clients[0]: no [[clients]] entry is named 'agent-c'",
            id="unknown-client",
        ),
        pytest.param(
            route("billing", 'clients = ["agent-a"]\n'),
            "routes[0].clients: names clients, but no [[clients]] are configured",
            id="clients-without-clients",
        ),
        pytest.param(
            TWO_CLIENTS + route("billing", 'forward_key = "bogus"\n'),
            "routes[0].forward_key: invalid forward_key 'bogus'",
            id="unknown-mode",
        ),
    ],
)
def test_configs_that_would_merge_scopes_upstream_are_refused(
    tmp_path: Path, text: str, message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert message in str(caught.value), str(caught.value)


@pytest.mark.parametrize(
    "text",
    [
        pytest.param(
            TWO_CLIENTS
            + route("billing", 'forward_key = "key"\nclients = ["agent-a"]\n')
            + route("refunds", 'clients = ["agent-b"]\n', "http://127.0.0.1:9001"),
            id="one-client-per-origin",
        ),
        pytest.param(
            TWO_CLIENTS[: TWO_CLIENTS.index("[[clients]]", 1)]
            + route("billing", "forward_key = true\n"),
            id="a-single-client",
        ),
        pytest.param(
            "[idempotency]\nscope_headers = []\nshared_scope = true\n"
            + route("billing", 'forward_key = "key"\n'),
            id="everyone-in-one-scope",
        ),
    ],
)
def test_key_mode_is_accepted_where_one_scope_reaches_the_origin(tmp_path: Path, text: str) -> None:
    assert load(tmp_path, text).routes[0].forward_key == "key"


async def test_forwarded_header_is_the_gateways_alone(
    gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Two caller key headers never reach the upstream as a list: one forwarded value."""
    async with aiohttp.ClientSession() as session:
        response = await session.post(
            gateway.url + ISSUES, data=b"{}", headers={"Idempotency-Key": "one-value"}
        )
        assert response.status == 201
    (effect,) = upstream.effects
    assert effect.headers["idempotency-key"] == effect.key
    assert effect.key is not None
    assert effect.key.startswith("op_")


@pytest.mark.parametrize(
    "spelling",
    [
        "http://localhost:9000",
        "http://127.0.0.1.:9000",
        "http://[::ffff:127.0.0.1]:9000",
        "http://2130706433:9000",
        "http://127.1:9000",
        "http://0x7f000001:9000",
        "HTTP://127.0.0.1:9000",
    ],
)
def test_key_mode_sees_one_origin_however_its_address_is_spelled(
    tmp_path: Path, spelling: str
) -> None:
    """Two routes to one upstream, written `127.0.0.1` and another spelling, are one
    origin (security review, finding 5): `"key"` on one of them is refused while another
    client reaches the other."""
    text = (
        TWO_CLIENTS
        + route("billing", 'forward_key = "key"\nclients = ["agent-a"]\n')
        + route("refunds", 'clients = ["agent-b"]\n', spelling)
    )
    with pytest.raises(ConfigError) as caught:
        load(tmp_path, text)
    assert "routes[0].forward_key" in str(caught.value)
