"""Attaching a missing receipt, once (issue "The operator's second hour": a slip is
permanent).

`resolve --applied --note x` without `--status` succeeded, then warned that retries will
get `409 receipt-not-retained` for ever; re-resolving was refused. The receipt can now
be attached later, once, through `POST /admin/operations/{id}/receipt` or `operations
attach`, recorded in the history; every other operation refuses it. On both stores.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway
from test_cli import DROP, admin, cli, complete, make_unknown, operation_id
from upstream import CountingUpstream

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Admin-Actor": "ann"}
TICKET = {"status": 201, "headers": {"content-type": "application/json"}, "body": '{"id": "T-9"}'}


async def admin_post(
    gateway: RunningGateway, path: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    assert gateway.admin_url is not None
    async with gateway.session.post(
        gateway.admin_url + path, json=body, headers={**ADMIN, **(headers or {})}
    ) as answer:
        return answer.status, await answer.json(content_type=None)


async def settled_without_receipt(gateway: RunningGateway, key: str) -> str:
    """An unknown operation settled `applied` with no response: its id."""
    await make_unknown(gateway, key)
    op_id = await operation_id(gateway, key)
    status, document = await admin_post(
        gateway,
        f"/admin/operations/{op_id}/resolve",
        {"outcome": "applied", "note": "the ticket exists; its answer was lost"},
    )
    assert (status, document["state"], document["response"]) == (200, "completed", None)
    return op_id


async def retry(gateway: RunningGateway, key: str) -> tuple[int, bytes, str | None]:
    answer = await gateway.post(DROP, key=key, json_body={"title": key})
    return answer.status, await answer.read(), answer.headers.get("Idempotent-Replayed")


async def test_a_missing_receipt_is_attached_once_and_replayed(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store_url=store_url)
    op_id = await settled_without_receipt(gateway, "slip-1")
    status, _, _ = await retry(gateway, "slip-1")
    assert status == 409  # receipt-not-retained: the slip

    status, document = await admin_post(
        gateway,
        f"/admin/operations/{op_id}/receipt",
        {"response": TICKET, "note": "T-9 found in the ticket API"},
    )
    assert status == 200, document
    assert document["state"] == "completed"
    assert document["response"]["status"] == 201
    attached = [event for event in document["history"] if event["type"] == "receipt-attached"]
    assert len(attached) == 1
    assert (attached[0]["actor"], attached[0]["status"]) == ("admin:ann", 201)
    assert attached[0]["note"] == "T-9 found in the ticket API"

    assert await retry(gateway, "slip-1") == (201, b'{"id": "T-9"}', "true")

    # Once: a second receipt is refused, and the first stays.
    status, problem = await admin_post(
        gateway,
        f"/admin/operations/{op_id}/receipt",
        {"response": {**TICKET, "body": '{"id": "T-10"}'}, "note": "another"},
    )
    assert (status, problem["type"].rsplit("/", 1)[-1]) == (409, "not-resolvable")
    assert await retry(gateway, "slip-1") == (201, b'{"id": "T-9"}', "true")

    # The owner reads that an operator attached it, not who, nor the note.
    owner = await (await gateway.get("/operations/slip-1")).json()
    (seen,) = [event for event in owner["history"] if event["type"] == "receipt-attached"]
    assert seen["actor"] == "an operator"
    assert "note" not in seen
    assert upstream.count == 1


async def test_only_a_receipt_less_settlement_takes_one(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    """An operation completed by the upstream, an unknown one, and a released one refuse
    an attachment (409, nothing changed); a missing note is 400, a stale If-Match 412."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store_url=store_url)
    await complete(gateway, "done")
    await make_unknown(gateway, "lost")
    body = {"response": TICKET, "note": "n"}
    for key in ("done", "lost"):
        op_id = await operation_id(gateway, key)
        status, problem = await admin_post(gateway, f"/admin/operations/{op_id}/receipt", body)
        assert (status, problem["type"].rsplit("/", 1)[-1]) == (409, "not-resolvable"), key
        assert "only an operation settled applied without a receipt" in problem["detail"]

    op_id = await settled_without_receipt(gateway, "slip-2")
    for bad in ({"response": TICKET}, {"response": TICKET, "note": " "}, {"note": "n"}):
        status, problem = await admin_post(gateway, f"/admin/operations/{op_id}/receipt", bad)
        assert status == 400, (bad, problem)
    status, problem = await admin_post(
        gateway, f"/admin/operations/{op_id}/receipt", body, headers={"If-Match": f'"{op_id}.1"'}
    )
    assert status == 412, problem
    assert (await retry(gateway, "slip-2"))[0] == 409  # still no receipt
    assert upstream.count == 3


async def test_the_cli_attaches_with_the_resolve_guard_rails(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`operations attach` needs a note and a whole receipt (a body, or `--empty-body`),
    then attaches it; the resolve that made the slip said how to mend it."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN})
    await make_unknown(gateway, "slip-3")
    argv = admin(gateway, "resolve", "slip-3", "--applied", "--no-receipt", "--note", "exists")
    assert await cli(argv) == 0
    assert "operations attach" in capsys.readouterr().err

    for options in (
        ["--status", "201", "--body", "x"],  # no note
        ["--note", "found"],  # no status
        ["--status", "201", "--note", "found"],  # an empty body, unsaid
    ):
        assert await cli(admin(gateway, "attach", "slip-3", *options)) == 2, options
    assert (await retry(gateway, "slip-3"))[0] == 409
    capsys.readouterr()

    argv = admin(
        gateway, "attach", "slip-3", "--status", "201", "--body", '{"id": "T-3"}',
        "--header", "Content-Type: application/json", "--note", "T-3 in the ticket API",
    )  # fmt: skip
    assert await cli(argv) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["response"]["status"] == 201
    assert await retry(gateway, "slip-3") == (201, b'{"id": "T-3"}', "true")
    assert await cli(argv) == 1  # once
    assert "409 not-resolvable" in capsys.readouterr().err
    assert upstream.count == 1


async def test_two_operators_attaching_at_once_store_one_receipt(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    """Two operators attach different receipts at the same moment, neither with If-Match:
    one is stored and replayed, the other is refused (409, nothing changed), and the
    history holds one `receipt-attached`, the winner's."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store_url=store_url)
    for round_ in range(5):
        key = f"race-{round_}"
        op_id = await settled_without_receipt(gateway, key)
        bodies = [f'{{"id": "T-{round_}-{side}"}}' for side in ("a", "b")]
        answers = await asyncio.gather(
            *(
                admin_post(
                    gateway,
                    f"/admin/operations/{op_id}/receipt",
                    {"response": {**TICKET, "body": body}, "note": f"found {body}"},
                )
                for body in bodies
            )
        )
        statuses = sorted(status for status, _ in answers)
        assert statuses == [200, 409], answers
        (winner,) = [document for status, document in answers if status == 200]
        stored = winner["response"]["body"]
        assert await retry(gateway, key) == (201, stored.encode(), "true")
        attached = [e for e in winner["history"] if e["type"] == "receipt-attached"]
        assert [event["note"] for event in attached] == [f"found {stored}"]
    assert upstream.count == 5
