"""Secrets stay secret (issue: "Secrets stay secret", a black-box security review).

Each finding of the review is a test here that failed on the main of then, run
against a gateway started as in production (a subprocess) where the finding was
black-box.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import sqlite3
from pathlib import Path

import aiohttp
import pytest
from conftest import GatewayFactory
from harness import (
    ADMIN_ENV,
    ADMIN_TOKEN,
    GatewayProcess,
    settings_for,
    spawn,
    start_gateway,
    stop_gateway,
)
from upstream import CountingUpstream

from gateway.engine.fingerprint import fingerprints
from gateway.web.appkeys import STORE

FORGED = "INFO gateway.admin: resolved op_1 by admin:root force=true"


async def test_a_path_cannot_write_a_line_of_its_own_in_a_text_log(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Finding 5: `%0A` in a path wrote a forged line into the text-format log. Control
    characters are now escaped in every text line (the access line included), so the
    forged text stays inside the request's own line."""
    gateway = spawn(processes, tmp_path, upstream.url, logging={"level": "info", "format": "text"})
    forged = FORGED.replace(" ", "%20").replace(":", "%3A")
    async with aiohttp.ClientSession() as session:
        for path in (f"/tickets/v1/x%0A{forged}", f"/nowhere%0D%0A{forged}"):
            async with session.get(gateway.url + path) as answer:
                await answer.read()
    assert gateway.log_path is not None
    async with asyncio.timeout(30):  # the access log is written by a thread, in batches
        while (text := gateway.log_path.read_text()).count("\\x0a" + FORGED) < 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    for line in text.splitlines():
        assert not line.startswith(FORGED), line


