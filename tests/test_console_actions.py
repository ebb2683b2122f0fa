"""What the console offers each role, and attaching a missing receipt (issue "The
operator's second hour"), in a real headless Chromium.

An operation settled `applied` without a receipt refused its retries with
`receipt-not-retained` for ever; the console now offers to attach the tool's
answer, once, with the same empty-body guard as a settlement. A named token's role
bounds what the page offers (a viewer reads, an operator settles but neither forces
nor redacts), so nobody fills a form the gateway would refuse. Screenshots at 1280
and 390 px go to the test's `screenshots/` folder.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from conftest import GatewayFactory
from console_browser import ConsolePage
from harness import ADMIN_TOKEN, RunningGateway
from selenium import webdriver
from test_admin_roles import NAMES, TOKENS, named_tokens
from test_cli import DROP, make_unknown, operation_id
from test_console import ADMIN, admin_operation, chromium  # noqa: F401 (the browser fixture)
from upstream import CountingUpstream


async def settled_applied_without_receipt(gateway: RunningGateway, key: str) -> str:
    """An unknown operation an operator settled `applied` with no response: its id."""
    await make_unknown(gateway, key)
    op_id = await operation_id(gateway, key)
    assert gateway.admin_url is not None
    async with gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{op_id}/resolve",
        json={"outcome": "applied", "note": "the ticket exists; its answer was lost"},
        headers=ADMIN,
    ) as answer:
        assert answer.status == 200, await answer.text()
    return op_id


async def retry(gateway: RunningGateway, key: str) -> tuple[int, Any, str | None]:
    answer = await gateway.post(DROP, key=key, json_body={"title": key})
    return answer.status, json.loads(await answer.read()), answer.headers.get("Idempotent-Replayed")


async def form_state(page: ConsolePage) -> dict[str, Any]:
    state: dict[str, Any] = await page.script(
        "const f = document.getElementById('resolve-form');"
        "return {hidden: f.hidden, mode: f.dataset.mode,"
        " title: document.getElementById('resolve-title').textContent,"
        " outcome: document.getElementById('outcome-fields').hidden,"
        " receipt: document.getElementById('receipt-fields').disabled};"
    )
    return state


async def test_a_missing_receipt_is_attached_once_from_the_console(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,  # noqa: F811
    tmp_path: Path,
) -> None:
    """The page offers the attach form only where a receipt may still be attached, refuses
    an empty body as a settlement does, and once attached the retry replays it and the
    form is gone."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN, "port": 0})
    assert gateway.admin_url is not None
    op_id = await settled_applied_without_receipt(gateway, "slip-c1")
    status, problem, _ = await retry(gateway, "slip-c1")
    assert (status, problem["type"].rsplit("/", 1)[-1]) == (409, "receipt-not-retained")

    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN, actor="ann")
    await page.wait_text("resolve-form", "Attach the missing receipt")
    assert await form_state(page) == {
        "hidden": False, "mode": "attach", "title": "Attach the missing receipt",
        "outcome": True, "receipt": False,
    }  # fmt: skip
    await page.screenshots("attach-form")

    await page.fill_receipt(note="from the tool's audit log", wait=False)
    await page.wait_text("action-error", "The receipt's body is empty")
    assert (await admin_operation(gateway, op_id))["response"] is None
    await page.screenshots("attach-empty-refused")

    await page.fill_receipt(status=201, body='{"id": "T-9"}', note="from the tool's audit log")
    result = await page.wait_text("action-result", "Attached the receipt to slip-c1")
    assert "retries now get status 201" in result
    operation = await admin_operation(gateway, op_id)
    assert (operation["response"]["status"], operation["response"]["body"]) == (
        201,
        '{"id": "T-9"}',
    )
    assert await form_state(page) == {
        "hidden": True, "mode": "", "title": "Settle this unknown operation",
        "outcome": False, "receipt": True,
    }  # fmt: skip
    history = await page.history(until=lambda events: events[-1]["type"] == "receipt-attached")
    assert "ann" in history[-1]["text"]
    await page.screenshots("attached")

    assert await retry(gateway, "slip-c1") == (201, {"id": "T-9"}, "true")
    assert [line for line in await page.console_errors() if op_id in line] == []


async def test_each_role_is_offered_what_it_may_do(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,  # noqa: F811
    tmp_path: Path,
) -> None:
    """A viewer reads and is told why nothing can be done; an operator settles, but a
    too-early release says force needs an admin instead of offering it, and the history
    names the operator's token."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": None},
        admin={"tokens": named_tokens(), "port": 0},
    )
    assert gateway.admin_url is not None
    await make_unknown(gateway, "role-1")
    op_id = await operation_id(gateway, "role-1")
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")

    await page.open(f"#/op/{op_id}")
    await page.sign_in(TOKENS["viewer"])
    notice = await page.wait_text("read-only", "has the role viewer")
    assert NAMES["viewer"] in notice
    assert await page.wait_text("signed-in-as", f"Signed in as {NAMES['viewer']} (viewer)")
    for hidden in ("resolve-form", "redact-form", "probe-box"):
        assert not await page.displayed(hidden), hidden
    await page.screenshots("viewer")

    await page.click("sign-out")
    await page.open(f"#/op/{op_id}")
    await page.sign_in(TOKENS["operator"])
    await page.wait_text("read-only", "a forced release and a redaction need the role admin")
    assert await page.displayed("resolve-form")
    assert not await page.displayed("redact-form")
    await page.settle("not_applied", note="no ticket in the tool", wait=False)
    refusal = await page.wait_text("action-error", "Not released")
    assert "A forced release needs the role admin." in refusal
    assert not await page.displayed("force-step")
    as_ada = {"Authorization": f"Bearer {TOKENS['admin']}"}
    answer = await gateway.admin_get(f"/admin/operations/{op_id}", headers=as_ada)
    assert json.loads(await answer.read())["state"] == "unknown"
    await page.screenshots("operator-too-early")

    await page.settle("applied", status=201, body='{"id": "T-1"}', note="T-1 exists")
    await page.wait_text("action-result", "Settled role-1 as applied")
    history = await page.history(until=lambda events: events[-1]["type"] == "resolved")
    assert NAMES["operator"] in history[-1]["text"]
