"""The operator console (`/admin/` on the admin listener) in a real headless Chromium.

An operator at 3 a.m.: sign in with the admin token (and a name, recorded with
what they do), find the `unknown` operation a real upstream timeout left (by
its state, by a search, by a link to its key), read what is needed to decide
(the request sent, every event of the history, how long ago the last send was
and until when the tool may still be working, where the receipt came from),
settle it, and the agent's retry replays what they stored. A release too early
is refused and can be forced only after two explicit confirmations; a
redaction asks for a reason and a confirmation. Upstream content that looks
like HTML stays text; a wrong token gets the sign-in page back; two operators
cannot settle one operation two ways; a phone's 390 px is enough. Every page
is saved as a screenshot under the test's temporary folder (`screenshots/`).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from conftest import GatewayFactory
from console_browser import ConsolePage, chromium_or_skip, start_chromium
from harness import ADMIN_TOKEN, RunningGateway
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client
from selenium import webdriver
from upstream import CountingUpstream, effects_probe

from gateway.web.console_view import CONTENT_SECURITY_POLICY

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
# The route's whole-call limit: short, so that release windows end within seconds, and
# long enough that a loaded machine answers every call a test expects to pass within it
# (300 ms was not: a retry that should have completed answered 504 under CI's load).
TIMEOUT_ROUTE = {"timeout": "1s"}
SLOW_PATH = "/tickets/issues?delay=3"  # answers after the route's limit, the effect applied
AGENT_A = {"Authorization": "Bearer agent-a-credential"}
AGENT_B = {"Authorization": "Bearer agent-b-credential"}
HTML_OR_CLOCK = (
    "innerHTML",
    "outerHTML",
    "insertAdjacentHTML",
    "document.write",
    "eval(",
    "new Function",
    "Date.now",
    "new Date(",
)


@pytest.fixture(scope="module")
def chromium() -> Iterator[webdriver.Chrome]:
    """One browser for the module; each test's gateway is another origin, so no state leaks."""
    chromium_or_skip()
    driver = start_chromium()
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture
async def console_gateway(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> RunningGateway:
    # `record_raw`: the hostile-body tests send HTML, which redaction cannot read and would
    # otherwise keep as its size and digest only; the console must show it as text.
    return await gateway_factory(
        upstream.url,
        route={**TIMEOUT_ROUTE, "record_raw": True},
        admin={"token": ADMIN_TOKEN, "port": 0},
    )


@pytest.fixture
def page(
    chromium: webdriver.Chrome, console_gateway: RunningGateway, tmp_path: Path
) -> ConsolePage:
    assert console_gateway.admin_url is not None
    return ConsolePage(chromium, console_gateway.admin_url, tmp_path / "screenshots")


async def admin_json(gateway: RunningGateway, path: str) -> Any:
    response = await gateway.admin_get(path, headers=ADMIN)
    assert response.status == 200, await response.text()
    return json.loads(await response.read())


async def admin_operation(gateway: RunningGateway, op_id: str) -> dict[str, Any]:
    operation: dict[str, Any] = await admin_json(gateway, f"/admin/operations/{op_id}")
    return operation


async def admin_operation_by_key(gateway: RunningGateway, key: str) -> dict[str, Any]:
    items = (await admin_json(gateway, "/admin/operations?limit=500"))["items"]
    (operation,) = [item for item in items if item["key"] == key]
    return dict(operation)


async def unknown_by_timeout(gateway: RunningGateway, key: str, body: dict[str, str]) -> str:
    """A keyed POST whose upstream applies the effect, then answers after the route's timeout."""
    response = await gateway.post(SLOW_PATH, key=key, json_body=body)
    assert response.status == 504, await response.text()
    problem = json.loads(await response.read())
    assert problem["type"].endswith("/upstream-timeout")
    operation = await admin_operation_by_key(gateway, key)
    assert operation["state"] == "unknown"
    return str(operation["id"])


def seconds(timestamp: str) -> float:
    """An operation document's RFC 3339 time as POSIX seconds."""
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


async def wait_until_release_allowed(gateway: RunningGateway, op_id: str) -> None:
    """Read the operation every 50 ms until its `last_send_age` covers the window the server
    reports (from the last send to `may_apply_until`): a release then needs no force."""
    operation = await admin_operation(gateway, op_id)
    (sent, *_) = [event for event in reversed(operation["history"]) if event["type"] == "sent"]
    window = seconds(operation["may_apply_until"]) - seconds(sent["at"]) + 0.05
    try:
        async with asyncio.timeout(30):
            while operation["last_send_age"] < window:
                await asyncio.sleep(0.05)
                operation = await admin_operation(gateway, op_id)
    except TimeoutError:
        pytest.fail(f"the last send is {operation['last_send_age']} s old, not {window} s")


def events_of(history: list[dict[str, str]], kind: str) -> list[str]:
    return [event["text"] for event in history if event["type"] == kind]


async def test_operator_settles_an_unknown_timeout_and_the_retry_replays(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """The whole round: list, the story and the request, a settlement, the retry's replay."""
    request = {"title": "Printer on fire"}
    op_id = await unknown_by_timeout(console_gateway, "run-9:0:c1", request)
    await console_gateway.post("/tickets/other", key="run-9:0:c2", json_body={"title": "fine"})
    assert upstream.count == 2

    await page.open()
    assert await page.login_visible()
    await page.screenshot("login")

    await page.sign_in(ADMIN_TOKEN, actor="alice")
    await page.wait_for_list()
    assert await page.current_state_tab() == "unknown", "the console opens on unknown"
    assert await page.wait_text("signed-in-as", "alice")
    counts = await page.state_counts()
    assert counts["unknown"] == 1
    assert counts["completed"] == 1
    assert counts["all"] == 2
    (row,) = await page.rows(expect=1)
    assert row == {
        "id": op_id,
        "key": "run-9:0:c1",
        "state": "unknown",
        "route": "tickets",
        "request": "POST /tickets/issues",
    }
    await page.screenshot("unknown-list")

    await page.open_operation(op_id)
    summary = await page.detail_text("summary")
    assert f"Forwarded key\n{op_id}" in summary, "what to search the tool for"
    # The request as it was sent, body as text.
    shown = await page.detail_text("request")
    assert f"POST {SLOW_PATH}" in shown
    assert "application/json" in shown
    assert json.loads(await page.text_content("#request-body")) == request
    # When the last send was and until when the tool may still apply it: the server's figures.
    operation = await admin_operation(console_gateway, op_id)
    timing = await page.wait_text("timing", "the tool may still be working until")
    assert timing.startswith("Last sent "), timing
    assert " s ago; the tool may still be working until " in timing
    until = await page.script("return document.querySelector('#timing time').dateTime")
    assert until == operation["may_apply_until"]
    history = await page.history()
    assert [event["type"] for event in history] == ["claimed", "sent", "timed-out"], history
    assert f"forwarded key {op_id}" in events_of(history, "sent")[0]
    # Its time is the outcome's (one write), which the line says rather than let it mislead.
    assert "recorded with the attempt's outcome" in events_of(history, "sent")[0]
    assert "by gateway" in events_of(history, "timed-out")[0]
    assert await page.displayed("resolve-form")
    assert not await page.displayed("probe-box"), "this route has no probe"
    await page.screenshot("unknown-detail")

    ticket = json.dumps({"id": "T-1", "title": "Printer on fire"})
    await page.settle(
        "applied", status=201, body=ticket, note="T-1 exists in the ticket API (checked by hand)"
    )
    assert (await page.detail_text("action-result")).startswith(
        "Settled run-9:0:c1 as applied: it is now completed"
    )
    history = await page.history(until=lambda events: events[-1]["type"] == "resolved")
    (resolved,) = events_of(history, "resolved")
    assert "by admin:alice" in resolved
    assert "T-1 exists in the ticket API (checked by hand)" in resolved
    assert await page.receipt_body() == ticket
    assert await page.detail_text("receipt-source") == (
        "Where it came from: an operator's statement."
    )
    assert not await page.displayed("timing"), "settled: no send may still be applying"
    await page.screenshot("settled")

    retry = await console_gateway.post(SLOW_PATH, key="run-9:0:c1", json_body=request)
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert json.loads(await retry.read()) == {"id": "T-1", "title": "Printer on fire"}
    assert upstream.count == 2, "the retry was answered from the stored receipt"
    assert await page.console_errors() == []


async def test_search_by_key_prefix_and_by_id(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """One box finds keys by their start and operations by id; `_` and `%` are literal."""
    for key in ("run-1:0", "run-1:1", "run-2:0", "run_1%x"):
        response = await console_gateway.post("/tickets/a", key=key, json_body={"k": key})
        assert response.status == 201
    run_2 = await admin_operation_by_key(console_gateway, "run-2:0")

    await page.open()
    await page.sign_in(ADMIN_TOKEN)
    await page.wait_for_list()
    await page.search("run-1:")
    assert {row["key"] for row in await page.rows(expect=2)} == {"run-1:0", "run-1:1"}
    # The tabs' counts are the whole store's: not shown beside a search's matches.
    assert await page.script("return document.querySelectorAll('#states .count').length") == 0
    await page.screenshot("search-prefix")

    # A single match is what was looked for: it opens.
    await page.search("run_", one=True)
    title = await page.wait_text("detail-title", "Operation run_1%x")
    assert title == "Operation run_1%x", "an underscore is not a wildcard"

    await page.search(run_2["id"], one=True)
    assert await page.wait_text("detail-title", "Operation run-2:0") == "Operation run-2:0"
    assert await page.detail_text("receipt-source") == "Where it came from: the upstream's answer."

    await page.search("no-such-key")
    assert "starts with “no-such-key”" in await page.wait_text("list-empty", "No operation")
    assert await page.console_errors() == []


async def test_deep_links_by_key_and_by_id(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """A key held in one scope opens its operation; held in two, the page lists both."""
    await console_gateway.post("/tickets/a", key="solo-1", json_body={"n": 1}, headers=AGENT_A)
    for agent in (AGENT_A, AGENT_B):
        await console_gateway.post("/tickets/b", key="shared-1", json_body={"n": 2}, headers=agent)
    solo = await admin_operation_by_key(console_gateway, "solo-1")

    await page.open("#/key/solo-1")
    await page.sign_in(ADMIN_TOKEN)
    assert await page.wait_text("detail-title", "Operation solo-1")
    assert solo["id"] in await page.detail_text("summary")
    await page.screenshot("key-link-one-scope")

    await page.open("#key=shared-1")
    assert "held in 2 scopes" in await page.wait_text("list-caption", "shared-1")
    rows = await page.rows(expect=2)
    assert {row["key"] for row in rows} == {"shared-1"}
    scopes = await page.script(
        "return [...document.querySelectorAll('#operations td.scope')].map(td => td.textContent)"
    )
    assert len(set(scopes)) == 2, scopes
    await page.screenshot("key-link-two-scopes")

    await page.open("#/key/nobody-has-this")
    assert "No operation has the key “nobody-has-this”" in await page.wait_text(
        "list-empty", "nobody-has-this"
    )

    await page.open(f"#op={solo['id']}")
    assert await page.wait_text("detail-title", "Operation solo-1")
    await page.open(f"#/op/{solo['id']}")
    assert await page.wait_text("detail-title", "Operation solo-1")
    assert await page.console_errors() == []


async def test_forced_release_takes_two_confirmations(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Too early, a release is refused with the server's words and time; force needs two clicks."""
    op_id = await unknown_by_timeout(console_gateway, "run-3:0", {"amount": 30})
    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN, actor="bob")
    await page.wait_text("timing", "the tool may still be working until")

    await page.settle("not_applied", note="no payment 30 in the ledger", wait=False)
    refusal = await page.wait_text("action-error", "Not released")
    # The server's own words, with the instant they name once, in the page's form.
    shown = re.search(r"the tool may still be applying it until (\S+) (\S+) UTC: ", refusal)
    assert shown is not None, refusal
    assert refusal.count(" UTC") == 1, refusal
    allowed_at = (await admin_operation(console_gateway, op_id))["not_applied_allowed_at"]
    assert abs(seconds(f"{shown[1]}T{shown[2]}Z") - seconds(allowed_at)) < 2, refusal
    assert await page.displayed("force-step")
    assert not await page.displayed("force-confirm")
    await page.screenshot("too-early")

    await page.click("force-ask")  # the first confirmation: a question, nothing sent
    question = await page.wait_text("force-confirm", "with force?")
    assert "run-3:0" in question
    assert (await admin_operation(console_gateway, op_id))["state"] == "unknown"
    await page.screenshot("force-question")

    await page.click("force-confirm-button")  # the second
    result = await page.wait_text("action-result", "Released run-3:0 with force")
    assert "its key may be sent again" in result
    assert not await page.displayed("force-step")
    history = await page.history(until=lambda events: events[-1]["type"] == "released")
    (resolved,) = events_of(history, "resolved")
    assert "FORCED" in resolved
    assert "by admin:bob" in resolved
    assert "no payment 30 in the ledger" in resolved
    await page.screenshot("forced")

    recorded = (await admin_operation(console_gateway, op_id))["history"]
    (event,) = [event for event in recorded if event["type"] == "resolved"]
    assert event["force"] is True
    assert event["actor"] == "admin:bob"
    assert event["note"] == "no payment 30 in the ledger"
    # The browser logs the refused release (409) as a failed load; nothing else went wrong.
    errors = await page.console_errors()
    assert [line for line in errors if "status of 409 (Conflict)" not in line] == [], errors


async def test_probe_now_settles_and_labels_the_receipt(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    """Probe now asks the route's probe once: applied, and the receipt is "a probe's answer"."""
    gateway = await gateway_factory(
        upstream.url,
        route={**TIMEOUT_ROUTE, "probe": effects_probe()},
        idempotency={"sweep_interval": "1h"},  # no background probe: the operator asks
        admin={"token": ADMIN_TOKEN, "port": 0},
    )
    assert gateway.admin_url is not None
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    op_id = await unknown_by_timeout(gateway, "run-4:0", {"amount": 40})

    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN)
    assert await page.wait_text("probe-box", "Probe now")
    # Too early to release: the refusal points at Probe now, not only at waiting.
    await page.settle("not_applied", note="not in the ledger", wait=False)
    refusal = await page.wait_text("action-error", "Not released")
    assert "press Probe now above" in refusal, refusal
    await page.screenshot("too-early-probe-now")
    # The browser logs the refused release (409) as a failed load, in the log the next
    # test of this browser reads: read it here.
    errors = await page.console_errors()
    assert [line for line in errors if "status of 409 (Conflict)" not in line] == [], errors
    await page.click("probe-now")
    result = await page.wait_text("action-result", "Probed run-4:0")
    assert "the upstream has the effect" in result
    assert await page.wait_text("receipt-source", "a probe's answer")
    history = await page.history(until=lambda events: events[-1]["type"] != "timed-out")
    assert any(
        "applied: the upstream has the effect" in text for text in events_of(history, "probe")
    )
    # Who settled it is said once: no "as probe" after "by probe", and no note in the
    # probe's name (a note is a person's own words).
    [resolved] = events_of(history, "resolved")
    assert resolved.lower().count("probe") == 1, resolved
    assert not await page.displayed("probe-box"), "settled: nothing left to probe"
    await page.screenshot("probed")
    operation = await admin_operation(gateway, op_id)
    assert operation["receipt_source"] == "probe"
    assert (operation["resolution"]["by"], operation["resolution"]["note"]) == ("probe", None)


async def test_a_probe_that_cannot_vouch_says_so_and_what_it_asked(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    """On an operation whose request its probe is not declared for, Probe now settles
    nothing: the result says so, a line over the history says what to do (check the tool
    by hand), and the probe's event shows the request it made."""
    gateway = await gateway_factory(
        upstream.url,
        route={**TIMEOUT_ROUTE, "probe": effects_probe(applies_to=("POST /v1/emails",))},
        idempotency={"sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN, "port": 0},
    )
    assert gateway.admin_url is not None
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    op_id = await unknown_by_timeout(gateway, "run-6:0", {"amount": 60})
    upstream.effects.clear()  # the probe would answer 404: nothing of it found

    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN)
    assert await page.wait_text("probe-box", "Probe now")
    # Too early to release: the refusal points at Probe now, not only at waiting.
    await page.settle("not_applied", note="not in the ledger", wait=False)
    refusal = await page.wait_text("action-error", "Not released")
    assert "press Probe now above" in refusal, refusal
    await page.screenshot("too-early-probe-now")
    # The browser logs the refused release (409) as a failed load, in the log the next
    # test of this browser reads: read it here.
    errors = await page.console_errors()
    assert [line for line in errors if "status of 409 (Conflict)" not in line] == [], errors
    await page.click("probe-now")
    result = await page.wait_text("action-result", "Probed run-6:0")
    assert "cannot vouch for this request" in result
    assert "Check the tool by hand" in await page.wait_text("probe-sight", "not declared")
    history = await page.history(until=lambda events: events[-1]["type"] == "probe")
    [probed] = events_of(history, "probe")
    assert "not declared for this request" in probed
    assert f"asked GET /effects/{op_id}" in probed
    await page.screenshot("probe-not-declared")


async def test_the_note_of_a_release_stays_after_the_retry_completes(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    """Release with a note; the agent's retry is sent and completes; the note is still there."""
    gateway = await gateway_factory(
        upstream.url,
        route={**TIMEOUT_ROUTE, "not_applied_after": "0s"},
        idempotency={"lease": "1s"},  # the release window ends with the lease: a second
        admin={"token": ADMIN_TOKEN, "port": 0},
    )
    assert gateway.admin_url is not None
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    upstream.script.append({"drop": "before_effect"})  # the connection closes, nothing applied
    response = await gateway.post("/tickets/issues", key="k-lost", json_body={"n": 1})
    assert response.status == 502, await response.text()
    op_id = str((await admin_operation_by_key(gateway, "k-lost"))["id"])
    assert upstream.count == 0
    await wait_until_release_allowed(gateway, op_id)

    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN, actor="carol")
    note = "No ticket n=1 upstream.\nChecked the API by forwarded key."
    await page.settle("not_applied", note=note)
    assert await page.detail_text("action-result") == (
        "Released k-lost: its key may be sent again. Note kept in the history."
    )
    assert not await page.displayed("resolve-form")
    await page.screenshot("released")

    retry = await gateway.post("/tickets/issues", key="k-lost", json_body={"n": 1})
    assert retry.status == 201
    assert "Idempotent-Replayed" not in retry.headers
    assert upstream.count == 1

    await page.click("reload")
    history = await page.history(until=lambda events: events[-1]["type"] == "answered")
    kinds = [event["type"] for event in history]
    assert kinds.index("resolved") < kinds.index("released") < len(kinds) - 3, kinds
    assert kinds[-3:] == ["claimed", "sent", "answered"], kinds
    assert "attempt 2" in history[-3]["text"]
    (resolved,) = events_of(history, "resolved")
    assert await page.text_content("#history li.resolved .note") == note, "kept verbatim"
    assert "by admin:carol" in resolved
    assert "status 201" in history[-1]["text"]
    assert await page.wait_text("receipt-source", "the upstream's answer")
    await page.screenshot("history-after-retry")


async def test_an_mcp_call_shows_its_tool_and_arguments_and_a_large_body_why_it_is_gone(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    """An MCP operation's request is its tool and arguments (as text); a body over the
    route's record_request_max is explained, with the size and digest that are kept."""
    async with CountingMcpServer() as server:
        gateway = await gateway_factory(
            server.url,
            route={"name": "tools", "prefix": "/tools", "upstream": server.url, "kind": "mcp"},
            extra_routes=[
                {"name": "big", "prefix": "/big", "upstream": upstream.url,
                 "record_request_max": 16}
            ],
            admin={"token": ADMIN_TOKEN, "port": 0},
        )  # fmt: skip
        assert gateway.admin_url is not None
        async with mcp_client(gateway.url + "/tools") as client:
            result = await call_with_key(client, "create_ticket", {"title": "<b>Fax</b>"}, "mcp-1")
        assert not result.is_error
        response = await gateway.post("/big/upload", key="big-1", json_body={"text": "z" * 100})
        assert response.status == 201

        page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
        await page.open("#/key/mcp-1")
        await page.sign_in(ADMIN_TOKEN)
        shown = await page.wait_text("request", "create_ticket")
        assert "Sent\ntools/call" in shown
        arguments = json.loads(await page.text_content("#request-arguments"))
        assert arguments == {"title": "<b>Fax</b>"}
        assert await page.count("#detail b") == 0
        await page.screenshot("mcp-request")

        await page.open("#/key/big-1")
        gone = await page.wait_text("request-gone", "record_request_max")
        assert gone.startswith("The body (")
        assert "only its size and digest are kept" in gone
        assert "hmac-sha256:" in await page.detail_text("request")
        await page.screenshot("request-too-large")


HOSTILE_BODY = (
    "<script>window.__pwned = 'script'</script>"
    "<img src=x onerror=\"window.__pwned = 'img'\">"
    "<b>bold</b>"
)


async def test_html_in_a_receipt_is_text_and_runs_nothing(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    # The key, the path, the request and the receipt body are all attacker-shaped; echo=1
    # answers the request body byte for byte, with the header set below.
    key = "<img src=x onerror=window.__pwned=1>"
    response = await console_gateway.post(
        "/tickets/<b>x</b>?echo=1",
        key=key,
        data=HOSTILE_BODY.encode(),
        headers={"Content-Type": "text/html"},
    )
    assert response.status == 201
    op_id = str((await admin_operation_by_key(console_gateway, key))["id"])

    await page.open("#/?state=completed")
    await page.sign_in(ADMIN_TOKEN)
    (row,) = await page.rows(expect=1)
    assert row["key"] == key
    await page.open_operation(op_id)
    assert await page.receipt_body() == HOSTILE_BODY
    assert await page.text_content("#request-body") == HOSTILE_BODY
    assert await page.detail_text("detail-title") == f"Operation {key}"
    await page.screenshot("hostile-receipt")

    assert await page.script("return window.__pwned === undefined") is True
    assert await page.count("#detail img, #detail script, #detail b, #list img") == 0
    assert await page.console_errors() == []
    # Trusted Types: even the page's own code could not assign HTML from a string.
    refused = await page.script(
        "try { document.body.insertAdjacentHTML('beforeend', '<i>x</i>'); return false }"
        " catch (e) { return e instanceof TypeError }"
    )
    assert refused is True


AT = "2026-12-02T06:20:30.123456Z"
EVENTS_OF_EVERY_KIND = [
    {"type": "claimed", "attempt": 1, "token": 1, "reconstructed": True},
    {"type": "resolved", "actor": "admin:eve", "outcome": "not_applied", "by": "admin",
     "force": True, "share_with_owner": False, "note_redacted": True},
    {"type": "redacted", "actor": "admin", "erased": ["request"], "reason": "<b>gdpr</b> #12"},
    {"type": "probe", "actor": "probe", "attempt": 2, "verdict": "not_applied_too_soon",
     "status": 404, "detail": "not found", "count": 3, "last_at": AT},
    {"type": "truncated", "dropped": 12},
    {"type": "from-a-newer-gateway", "detail": "<img src=x onerror=window.__pwned=1>"},
]  # fmt: skip
RENDER_HISTORY = """
const [events, done] = arguments;
import("./operation.js").then(({ historyItems }) => done(historyItems(events).map((item) => ({
  type: item.dataset.type,
  text: item.textContent,
  marks: [...item.querySelectorAll(".mark")].map((mark) => mark.textContent),
  elements: item.querySelectorAll("b, img").length,
}))), (error) => done(String(error)));
"""


async def test_history_marks_reconstructed_and_erased_events(
    page: ConsolePage, console_gateway: RunningGateway
) -> None:
    """Events the migration rebuilt and words a redaction erased are marked; any kind, even
    one this page does not know, is shown as text."""
    await page.open()
    events = [
        {"seq": seq, "at": AT, "actor": "gateway", "version": seq, **event}
        for seq, event in enumerate(EVENTS_OF_EVERY_KIND, start=1)
    ]
    shown = await page.async_script(RENDER_HISTORY, events)
    assert isinstance(shown, list), shown
    claimed, resolved, redacted, probe, truncated, newer = shown
    assert claimed["marks"] == ["reconstructed"]
    assert resolved["marks"] == ["redacted"]
    assert "the note was erased by a redaction" in resolved["text"]
    assert "FORCED" in resolved["text"]
    assert "by admin:eve" in resolved["text"]
    assert "Reason: <b>gdpr</b> #12" in redacted["text"]
    assert "erased: request" in redacted["text"]
    assert "not applied, but too soon to release" in probe["text"]
    assert (
        "3 identical answers, 2026-12-02 06:20:30 UTC to 2026-12-02 06:20:30 UTC" in probe["text"]
    )
    assert "12 later probe answers were not recorded" in truncated["text"]
    assert newer["type"] == "from-a-newer-gateway"
    assert "detail: <img src=x onerror=window.__pwned=1>" in newer["text"]
    assert [item["elements"] for item in shown] == [0] * len(shown), "all of it text"
    assert await page.script("return window.__pwned === undefined") is True


async def test_a_wrong_token_shows_the_sign_in_again(
    page: ConsolePage, console_gateway: RunningGateway
) -> None:
    await page.open()
    await page.sign_in("not-the-admin-token-0123456789")
    assert "refused this token" in await page.login_error()
    assert await page.login_visible()
    assert not await page.displayed("list")
    await page.screenshot("wrong-token")

    await page.sign_in(ADMIN_TOKEN)
    await page.wait_for_list()
    # A token revoked or mistyped later: the next 401 brings the sign-in back.
    await page.script(
        "sessionStorage.setItem('idempotency-gateway.admin-token', 'stale-token-0123456789')"
    )
    await page.choose_state("all", wait=False)
    assert "refused this token" in await page.login_error()
    assert not await page.displayed("list")


async def test_the_empty_unknown_tab_says_nothing_waits(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """No unknown operation: the first screen says so in words, not with an empty table."""
    await console_gateway.post("/tickets/a", key="done-1", json_body={"n": 1})
    await page.open()
    await page.sign_in(ADMIN_TOKEN)
    assert await page.current_state_tab() == "unknown"
    empty = await page.wait_text("list-empty", "Nothing waits for an operator")
    assert empty == "Nothing waits for an operator: no operation's outcome is unknown."
    assert await page.rows(expect=0) == []
    await page.screenshot("nothing-unknown")


async def test_two_operators_cannot_settle_one_operation_two_ways(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    op_id = await unknown_by_timeout(console_gateway, "k-race", {"amount": 10})
    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN)
    assert "unknown" in await page.detail_text("summary")

    # The other operator settles it first (with the CLI or another browser).
    assert console_gateway.admin_url is not None
    async with aiohttp.ClientSession() as session:
        shown = await session.get(
            f"{console_gateway.admin_url}/admin/operations/{op_id}", headers=ADMIN
        )
        other = await session.post(
            f"{console_gateway.admin_url}/admin/operations/{op_id}/resolve",
            json={
                "outcome": "applied",
                "response": {"status": 201, "headers": {}, "body": "{}"},
                "note": "operator B: payment 10 found",
            },
            headers={**ADMIN, "If-Match": shown.headers["ETag"]},
        )
        assert other.status == 200, await other.text()

    await page.settle("applied", status=200, body="{}", note="operator A: it exists", wait=False)
    conflict = await page.wait_text("action-error", "Nothing was changed")
    # Who changed it is said (the history knows), not "someone".
    assert "k-race changed since you read it (Resolved by admin" in conflict, conflict
    assert "someone" not in conflict
    assert "Your note was: “operator A: it exists”." in conflict, "typed words are not lost"
    assert "completed" in await page.detail_text("summary"), "the page shows B's outcome now"
    history = await page.history(until=lambda events: events[-1]["type"] == "resolved")
    assert any("operator B" in event["text"] for event in history)
    assert not any("operator A" in event["text"] for event in history)
    await page.screenshots("conflict")


async def test_redaction_asks_for_a_reason_and_a_confirmation(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Nothing is erased until the operator gave a reason and confirmed; then both bodies go."""
    await console_gateway.post(
        "/tickets/mail?echo=1", key="m-1", json_body={"to": "ops@example.org"}
    )
    op_id = str((await admin_operation_by_key(console_gateway, "m-1"))["id"])
    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN, actor="dpo")
    assert "ops@example.org" in await page.text_content("#request-body")

    await page.ask_redact(reason="")
    assert "A reason is required" in await page.wait_text("action-error", "reason")
    assert not await page.displayed("redact-confirm")

    reason = "the body holds an e-mail address (GDPR request #12)"
    await page.ask_redact(reason=reason)
    assert "cannot be undone" in await page.wait_text("redact-confirm", "m-1")
    await page.screenshot("redact-question")
    await page.click("redact-cancel")
    assert not await page.displayed("redact-confirm")
    kept = await admin_operation(console_gateway, op_id)
    assert kept["response"]["body"], "cancelled: nothing erased"
    assert kept["request"]["body"]

    await page.ask_redact(reason=reason)
    await page.click("redact-confirm-button")
    result = await page.wait_text("action-result", "Redacted m-1")
    assert "The reason is kept in the history." in result
    assert "erased by a redaction" in await page.wait_text("request", "redaction")
    assert "the body is not retained" in await page.detail_text("receipt")
    history = await page.history(until=lambda events: events[-1]["type"] == "redacted")
    assert "by admin:dpo" in history[-1]["text"]
    assert reason in history[-1]["text"]
    await page.screenshot("redacted")

    retry = await console_gateway.post(
        "/tickets/mail?echo=1", key="m-1", json_body={"to": "ops@example.org"}
    )
    assert retry.status == 409
    assert json.loads(await retry.read())["type"].endswith("/receipt-not-retained")


async def test_a_phone_width_needs_no_sideways_scrolling(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """At 390 x 844 the list (stacked into cards) and an operation fit the screen's width."""
    long_key = "agent-run-" + "x" * 150 + ":0"
    op_id = await unknown_by_timeout(console_gateway, long_key, {"title": "y" * 400})
    await console_gateway.post("/tickets/" + "p" * 120, key="ok-1", json_body={"n": 1})

    await page.open()
    await page.sign_in(ADMIN_TOKEN, actor="mobile-operator")
    try:
        assert await page.window(390, 844) == 390
        await page.choose_state("all")
        await page.rows(expect=2)
        width = await page.script("return document.documentElement.scrollWidth")
        assert width <= 390, f"the list is {width} px wide"
        shot = await page.screenshot("phone-list")
        assert shot.is_file()
        assert shot.stat().st_size > 0

        await page.open_operation(op_id)
        await page.history()
        width = await page.script("return document.documentElement.scrollWidth")
        assert width <= 390, f"the operation's page is {width} px wide"
        shot = await page.screenshot("phone-operation")
        assert shot.is_file()
        assert shot.stat().st_size > 0
        assert shot.parent.is_relative_to(tmp_path)
    finally:
        await page.window(1280, 1000)


async def test_filters_by_route_and_age(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    gateway = await gateway_factory(
        upstream.url,
        admin={"token": ADMIN_TOKEN, "port": 0},
        extra_routes=[{"name": "mail", "prefix": "/mail", "upstream": upstream.url}],
    )
    assert gateway.admin_url is not None
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    await gateway.post("/tickets/a", key="t-1", json_body={"to": "ops@example.org"})
    await gateway.post("/mail/send", key="m-1", json_body={"to": "ops@example.org"})

    await page.open("#/?state=completed")
    await page.sign_in(ADMIN_TOKEN)
    assert {row["key"] for row in await page.rows(expect=2)} == {"t-1", "m-1"}
    await page.filter(route="mail")
    (row,) = await page.rows(expect=1)
    assert row["key"] == "m-1"
    await page.filter(route="mail", older_than="1h")
    assert await page.rows(expect=0) == []
    assert await page.wait_text("list-empty", "No operations match.")
    await page.screenshot("filtered")
    await page.filter(route="mail", older_than="0s")
    (row,) = await page.rows(expect=1)
    await page.open_operation(row["id"])
    assert not await page.displayed("resolve-form")


async def test_console_headers_and_where_it_is_served(
    console_gateway: RunningGateway,
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
) -> None:
    assert console_gateway.admin_url is not None
    async with aiohttp.ClientSession() as session:
        for path, kind in (
            ("/admin/", "text/html"),
            ("/admin/console.js", "text/javascript"),
            ("/admin/api.js", "text/javascript"),
            ("/admin/dom.js", "text/javascript"),
            ("/admin/list.js", "text/javascript"),
            ("/admin/operation.js", "text/javascript"),
            ("/admin/console.css", "text/css"),
            ("/admin/console.svg", "image/svg+xml"),
        ):
            response = await session.get(console_gateway.admin_url + path)
            assert response.status == 200, path
            assert response.content_type == kind
            assert response.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
            assert response.headers["X-Content-Type-Options"] == "nosniff"
            assert response.headers["X-Frame-Options"] == "DENY"
            assert "Set-Cookie" not in response.headers
            if kind == "text/javascript":
                # No HTML from strings, no eval, no browser clock (comments may name them).
                code = re.sub(r"//[^\n]*", "", await response.text())
                for banned in HTML_OR_CLOCK:
                    assert banned not in code, (path, banned)
        assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
        assert "'unsafe-eval'" not in CONTENT_SECURITY_POLICY
        assert "default-src 'none'" in CONTENT_SECURITY_POLICY
        assert "frame-ancestors 'none'" in CONTENT_SECURITY_POLICY

        redirect = await session.get(console_gateway.admin_url + "/admin", allow_redirects=False)
        assert redirect.status == 308
        assert redirect.headers["Location"] == "/admin/"
        # Only the page's own files: nothing else of the package is reachable.
        for path in (
            "/admin/console_view.py",
            "/admin/../app.py",
            "/admin/index.html.bak",
            "/admin/dom.css",
        ):
            missing = await session.get(console_gateway.admin_url + path)
            assert missing.status == 404, path
        # Never on the main listener.
        main = await session.get(console_gateway.url + "/admin/")
        assert main.status == 404

    # No admin token: no console.
    plain = await gateway_factory(upstream.url, store_url=f"sqlite:///{tmp_path / 'plain.db'}")
    response = await plain.get("/admin/")
    assert response.status == 404


async def test_admin_api_behind_the_console(
    console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """The calls the console makes: overview, filters, the forwarded key, redact If-Match."""
    await console_gateway.post("/tickets/a", key="k-1", json_body={"n": 1})
    admin = console_gateway.admin_get

    overview = json.loads(await (await admin("/admin/overview", headers=ADMIN)).read())
    assert overview == {
        "counts": {"in_flight": 0, "completed": 1, "unknown": 0, "released": 0},
        "routes": ["tickets"],
        "you": {"name": None, "role": "admin", "actor": "admin"},  # the shared token
    }
    assert (await admin("/admin/overview")).status == 401

    listed = json.loads(
        await (await admin("/admin/operations?route=tickets", headers=ADMIN)).read()
    )
    (item,) = listed["items"]
    assert item["forwarded_key"] == item["id"], "forward_key = operation_id by default"
    for query, count in (("route=nope", 0), ("older_than=1h", 0), ("older_than=0s", 1)):
        page = json.loads(await (await admin(f"/admin/operations?{query}", headers=ADMIN)).read())
        assert len(page["items"]) == count, query
    bad = await admin("/admin/operations?older_than=soon", headers=ADMIN)
    assert bad.status == 400
    assert "older_than" in json.loads(await bad.read())["detail"]

    shown = await admin(f"/admin/operations/{item['id']}", headers=ADMIN)
    assert json.loads(await shown.read())["forwarded_key"] == item["id"]
    assert console_gateway.admin_url is not None
    url = f"{console_gateway.admin_url}/admin/operations/{item['id']}/redact"
    async with aiohttp.ClientSession() as session:
        stale = f'"{item["id"]}.999"'
        refused = await session.post(
            url, json={"reason": "gdpr"}, headers={**ADMIN, "If-Match": stale}
        )
        assert refused.status == 412
        assert json.loads(
            await (await admin(f"/admin/operations/{item['id']}", headers=ADMIN)).read()
        )["body_retained"], "a refused redaction erased nothing"
        done = await session.post(
            url, json={"reason": "gdpr"}, headers={**ADMIN, "If-Match": shown.headers["ETag"]}
        )
        assert done.status == 200
        again = await session.post(
            url, json={"reason": "gdpr"}, headers={**ADMIN, "If-Match": shown.headers["ETag"]}
        )
        assert again.status == 412, "the version shown is gone: the second operator is told"


async def test_an_empty_receipt_is_stored_only_when_said_so(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """ "Applied" with the form's defaults (200, empty body) was accepted without a word and
    the agent's retry got an empty 200. The page now refuses an empty body unless the
    operator ticks that the tool's answer really had none (the CLI's `--empty-body`),
    keeping what was typed; at phone width too."""
    op_id = await unknown_by_timeout(console_gateway, "run-e:0", {"title": "empty"})
    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN, actor="erin")
    await page.wait_text("timing", "the tool may still be working until")

    for width in (1280, 390):
        assert await page.window(width, 1000 if width > 400 else 844) == width
        await page.settle("applied", note="it exists, checked by hand", wait=False)
        warning = await page.wait_text("action-error", "The receipt's body is empty")
        assert "every retry would get an empty answer" in warning
        assert (await admin_operation(console_gateway, op_id))["state"] == "unknown"
        assert await page.script("return document.getElementById('resolve-note').value") == (
            "it exists, checked by hand"
        ), "what was typed stays"
        await page.screenshot(f"empty-receipt-refused-{width}")
    await page.window(1280, 1000)

    await page.settle("applied", note="the tool answers 204 with no body", empty_body=True)
    await page.wait_text("action-result", "Settled run-e:0 as applied")
    operation = await admin_operation(console_gateway, op_id)
    assert operation["state"] == "completed"
    assert operation["response"]["body"] == ""
    await page.screenshot("empty-receipt-said")
    assert [event["type"] for event in operation["history"]].count("resolved") == 1
    # The browser's log is shared by the tests of one browser: only this operation's lines.
    assert [line for line in await page.console_errors() if op_id in line] == []


async def test_the_operation_shows_every_request_of_its_key(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """The agent's replays and a reused key's 422 are lines under the history, each with
    the request id the agent logged, so an operator can match the two logs; at 1280 and
    390 px."""
    for request_id, title in (("agent-1", "a"), ("agent-2", "a"), ("agent-3", "other")):
        await console_gateway.post(
            "/tickets/issues", key="seen-1", json_body={"title": title},
            headers={"X-Request-Id": request_id},
        )  # fmt: skip
    op_id = (await (await console_gateway.get("/operations/seen-1")).json())["id"]
    async with asyncio.timeout(30):  # the log is written once a second
        while (await admin_operation(console_gateway, op_id))["requests"]["total"] < 3:  # noqa: ASYNC110
            await asyncio.sleep(0.1)

    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN, actor="carol")
    summary = await page.wait_text("requests-summary", "3 requests with this key")
    assert "1 answered from the receipt, 1 refused" in summary
    lines = (await page.detail_text("requests")).splitlines()
    assert len(lines) == 3, lines
    assert "201 sent to the tool" in lines[0]
    assert "agent-1" in lines[0]
    assert "answered from the receipt" in lines[1]
    assert "agent-2" in lines[1]
    assert "422 refused: another request under this key key-mismatch" in lines[2]
    assert "agent-3" in lines[2]
    await page.screenshot("requests-1280")
    try:
        assert await page.window(390, 844) == 390
        width = await page.script("return document.documentElement.scrollWidth")
        assert width <= 390, f"the operation's page is {width} px wide"
        await page.screenshot("requests-390")
    finally:
        await page.window(1280, 1000)
    assert [line for line in await page.console_errors() if op_id in line] == []


async def test_times_are_local_with_utc_on_hover_and_ages_tick(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    """Times were UTC only and ages did not tick. An instant the server gives is shown in
    the browser's zone (UTC on hover), and "last sent N s ago" counts on from the server's
    figure by the page's monotonic clock."""
    op_id = await unknown_by_timeout(console_gateway, "run-tz:0", {"title": "tz"})
    until = (await admin_operation(console_gateway, op_id))["may_apply_until"]
    page.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"})
    try:
        await page.open(f"#/op/{op_id}")
        await page.sign_in(ADMIN_TOKEN, actor="kenji")
        await page.wait_text("timing", "the tool may still be working until")
        shown = await page.script(
            "const t = document.querySelector('#timing time');"
            "return [t.textContent, t.title, t.dateTime];"
        )
        assert shown[2] == until
        assert shown[0].endswith(" GMT+9"), shown
        assert shown[1].endswith(" UTC"), shown
        local = datetime.strptime(shown[0].removesuffix(" GMT+9"), "%Y-%m-%d %H:%M:%S")
        utc = datetime.strptime(shown[1].removesuffix(" UTC"), "%Y-%m-%d %H:%M:%S")
        assert local - utc == timedelta(hours=9)
        await page.screenshots("local-time-tokyo")

        first = await page.text_content("#timing .age")
        async with asyncio.timeout(30):
            while await page.text_content("#timing .age") == first:  # noqa: ASYNC110
                await asyncio.sleep(0.2)
        assert seconds_of(await page.text_content("#timing .age")) > seconds_of(first)
    finally:
        page.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})


async def test_an_instant_in_the_gateways_words_is_a_local_time_named_once(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    """The same instant was written in two formats: the gateway's words carry RFC 3339
    ("until 2026-12-04T11:19:57.250309Z") beside the page's local "2026-12-04 20:19:57
    GMT+9". Instants in the history's words and in notices are local now, a too-early
    refusal names its instant once, and repeated probe answers say from when to when."""
    gateway = await gateway_factory(
        upstream.url,
        route={"probe": effects_probe(not_applied_after="10m"), "timeout": "200ms"},
        admin={"token": ADMIN_TOKEN, "port": 0},
    )
    assert gateway.admin_url is not None
    held = await gateway.post("/tickets/v1/issues?hold=1", key="tz-2", json_body={"t": 2})
    assert held.status == 504
    op_id = (await admin_operation_by_key(gateway, "tz-2"))["id"]
    for _ in range(2):
        answer = await gateway.session.post(
            f"{gateway.admin_url}/admin/operations/{op_id}/probe", headers=ADMIN
        )
        assert answer.status == 200, await answer.text()
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    iso_instant = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d")
    page.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": "Asia/Tokyo"})
    try:
        await page.open(f"#/op/{op_id}")
        await page.sign_in(ADMIN_TOKEN, actor="kenji")
        history = await page.history(until=lambda events: events[-1]["type"] == "probe")
        probe = history[-1]["text"]
        assert "but a probe releases only after 20" in probe
        assert re.search(r"identical answers, \S+ \S+ GMT\+9 to \S+ \S+ GMT\+9", probe), probe
        assert not iso_instant.search(probe), probe

        await page.settle("not_applied", note="no ticket yet", wait=False)
        refusal = await page.wait_text("action-error", "Not released")
        assert refusal.count("GMT+9") == 1, refusal
        assert not iso_instant.search(refusal), refusal
        assert "press Probe now" in refusal
        await page.screenshots("instants-local-once")
    finally:
        page.driver.execute_cdp_cmd("Emulation.setTimezoneOverride", {"timezoneId": ""})
        upstream.release_held()


def seconds_of(age: str) -> int:
    number, unit = age.split()
    assert unit == "s", age
    return int(number)


async def test_typed_words_survive_a_probe_and_a_reload(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    chromium: webdriver.Chrome,
    tmp_path: Path,
) -> None:
    """Clicking Probe now after filling the settle form reset note, body and outcome, and a
    reload lost them too. The draft is kept per operation until it is settled (the
    conflict case is `test_two_operators_cannot_settle_one_operation_two_ways`)."""
    gateway = await gateway_factory(
        upstream.url,
        route={**TIMEOUT_ROUTE, "probe": effects_probe(applies_to=("POST /v1/emails",))},
        idempotency={"sweep_interval": "1h"},
        admin={"token": ADMIN_TOKEN, "port": 0},
    )
    assert gateway.admin_url is not None
    page = ConsolePage(chromium, gateway.admin_url, tmp_path / "screenshots")
    op_id = await unknown_by_timeout(gateway, "run-d:0", {"amount": 7})
    upstream.effects.clear()  # the probe finds nothing, and is not declared: it settles nothing

    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN)
    await page.wait_text("probe-box", "Probe now")
    await page.settle(
        "applied", status=201, body='{"id": "T-7"}', note="T-7 in the ledger", submit=False
    )
    await page.click("probe-now")
    await page.wait_text("action-result", "Probed run-d:0")
    read_form = (
        "return [document.querySelector('input[name=outcome]:checked')?.value ?? null,"
        " document.getElementById('receipt-status').value,"
        " document.getElementById('receipt-body').value,"
        " document.getElementById('resolve-note').value];"
    )
    typed = ["applied", "201", '{"id": "T-7"}', "T-7 in the ledger"]
    assert await page.script(read_form) == typed, "kept across the probe"
    await page.script("location.reload()")
    await page.wait_text("probe-box", "Probe now")
    assert await page.script(read_form) == typed, "kept across a reload"
    await page.screenshots("draft-kept")

    await page.script("document.querySelector('#resolve-form button[type=submit]').click()")
    await page.wait_text("action-result", "Settled run-d:0 as applied")
    draft = await page.script(f"return sessionStorage.getItem('idempotency-gateway:draft:{op_id}')")
    assert draft is None, "a settled operation's draft is dropped"
