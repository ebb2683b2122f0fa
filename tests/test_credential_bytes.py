"""Scopes are derived from the credential's exact bytes (security review, findings 4 and 13).

Two different credentials must never share a scope, whatever characters they
hold: hashed through a lossy `latin-1, replace` encoding, `Bearer s3cr€T` and
`Bearer s3cr™T` were one scope and replayed each other's receipts. And a
credential that is not UTF-8 is an odd credential, not a server error. The
bytes are sent raw, so no client library changes them.
"""

from __future__ import annotations

import hashlib
import json

from conftest import GatewayFactory
from rawhttp import RawResponse, address_of, exchange, request
from upstream import CountingUpstream


def post(authorization: bytes, key: str = "order-7") -> bytes:
    """A POST with an Authorization header of exactly these bytes."""
    head = request(
        "POST",
        "/tickets/v1/issues",
        [("Idempotency-Key", key), ("Content-Type", "application/json")],
        b'{"n": 1}',
    )
    line_end = head.index(b"\r\n") + 2
    return head[:line_end] + b"Authorization: " + authorization + b"\r\n" + head[line_end:]


def replayed(answer: RawResponse) -> bool:
    return answer.header("Idempotent-Replayed") == "true"


async def test_credentials_that_differ_only_outside_latin_1_are_two_scopes(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """The same key under `Bearer s3cr€T` and `Bearer s3cr™T` is two operations."""
    gateway = await gateway_factory(upstream.url)
    address = address_of(gateway.url)
    euro = await exchange(address, post("Bearer s3cr€T".encode()))
    trade = await exchange(address, post("Bearer s3cr™T".encode()))
    assert (euro.status, trade.status) == (201, 201), (euro.body, trade.body)
    assert not replayed(trade)
    assert upstream.count == 2
    again = await exchange(address, post("Bearer s3cr€T".encode()))
    assert replayed(again)
    assert again.body == euro.body


async def test_credentials_that_are_not_utf_8_are_their_own_scopes_not_errors(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """`Bearer \\xff\\xfe` and `Bearer \\xfe\\xff` are two scopes, and neither is a 500."""
    gateway = await gateway_factory(upstream.url)
    address = address_of(gateway.url)
    first = await exchange(address, post(b"Bearer \xff\xfe"))
    second = await exchange(address, post(b"Bearer \xfe\xff"))
    for answer in (first, second):
        assert answer.status is not None
        assert answer.status < 500, (answer.status, answer.body[:300])
    if first.status == 201:
        assert not replayed(second)


async def test_a_client_token_that_is_not_utf_8_is_401_not_500(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """With [[clients]], an undecodable bearer token is an unknown token: 401."""
    clients = [{"name": "agent-a", "token_sha256": [hashlib.sha256(b"tok-a").hexdigest()]}]
    gateway = await gateway_factory(upstream.url, clients=clients)
    answer = await exchange(address_of(gateway.url), post(b"Bearer \xff\xfe"))
    assert answer.status == 401, (answer.status, answer.body[:300])
    assert json.loads(answer.body)["type"].endswith("/unauthorized")
    assert upstream.count == 0


async def test_an_admin_token_that_is_not_utf_8_is_401_not_500(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """The admin API compares the offered bytes: an undecodable token is just wrong."""
    gateway = await gateway_factory(upstream.url, admin={"token": "Zq4-7hL2pW9xR1vT8mK3nB6c"})
    head = request("GET", "/admin/operations")
    line_end = head.index(b"\r\n") + 2
    raw = head[:line_end] + b"Authorization: Bearer \xff\xfe\r\n" + head[line_end:]
    assert gateway.admin_url is not None
    answer = await exchange(address_of(gateway.admin_url), raw)
    assert answer.status == 401, (answer.status, answer.body[:300])
