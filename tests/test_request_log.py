"""The key's request log (issue "The operator's second hour").

The agent's replays and the 422 mismatch left no trace on the operation: an operator
could not see that an agent kept retrying, nor match a request id from an agent's log
to what the gateway did. Every request that carried a key is now a line of its
operation's log (`GET /admin/operations/{id}/requests`), bounded (the first 20 and
the last 80, with counts of all), and the owner's lookup counts replays and refusals.
Through real gateways, on both stores.
"""

from __future__ import annotations

import asyncio
from typing import Any

from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway
from test_cli import operation_id
from upstream import CountingUpstream

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
PATH = "/tickets/v1/issues"


async def send(
    gateway: RunningGateway, key: str, request_id: str, body: Any, path: str = PATH
) -> int:
    answer = await gateway.post(path, key=key, json_body=body, headers={"X-Request-Id": request_id})
    assert answer.headers["X-Request-Id"] == request_id
    return answer.status


async def requests_of(gateway: RunningGateway, op_id: str, total: int) -> dict[str, Any]:
    """The operation's request log once it counts `total` lines (written once a second)."""
    async with asyncio.timeout(30):
        while True:
            answer = await gateway.admin_get(f"/admin/operations/{op_id}/requests", headers=ADMIN)
            assert answer.status == 200, await answer.text()
            document: dict[str, Any] = await answer.json()
            if document["total"] >= total:
                return document
            await asyncio.sleep(0.1)


async def test_every_request_of_a_key_is_a_line_of_its_log(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store_url=store_url)
    assert await send(gateway, "k-1", "agent-r1", {"title": "a"}) == 201
    assert await send(gateway, "k-1", "agent-r2", {"title": "a"}) == 201
    assert await send(gateway, "k-1", "agent-r3", {"title": "a"}) == 201
    assert await send(gateway, "k-1", "agent-r4", {"title": "other"}) == 422
    op_id = await operation_id(gateway, "k-1")

    document = await requests_of(gateway, op_id, 4)
    lines = [
        (
            line["seq"],
            line["request_id"],
            line["status"],
            line["outcome"],
            line["replayed"],
            line["problem"],
        )
        for line in document["items"]
    ]
    assert lines == [
        (1, "agent-r1", 201, "forwarded", False, None),
        (2, "agent-r2", 201, "replayed", True, None),
        (3, "agent-r3", 201, "replayed", True, None),
        (4, "agent-r4", 422, "mismatch", False, "key-mismatch"),
    ]
    assert (document["total"], document["replays"], document["refusals"], document["omitted"]) == (
        4,
        2,
        1,
        0,
    )
    owner = await (await gateway.get("/operations/k-1")).json()
    assert owner["requests"] == {"total": 4, "replays": 2, "refusals": 1}

    # An unknown outcome and the retries it refuses are lines too.
    lost = f"{PATH}?drop=after_effect"
    assert await send(gateway, "k-2", "agent-l1", {"title": "b"}, lost) == 502
    assert await send(gateway, "k-2", "agent-l2", {"title": "b"}, lost) == 409
    document = await requests_of(gateway, await operation_id(gateway, "k-2"), 2)
    assert [(line["status"], line["outcome"], line["problem"]) for line in document["items"]] == [
        (502, "unknown", "upstream-connection-lost"),
        (409, "unknown", "outcome-unknown"),
    ]
    assert upstream.count == 2


async def test_the_log_keeps_the_first_20_and_the_last_80_lines(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    """An agent stuck in a retry loop: 130 replays after the first send. The log keeps
    how it began and what it does now, and counts everything."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store_url=store_url)
    assert await send(gateway, "loop", "r-0", {"title": "loop"}) == 201
    for n in range(1, 131):
        assert await send(gateway, "loop", f"r-{n}", {"title": "loop"}) == 201
    document = await requests_of(gateway, await operation_id(gateway, "loop"), 131)
    seqs = [line["seq"] for line in document["items"]]
    assert seqs == [*range(1, 21), *range(52, 132)]
    assert [line["request_id"] for line in document["items"]][-1] == "r-130"
    assert (document["total"], document["replays"], document["omitted"]) == (131, 130, 31)
    assert upstream.count == 1
