"""Problem details never carry the gateway's insides (security review, finding 12).

Internal host names and addresses, SQL and driver text go to the request's log
line; the problem carries the request id so an operator can find that line.
"""

from __future__ import annotations

import logging

import asyncpg
import pytest
from conftest import GatewayFactory
from pg import drop_schema, fresh_schema, require_postgres, url_for
from upstream import CountingUpstream

CLOSED_PORT_UPSTREAM = "http://127.0.0.1:1"


async def test_an_unreachable_upstream_is_not_named_to_the_caller(
    gateway_factory: GatewayFactory, caplog: pytest.LogCaptureFixture
) -> None:
    """502 upstream-unreachable says which route, not which host and port; the log does."""
    gateway = await gateway_factory(CLOSED_PORT_UPSTREAM)
    with caplog.at_level(logging.INFO):
        answer = await gateway.post("/tickets/v1/issues", key="k1", json_body={})
    problem = await answer.json(content_type=None)
    assert answer.status == 502
    assert problem["type"].endswith("/upstream-unreachable")
    assert "127.0.0.1" not in problem["detail"]
    assert ":1" not in problem["detail"]
    assert problem["request_id"] == answer.headers["X-Request-Id"]
    logged = [r for r in caplog.records if getattr(r, "request_id", None) == problem["request_id"]]
    assert any("127.0.0.1" in str(getattr(r, "error", "")) for r in logged), logged


@pytest.mark.postgres
async def test_a_failing_store_is_not_described_to_the_caller(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """503 store-unavailable carries no SQL or driver text, and nothing is forwarded."""
    require_postgres()
    schema = await fresh_schema()
    try:
        gateway = await gateway_factory(upstream.url, store_url=url_for(schema))
        connection = await asyncpg.connect(url_for(schema))
        try:
            await connection.execute("ALTER TABLE operations RENAME TO operations_gone")
        finally:
            await connection.close()
        answer = await gateway.post("/tickets/v1/issues", key="k2", json_body={})
        problem = await answer.json(content_type=None)
        assert answer.status == 503, problem
        assert problem["type"].endswith("/store-unavailable")
        for leak in ("relation", "operations", "PostgreSQL", "asyncpg", "SELECT", "INSERT"):
            assert leak not in problem["detail"], problem["detail"]
        assert problem["request_id"] == answer.headers["X-Request-Id"]
        assert upstream.count == 0
    finally:
        await drop_schema(schema)


async def test_request_ids_are_random_not_a_count_of_other_callers_requests(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Two ids a caller sees tell nothing of the requests other callers made in between
    (security review, finding 7): 64 random bits each, no shared prefix, no order."""
    gateway = await gateway_factory(upstream.url)
    ids = [(await gateway.get("/healthz")).headers["X-Request-Id"] for _ in range(40)]
    assert all(len(value) == 16 and int(value, 16) >= 0 for value in ids), ids
    assert len(set(ids)) == len(ids)
    assert len({value[:8] for value in ids}) > 30  # no per-process prefix
    numbers = [int(value, 16) for value in ids]
    assert numbers != sorted(numbers)  # not a counter (one chance in 40! to be sorted)
    # An id the caller offers (sane) is kept, for joining its own logs.
    offered = await gateway.get("/healthz", headers={"X-Request-Id": "agent-7-call-3"})
    assert offered.headers["X-Request-Id"] == "agent-7-call-3"
