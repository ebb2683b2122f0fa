"""TRACE and CONNECT are never forwarded (security review, finding 5).

TRACE would reflect the request the upstream received, the route's upstream
credentials included, to an agent that must never hold them; CONNECT would
open a tunnel through a gateway that is not an open proxy. Both get `405
method-not-allowed` on every path, sent as raw bytes so no client library
changes them on the way. (A lower-case `trace` is not a method token aiohttp's
parser accepts: it answers its own plain 400, and nothing is forwarded either.)
"""

from __future__ import annotations

import json

import pytest
from conftest import GatewayFactory
from rawhttp import address_of, exchange, request
from upstream import CountingUpstream


@pytest.mark.parametrize(
    ("method", "target"),
    [
        ("TRACE", "/tickets/v1/issues"),
        ("TRACE", "/healthz"),
        ("CONNECT", "/tickets/v1/issues"),
        ("CONNECT", "127.0.0.1:9"),
    ],
)
async def test_trace_and_connect_are_refused_and_never_forwarded(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, method: str, target: str
) -> None:
    """405 method-not-allowed, a problem body, and nothing reaches the upstream."""
    gateway = await gateway_factory(
        upstream.url, route={"upstream_headers": {"Authorization": "Bearer tool-secret"}}
    )
    answer = await exchange(address_of(gateway.url), request(method, target))
    assert answer.status == 405, (answer.status, answer.body[:300])
    problem = json.loads(answer.body)
    assert problem["type"].endswith("/method-not-allowed")
    assert problem["safe_to_retry"] is False
    assert b"tool-secret" not in answer.body
    assert upstream.count == 0