async def test_owners_never_see_an_operators_name_and_reasons_are_never_logged(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Finding 4: an owner's lookup showed `resolved not applied by admin:Mallory
    Ops-Lead (ext. 4411)`, and a redaction's reason (an erasable field) was written to
    the log verbatim. The owner now reads "an operator" wherever an admin acted, and the
    log keeps the reason's length only."""
    gateway = spawn(
        processes,
        tmp_path,
        upstream.url,
        env=ADMIN_ENV,
        logging={"level": "info", "format": "json"},
    )
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}", "X-Admin-Actor": "Mallory Ops-Lead"}
    reason = "GDPR erasure request #5521 from Jane Roe"
    async with aiohttp.ClientSession() as session:
        async with session.post(
            f"{gateway.url}/tickets/v1/t?drop=after_effect",
            json={},
            headers={"Idempotency-Key": "m-1"},
        ) as lost:
            assert lost.status == 502
        async with session.get(f"{gateway.url}/operations/m-1") as found:
            op_id = (await found.json())["id"]
        async with session.post(
            f"{gateway.admin_url}/admin/operations/{op_id}/resolve",
            json={"outcome": "not_applied", "note": "checked by Mallory", "force": True},
            headers=admin,
        ) as resolved:
            assert resolved.status == 200, await resolved.text()
        async with session.post(
            f"{gateway.admin_url}/admin/operations/{op_id}/redact",
            json={"reason": reason},
            headers=admin,
        ) as redacted:
            assert redacted.status == 200, await redacted.text()
        async with session.get(f"{gateway.url}/operations/m-1") as owner:
            seen = await owner.text()
    assert "Mallory" not in seen
    history = json.loads(seen)["history"]
    assert [e["actor"] for e in history if e["type"] in ("resolved", "redacted")] == [
        "an operator",
        "an operator",
    ]
    assert gateway.log_path is not None
    async with asyncio.timeout(30):
        while '"event": "redaction"' not in (log := gateway.log_path.read_text()):  # noqa: ASYNC110
            await asyncio.sleep(0.05)
    assert "Jane Roe" not in log
    (line,) = [json.loads(text) for text in log.splitlines() if '"event": "redaction"' in text]
    assert line["reason_length"] == len(reason)


async def test_metrics_can_be_kept_off_the_main_listener(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Finding 7: `/metrics` on the main listener shows every tenant the gateway-wide
    counts. The default stays there (where Prometheus looks); `[metrics] listener =
    "admin"` serves it on the admin listener only, the main one answering 404."""
    default = spawn(processes, tmp_path, upstream.url, env=ADMIN_ENV)
    (tmp_path / "kept").mkdir()
    kept = spawn(
        processes,
        tmp_path / "kept",
        upstream.url,
        env=ADMIN_ENV,
        admin={"token": ADMIN_TOKEN},  # checked in this process too: the listener must exist
        metrics={"listener": "admin"},
    )
    async with aiohttp.ClientSession() as session:
        seen = {}
        for name, gateway in (("default", default), ("admin", kept)):
            for listener in (gateway.url, gateway.admin_url):
                async with session.get(f"{listener}/metrics") as answer:
                    seen[name, listener == gateway.url] = answer.status
    assert seen == {
        ("default", True): 200,
        ("default", False): 404,
        ("admin", True): 404,
        ("admin", False): 200,
    }


async def test_client_address_headers_are_dropped_and_header_bytes_arrive_as_sent(
    processes: list[GatewayProcess], tmp_path: Path, upstream: CountingUpstream
) -> None:
    """Finding 8: a caller's `X-Real-IP`, `True-Client-IP`, `X-Forwarded-Port`,
    `X-Original-URL` and `X-Rewrite-URL` reached the upstream, and a header byte above
    0x7F arrived double-encoded (`café` as `cafÃ©`), a credential's included. Now the
    first are dropped (no trusted proxy here) and UTF-8 values arrive as sent."""
    gateway = spawn(processes, tmp_path, upstream.url)
    claims = {
        "X-Real-IP": "10.0.0.1",
        "True-Client-IP": "10.0.0.2",
        "X-Forwarded-Port": "443",
        "X-Original-URL": "/admin",
        "X-Rewrite-URL": "/admin",
    }
    sent = {"Idempotency-Key": "h-1", "X-Note": "café", "Authorization": "Bearer tök", **claims}
    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{gateway.url}/tickets/v1/t", json={}, headers=sent) as answer,
    ):
        assert answer.status == 201, await answer.text()
    (effect,) = upstream.effects
    assert not {name.lower() for name in claims} & set(effect.headers)
    assert effect.headers["x-note"] == "café"
    assert effect.headers["authorization"] == "Bearer tök"


SPELLINGS = [
    "Bearer alice",
    "bearer alice",
    "BEARER alice",
    "bEaRer alice",
    " Bearer alice",
    "Bearer alice ",
    "Bearer  alice",
    "Bearer\talice",
    "\tBearer alice\t",
    "beaRER   alice  ",
    "Bearer alice\t",
    "  bearer alice  ",
]


async def test_one_credential_is_one_scope_however_its_scheme_is_spelled(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """Finding 6: twelve spellings of `Bearer alice` were twelve tenants (12 x 200 where
    `max_in_flight = 4` gave `Bearer alice` 4 x 200). The scheme is case-blind and blanks
    around it ignored: every spelling finds the one receipt, and the upstream saw one
    effect."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": False})
    for spelling in SPELLINGS:
        answer = await gateway.post(
            "/tickets/v1/t", key="one", json_body={}, headers={"Authorization": spelling}
        )
        assert answer.status == 201, (spelling, await answer.text())
    assert upstream.count == 1
    other = await gateway.post(
        "/tickets/v1/t", key="one", json_body={}, headers={"Authorization": "Bearer Alice"}
    )
    assert other.status == 201
    assert upstream.count == 2  # the credential itself is exact: another token, another scope


@pytest.mark.parametrize(
    "value", ["Bearer undefined", "Bearer None", "Bearer null", "Bearer nil", "undefined", "NULL"]
)
async def test_an_unset_token_variable_is_no_credential(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, value: str
) -> None:
    """Finding 6: agents whose token variable is unset send `Bearer undefined` or `Bearer
    None`, and all shared one tenant, reading each other's receipts. Such a value is no
    credential: `401 missing-credentials`, nothing sent."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": False})
    answer = await gateway.post(
        "/tickets/v1/t", key="u-1", json_body={}, headers={"Authorization": value}
    )
    problem = await answer.json()
    assert (answer.status, problem["type"].rsplit("/", 1)[-1]) == (401, "missing-credentials")
    assert upstream.count == 0


async def test_keys_made_before_the_upgrade_are_found_for_one_retention(
    tmp_path: Path, upstream: CountingUpstream
) -> None:
    """A key made by a gateway that hashed `Bearer alice` as it came is still found (its
    receipt replayed, no second effect) after the upgrade to normalised scopes, for one
    `retention`; on a store that never had such keys nothing is looked up twice."""
    settings = settings_for(tmp_path, upstream.url, idempotency={"shared_scope": False})
    alice = {"Authorization": "Bearer alice"}
    first = await start_gateway(settings)
    try:
        assert (
            await first.post("/tickets/v1/t", key="old", json_body={}, headers=alice)
        ).status == 201
    finally:
        await stop_gateway(first)
    with sqlite3.connect(tmp_path / "gateway.db") as db:  # as the gateway before the upgrade
        (secret,) = db.execute(
            "SELECT value FROM gateway_meta WHERE name = 'scope_secret'"
        ).fetchone()
        exact = hmac.new(bytes(secret), b"authorization:Bearer alice", hashlib.sha256).hexdigest()
        plain, _ = fingerprints("POST", "tickets", "/tickets/v1/t", "", "application/json", b"{}")
        db.execute(
            "UPDATE operations SET scope = ?, fingerprint = ? WHERE key = 'old'",
            ("hmac:" + exact, plain),
        )
        db.execute("DELETE FROM gateway_meta WHERE name = 'scopes_normalised_since'")
        for table in ("request_log", "request_counts"):  # what versions 9 and 10 added
            db.execute(f"DROP TABLE {table}")
        db.execute("UPDATE schema_version SET version = 8")  # fingerprints were plain then
    db.close()
    second = await start_gateway(settings)
    try:
        retry = await second.post("/tickets/v1/t", key="old", json_body={}, headers=alice)
        assert (retry.status, retry.headers.get("Idempotent-Replayed")) == (201, "true")
        found = await second.get("/operations/old", headers=alice)
        assert found.status == 200
    finally:
        await stop_gateway(second)
    assert upstream.count == 1


async def test_similar_refusals_bind_no_more_keys_than_max_bindings(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, store_url: str | None
) -> None:
    """Finding 3: each `similar-operation` refusal wrote a binding no quota counted (242
    bindings in 22 s with `max_operations = 50`). Past `max_bindings` a refusal that
    would bind is `429 quota-exceeded` (nothing sent, nothing kept), and bindings count
    toward `max_operations`."""
    gateway = await gateway_factory(upstream.url, store_url=store_url, quotas={"max_bindings": 2})
    first = asyncio.create_task(gateway.post("/tickets/v1/t?hold=1", key="a", json_body={}))
    await upstream.wait_for_held(1)
    answers = []
    for key in ("b", "c", "d", "e"):
        answer = await gateway.post("/tickets/v1/t?hold=1", key=key, json_body={})
        answers.append((answer.status, (await answer.json())["type"].rsplit("/", 1)[-1]))
    assert answers == [
        (409, "similar-operation"),
        (409, "similar-operation"),
        (429, "quota-exceeded"),
        (429, "quota-exceeded"),
    ]
    upstream.release_held()
    assert (await first).status == 201
    assert upstream.count == 1
    stored = await gateway.app[STORE].count_for_scope("anonymous")
    assert stored == 3  # the operation and its two bindings
