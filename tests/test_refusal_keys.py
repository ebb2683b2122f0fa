"""Refusals that come before any record still name the caller's key.

A body too large or too slow, a quota, a saturated route, a store that is
down: the gateway refuses before it records anything, but the answer still
concerns the key the caller sent, so it carries `Idempotency-Key`, and the
problem its `key` and lookup URL, as every answer about a key does. There
is no record, so there is no `Idempotency-Status`, and the lookup says 404.
"""

from __future__ import annotations

import asyncio
import sqlite3
from contextlib import closing
from pathlib import Path
from typing import Any

import aiohttp
from conftest import GatewayFactory
from upstream import CountingUpstream

PROBLEM = "application/problem+json"


def assert_names_the_key(
    response: aiohttp.ClientResponse, document: dict[str, Any], key: str
) -> None:
    assert response.headers["Idempotency-Key"] == key
    assert "Idempotency-Status" not in response.headers
    assert document["key"] == key
    assert document["operation"] == f"/operations/{key}"
    assert "state" not in document


async def test_413_names_the_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A body over the route's limit: 413 with the key, nothing recorded or sent."""
    gateway = await gateway_factory(upstream.url, route={"max_body": "64B"})
    refused = await gateway.post("/tickets/v1/issues", key="big-1", data=b"x" * 1024)
    assert refused.status == 413
    assert_names_the_key(refused, await refused.json(content_type=PROBLEM), "big-1")
    assert (await gateway.get("/operations/big-1")).status == 404
    assert upstream.count == 0


async def test_408_names_the_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A body that stalls: 408 with the key in its headers and its problem."""
    gateway = await gateway_factory(upstream.url, server={"client_timeout": "300ms"})
    host, port = gateway.url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(
        b"POST /tickets/v1/issues HTTP/1.1\r\nHost: x\r\nIdempotency-Key: slow-1\r\n"
        b'Content-Length: 100\r\nContent-Type: application/json\r\n\r\n{"partial": '
    )
    await writer.drain()
    answer = (await asyncio.wait_for(reader.read(65536), 5)).decode()
    writer.close()
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 408 ")
    assert "\r\nIdempotency-Key: slow-1\r\n" in head + "\r\n"
    assert "Idempotency-Status" not in head
    assert '"key": "slow-1"' in body
    assert upstream.count == 0


async def test_429_names_the_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A scope past its new-key rate: 429 quota-exceeded with the key."""
    gateway = await gateway_factory(upstream.url, quotas={"new_keys_per_minute": 1})
    assert (await gateway.post("/tickets/v1/issues", key="q-1", json_body={})).status == 201
    refused = await gateway.post("/tickets/v1/issues", key="q-2", json_body={})
    assert refused.status == 429
    assert_names_the_key(refused, await refused.json(content_type=PROBLEM), "q-2")
    assert upstream.count == 1


async def test_route_saturated_names_the_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """A route at its concurrency limit: 503 route-saturated with the key, not recorded."""
    gateway = await gateway_factory(upstream.url, route={"max_concurrency": 1})
    slow = asyncio.create_task(
        gateway.post("/tickets/v1/issues?delay=0.5", key="busy-1", json_body={})
    )
    await upstream.wait_for_count(1)
    refused = await gateway.post("/tickets/v1/issues", key="busy-2", json_body={})
    assert refused.status == 503
    document = await refused.json(content_type=PROBLEM)
    assert document["type"].endswith("/route-saturated")
    assert_names_the_key(refused, document, "busy-2")
    assert (await slow).status == 201
    assert (await gateway.get("/operations/busy-2")).status == 404


async def test_store_unavailable_names_the_key(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """The store cannot record the claim (another process holds its write lock): 503
    store-unavailable with the key, and nothing sent."""
    gateway = await gateway_factory(upstream.url, store={"busy_timeout": "200ms"})
    with closing(sqlite3.connect(tmp_path / "gateway.db", isolation_level=None)) as holder:
        holder.execute("BEGIN IMMEDIATE")  # an operator's shell, a backup
        try:
            refused = await gateway.post("/tickets/v1/issues", key="down-1", json_body={})
        finally:
            holder.execute("ROLLBACK")
    assert refused.status == 503
    document = await refused.json(content_type=PROBLEM)
    assert document["type"].endswith("/store-unavailable")
    assert refused.headers["Idempotency-Key"] == "down-1"
    assert document["key"] == "down-1"
    assert document["operation"] == "/operations/down-1"
    assert upstream.count == 0
