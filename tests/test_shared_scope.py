"""Nobody lands in a shared scope by accident (security review, finding 15).

Without `[[clients]]`, a request's scope is an HMAC of its `scope_headers`. A
request that carries none of them would share one anonymous scope with every
other such caller, reading and replaying their receipts; and
`scope_headers = []` would put everyone in one scope. Both need
`shared_scope = true`, said on purpose.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import GatewayFactory
from upstream import CountingUpstream

from gateway.config import load_settings
from gateway.engine.errors import ConfigError


async def test_a_request_without_credentials_is_401_missing_credentials(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """No Authorization (the default scope header): 401, nothing recorded or forwarded."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": False})
    answer = await gateway.post("/tickets/v1/issues", key="k1", json_body={})
    problem = json.loads(await answer.read())
    assert answer.status == 401
    assert problem["type"].endswith("/missing-credentials")
    assert "Authorization" in problem["detail"]
    assert upstream.count == 0
    lookup = await gateway.get("/operations/k1")
    assert lookup.status == 401


async def test_with_shared_scope_callers_without_credentials_share_one_scope(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """`shared_scope = true`: anonymous callers are served, in one scope."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": True})
    first = await gateway.post("/tickets/v1/issues", key="k2", json_body={})
    again = await gateway.post("/tickets/v1/issues", key="k2", json_body={})
    assert first.status == 201
    assert again.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1


def test_no_scope_headers_without_shared_scope_is_refused(tmp_path: Path) -> None:
    """`scope_headers = []` puts everyone in one scope: refused unless said on purpose."""
    path = tmp_path / "gateway.toml"
    path.write_text("[idempotency]\nscope_headers = []\n")
    with pytest.raises(ConfigError) as refused:
        load_settings(path, environ={})
    assert "idempotency.scope_headers" in str(refused.value)
    assert "shared_scope" in str(refused.value)
    path.write_text("[idempotency]\nscope_headers = []\nshared_scope = true\n")
    assert load_settings(path, environ={}).idempotency.shared_scope


@pytest.mark.parametrize("value", ["", "   ", "Bearer", "Bearer   ", "bearer \t"])
async def test_an_empty_credential_is_no_credential(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, value: str
) -> None:
    """An agent whose token variable is unset sends `Authorization:` with nothing (or only a
    scheme) in it: 401 missing-credentials, not a scope shared with every such agent."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": False})
    answer = await gateway.post(
        "/tickets/v1/issues", key="k1", json_body={}, headers={"Authorization": value}
    )
    problem = json.loads(await answer.read())
    assert answer.status == 401, problem
    assert problem["type"].endswith("/missing-credentials")
    assert upstream.count == 0


async def test_with_shared_scope_an_empty_credential_is_the_anonymous_scope(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """`shared_scope = true`: a blank credential is served in the anonymous scope, the one
    callers without the header share (not a scope of its own)."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": True})
    first = await gateway.post("/tickets/v1/issues", key="k3", json_body={"n": 3})
    blank = await gateway.post(
        "/tickets/v1/issues", key="k3", json_body={"n": 3}, headers={"Authorization": "Bearer "}
    )
    assert first.status == 201
    assert blank.headers["Idempotent-Replayed"] == "true"
    assert upstream.count == 1
