"""The operator console (`/admin/` on the admin listener) in a real headless Chromium.

An operator at 3 a.m.: sign in with the admin token, find the `unknown`
operation a real upstream timeout left, read its story, settle it, and the
agent's retry replays what they stored. Upstream content that looks like HTML
stays text; a wrong token gets the sign-in page back; two operators cannot
settle one operation two ways. Every page is saved as a screenshot under the
test's temporary folder (`screenshots/`).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import aiohttp
import pytest
from conftest import GatewayFactory
from console_browser import ConsolePage, chromium_or_skip, start_chromium
from harness import ADMIN_TOKEN, RunningGateway
from selenium import webdriver
from upstream import CountingUpstream

from gateway.web.console_view import CONTENT_SECURITY_POLICY

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
TIMEOUT_ROUTE = {"timeout": "300ms"}


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
    return await gateway_factory(
        upstream.url, route=TIMEOUT_ROUTE, admin={"token": ADMIN_TOKEN, "port": 0}
    )


@pytest.fixture
def page(
    chromium: webdriver.Chrome, console_gateway: RunningGateway, tmp_path: Path
) -> ConsolePage:
    assert console_gateway.admin_url is not None
    return ConsolePage(chromium, console_gateway.admin_url, tmp_path / "screenshots")


async def unknown_by_timeout(gateway: RunningGateway, key: str, body: dict[str, str]) -> str:
    """A keyed POST whose upstream applies the effect, then answers after the route's timeout."""
    response = await gateway.post("/tickets/issues?delay=1.5", key=key, json_body=body)
    assert response.status == 504, await response.text()
    problem = json.loads(await response.read())
    assert problem["type"].endswith("/upstream-timeout")
    operation = await admin_operation_by_key(gateway, key)
    assert operation["state"] == "unknown"
    return str(operation["id"])


async def admin_operation_by_key(gateway: RunningGateway, key: str) -> dict[str, object]:
    response = await gateway.admin_get("/admin/operations?limit=500", headers=ADMIN)
    items = json.loads(await response.read())["items"]
    (operation,) = [item for item in items if item["key"] == key]
    return dict(operation)


async def test_operator_settles_an_unknown_timeout_and_the_retry_replays(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    request = {"title": "Printer on fire"}
    op_id = await unknown_by_timeout(console_gateway, "run-9:0:c1", request)
    await console_gateway.post("/tickets/other", key="run-9:0:c2", json_body={"title": "fine"})
    assert upstream.count == 2

    await page.open()
    assert await page.login_visible()
    await page.screenshot("login")

    await page.sign_in(ADMIN_TOKEN)
    await page.wait_for_list()
    assert await page.current_state_tab() == "unknown", "the console opens on unknown"
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
    story = await page.timeline()
    assert story[0].endswith(
        "Claimed: the key and the request's fingerprint were recorded before anything "
        "was sent (POST /tickets/issues)."
    )
    assert any("did not answer completely in time" in line for line in story[1:-1]), story
    assert story[-1].endswith("Now unknown after 1 send(s) upstream.")
    assert await page.displayed("resolve-form")
    assert not await page.displayed("redact-form")
    await page.screenshot("unknown-detail")

    ticket = json.dumps({"id": "T-1", "title": "Printer on fire"})
    await page.settle(
        "applied", status=201, body=ticket, note="T-1 exists in the ticket API (checked by hand)"
    )
    assert "Settled: now completed" in await page.detail_text("action-result")
    story = await page.timeline()
    assert any("Settled by admin: T-1 exists in the ticket API" in line for line in story), story
    assert await page.receipt_body() == ticket
    await page.screenshot("settled")

    retry = await console_gateway.post(
        "/tickets/issues?delay=1.5", key="run-9:0:c1", json_body=request
    )
    assert retry.status == 201
    assert retry.headers["Idempotent-Replayed"] == "true"
    assert json.loads(await retry.read()) == {"id": "T-1", "title": "Printer on fire"}
    assert upstream.count == 2, "the retry was answered from the stored receipt"
    assert await page.console_errors() == []


async def test_not_applied_lets_the_retry_through_once(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    upstream.script.append({"drop": "before_effect"})  # the connection closes, nothing applied
    response = await console_gateway.post("/tickets/issues", key="k-lost", json_body={"n": 1})
    assert response.status == 502, await response.text()
    op_id = str((await admin_operation_by_key(console_gateway, "k-lost"))["id"])
    assert upstream.count == 0

    await page.open(f"#/op/{op_id}")
    await page.sign_in(ADMIN_TOKEN)
    assert "unknown" in await page.detail_text("summary")
    await page.settle("not_applied", note="no such ticket upstream")
    assert "Settled: now released" in await page.detail_text("action-result")
    assert not await page.displayed("resolve-form")
    await page.screenshot("not-applied")

    retry = await console_gateway.post("/tickets/issues", key="k-lost", json_body={"n": 1})
    assert retry.status == 201
    assert "Idempotent-Replayed" not in retry.headers
    assert upstream.count == 1


HOSTILE_BODY = (
    "<script>window.__pwned = 'script'</script>"
    "<img src=x onerror=\"window.__pwned = 'img'\">"
    "<b>bold</b>"
)


async def test_html_in_a_receipt_is_text_and_runs_nothing(
    page: ConsolePage, console_gateway: RunningGateway, upstream: CountingUpstream
) -> None:
    # The key, the path and the receipt body are all attacker-shaped; echo=1 answers
    # the request body byte for byte, with the header set below.
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
            json={"outcome": "not_applied", "note": "operator B: nothing upstream"},
            headers={**ADMIN, "If-Match": shown.headers["ETag"]},
        )
        assert other.status == 200

    await page.settle("applied", status=200, body="{}", note="operator A: it exists", wait=False)
    assert "Someone changed this operation" in await page.detail_text("action-error")
    assert "released" in await page.detail_text("summary"), "the page shows B's outcome now"
    story = await page.timeline()
    assert any("operator B" in line for line in story)
    assert not any("operator A" in line for line in story)
    await page.screenshot("conflict")


async def test_filters_by_route_and_age_and_redaction(
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
    assert await page.displayed("list-empty")
    await page.screenshot("filtered")
    await page.filter(route="mail", older_than="0s")
    (row,) = await page.rows(expect=1)

    await page.open_operation(row["id"])
    assert not await page.displayed("resolve-form")
    await page.redact(reason="the body holds an e-mail address (GDPR request #12)")
    assert "The receipt was erased" in await page.detail_text("action-result")
    assert "the body is not retained" in await page.detail_text("receipt")
    await page.screenshot("redacted")

    retry = await gateway.post("/mail/send", key="m-1", json_body={"to": "ops@example.org"})
    assert retry.status == 409
    assert json.loads(await retry.read())["type"].endswith("/receipt-not-retained")


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
        assert "'unsafe-inline'" not in CONTENT_SECURITY_POLICY
        assert "default-src 'none'" in CONTENT_SECURITY_POLICY

        redirect = await session.get(console_gateway.admin_url + "/admin", allow_redirects=False)
        assert redirect.status == 308
        assert redirect.headers["Location"] == "/admin/"
        # Only the page's own files: nothing else of the package is reachable.
        for path in ("/admin/console_view.py", "/admin/../app.py", "/admin/index.html.bak"):
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
