"""Keyed fingerprints (issue "Secrets stay secret", finding 1).

The review saw `"amount":"[redacted]"` next to the operation's fingerprint and
recovered `amount = 7315` by brute force in 0.02 s; the recorded request's
digest, and the `fingerprint` column of the database file (encryption at rest
on or not), gave the same answer, and fingerprints survived a redaction. Every
fingerprint and derived key the gateway stores or shows is now an HMAC keyed
per scope: these tests guess as the reviewer did and confirm nothing, and
check that a store written before the upgrade keeps every promise after it.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import re
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest_asyncio
from conftest import GatewayFactory
from harness import ADMIN_TOKEN, RunningGateway, stop_gateway
from mcp_upstream import CountingMcpServer, call_with_key, mcp_client
from test_cli import operation_id
from test_cli_history import admin_json
from test_mcp_routes import mcp_route
from upstream import CountingUpstream

from gateway.config.routes import DEFAULT_REQUEST_REDACTIONS
from gateway.engine.digests import Digests
from gateway.engine.fingerprint import fingerprints
from gateway.engine.scopes import CallerScope
from gateway.mcp.calls import derived_key, fingerprint_call, tool_call_of
from gateway.mcp.derived_keys import CLOCK_MARGIN, DerivedKeys
from gateway.mcp.jsonrpc import parse_message

PATH = "/tickets/v1/payments"
TO = "acct-9"
AMOUNT = 7315
JSON = {"Content-Type": "application/json"}
HEX_RUN = re.compile(r"[0-9a-f]{32,}")


def body_of(amount: int) -> bytes:
    return json.dumps({"amount": amount, "to": TO}).encode()


def guessed_digests(amount: int) -> set[str]:
    """Every plain digest a reader could compute from a guess: both fingerprint forms of
    the request and SHA-256 of the body, whole and cut to a body digest's 32 digits."""
    v2, v1 = fingerprints("POST", "tickets", PATH, "", "application/json", body_of(amount))
    assert v1 is not None
    body = hashlib.sha256(body_of(amount)).hexdigest()
    hexes = {v2.rsplit(":", 1)[1], v1.rsplit(":", 1)[1], body}
    return hexes | {text[:32] for text in hexes}


def confirmed(surfaces: list[str], guesses: range) -> list[int]:
    """The guesses that some hex digest on `surfaces` confirms."""
    runs = {run for surface in surfaces for run in HEX_RUN.findall(surface)}
    runs |= {run[:32] for run in runs}
    return [amount for amount in guesses if guessed_digests(amount) & runs]


def store_bytes(directory: Path) -> str:
    """The SQLite store's files (database, WAL) as text a digest can be found in."""
    files = sorted(directory.glob("gateway.db*"))
    return "".join(path.read_bytes().decode("latin-1") for path in files)


async def test_nothing_shown_or_stored_confirms_a_guess_of_a_redacted_value(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """The reviewer's attack: the amount is redacted from the recorded request, and every
    amount from 0 to 9,999 is guessed against the admin document, its history and the
    database file. No guess is confirmed, before or after an operator's redaction."""
    gateway = await gateway_factory(
        upstream.url,
        admin={"token": ADMIN_TOKEN},
        route={"redact_request": [*DEFAULT_REQUEST_REDACTIONS, "amount"]},
        store={"encryption_keys": [base64.b64encode(b"e" * 32).decode()]},
    )
    answer = await gateway.post(PATH, key="pay-1", data=body_of(AMOUNT), headers=JSON)
    assert answer.status == 201
    op_id = await operation_id(gateway, "pay-1")
    document = await admin_json(gateway, f"/admin/operations/{op_id}")
    history = await admin_json(gateway, f"/admin/operations/{op_id}/history")
    recorded = json.dumps(document.get("request"))
    assert "[redacted]" in recorded  # the scene of the review
    assert str(AMOUNT) not in recorded
    assert document["fingerprint"].startswith("v2:hmac-sha256:")
    surfaces = [json.dumps(document), json.dumps(history), store_bytes(tmp_path)]
    guesses = range(10_000)
    assert confirmed([json.dumps({"amount": AMOUNT})], guesses) == []  # the check can't lie
    assert confirmed([str(guessed_digests(AMOUNT))], guesses) == [AMOUNT]  # ...and can see
    assert confirmed(surfaces, guesses) == []

    async with gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{op_id}/redact",
        json={"reason": "erasure"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    ) as redacted:
        assert redacted.status == 200, await redacted.text()
    after = await admin_json(gateway, f"/admin/operations/{op_id}")
    assert confirmed([json.dumps(after), store_bytes(tmp_path)], guesses) == []


async def test_two_callers_sending_one_request_store_different_fingerprints(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """A fingerprint is keyed per scope: the same request from two callers is two
    values, so one caller's fingerprint says nothing about another's request."""
    gateway = await gateway_factory(upstream.url, idempotency={"shared_scope": False})
    for token in ("alice", "bob"):
        answer = await gateway.post(
            PATH,
            key="same",
            data=body_of(AMOUNT),
            headers={**JSON, "Authorization": f"Bearer {token}"},
        )
        assert answer.status == 201
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        rows = db.execute("SELECT scope, fingerprint FROM operations").fetchall()
    db.close()
    assert len({scope for scope, _ in rows}) == 2
    assert len({fingerprint for _, fingerprint in rows}) == 2


# --- a store written before the upgrade ------------------------------------------------


async def _edit_store(store_url: str | None, tmp_path: Path, statements: list[str]) -> None:
    """Run `statements` on the test's store by hand (`?` placeholders-free SQL)."""
    if store_url is None:
        with sqlite3.connect(tmp_path / "gateway.db") as db:
            for statement in statements:
                db.execute(statement)
        db.close()
        return
    connection = await asyncpg.connect(store_url)
    try:
        for statement in statements:
            await connection.execute(statement)
    finally:
        await connection.close()


async def _fingerprints(store_url: str | None, tmp_path: Path) -> list[str]:
    if store_url is None:
        with sqlite3.connect(tmp_path / "gateway.db") as db:
            rows = db.execute("SELECT fingerprint FROM operations ORDER BY key").fetchall()
        db.close()
        return [row[0] for row in rows]
    connection = await asyncpg.connect(store_url)
    try:
        return [row[0] for row in await connection.fetch("SELECT fingerprint FROM operations")] + [
            row[0] for row in await connection.fetch("SELECT fingerprint FROM similar_refusals")
        ]
    finally:
        await connection.close()


def _plain(body: bytes, query: str = "", *, version: int) -> str:
    v2, v1 = fingerprints("POST", "tickets", PATH, query, "application/json", body)
    assert v1 is not None
    return v2 if version == 2 else v1


LATER_TABLES = ("DROP TABLE request_log", "DROP TABLE request_counts")
"""What the versions after keyed fingerprints added (the request log)."""


def _downgrade(store_url: str | None) -> list[str]:
    """The statements that set the schema back to the version before keyed fingerprints."""
    if store_url is None:
        return [*LATER_TABLES, "UPDATE schema_version SET version = 8"]
    return [*LATER_TABLES, "UPDATE gateway_schema_version SET version = 9"]


async def test_an_upgraded_store_keeps_no_plain_fingerprint_and_every_promise(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
    store_url: str | None,
) -> None:
    """Operations stored with plain fingerprints (both older forms, as the gateways
    before kept them) are keyed in place by the upgrade: nothing plain is left in the
    store, a retry of a completed key is replayed and another request under it is 422,
    and an unknown operation still refuses the same request under a new key."""
    gateway = await gateway_factory(upstream.url, store_url=store_url)
    body = body_of(AMOUNT)
    lost_query = "drop=after_effect"
    assert (await gateway.post(PATH, key="done-v2", data=body, headers=JSON)).status == 201
    assert (await gateway.post(PATH, key="done-v1", data=body, headers=JSON)).status == 201
    lost = await gateway.post(f"{PATH}?{lost_query}", key="lost-v2", data=body, headers=JSON)
    assert lost.status == 502
    await stop_gateway(gateway)
    plain = {
        "done-v2": _plain(body, version=2),
        "done-v1": _plain(body, version=1),
        "lost-v2": _plain(body, lost_query, version=2),
    }
    await _edit_store(
        store_url,
        tmp_path,
        [
            *(
                f"UPDATE operations SET fingerprint = '{value}' WHERE key = '{key}'"
                for key, value in plain.items()
            ),
            *_downgrade(store_url),
        ],
    )
    again = await gateway_factory(upstream.url, store_url=store_url)

    stored = await _fingerprints(store_url, tmp_path)
    assert len(stored) == 3
    assert all(value.startswith(("v2:hmac-sha256:", "v1:hmac-sha256:")) for value in stored)
    assert not set(plain.values()) & set(stored)
    for key in ("done-v2", "done-v1"):
        retry = await again.post(PATH, key=key, data=body, headers=JSON)
        assert (retry.status, retry.headers.get("Idempotent-Replayed")) == (201, "true"), key
        other = await again.post(PATH, key=key, data=body_of(1), headers=JSON)
        assert other.status == 422, key
    twin = await again.post(f"{PATH}?{lost_query}", key="new-key", data=body, headers=JSON)
    assert twin.status == 409, await twin.text()
    assert (await twin.json())["similar_operation"]["key"] == "lost-v2"
    assert upstream.count == 3


async def test_a_key_bound_plain_by_a_replica_of_before_is_the_same_request(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
    store_url: str | None,
) -> None:
    """During a rolling upgrade a replica of the previous version still writes plain
    fingerprints into the upgraded store: a retry through an upgraded one is replayed,
    never refused as another request."""
    gateway = await gateway_factory(upstream.url, store_url=store_url)
    body = body_of(AMOUNT)
    assert (await gateway.post(PATH, key="by-old", data=body, headers=JSON)).status == 201
    await _edit_store(
        store_url,
        tmp_path,
        [f"UPDATE operations SET fingerprint = '{_plain(body, version=2)}' WHERE key = 'by-old'"],
    )
    retry = await gateway.post(PATH, key="by-old", data=body, headers=JSON)
    assert (retry.status, retry.headers.get("Idempotent-Replayed")) == (201, "true")
    assert (await gateway.post(PATH, key="by-old", data=body_of(1), headers=JSON)).status == 422
    assert upstream.count == 1


# --- MCP: fingerprints and derived keys -------------------------------------------------


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


ARGUMENTS = {"title": "refund 7315 to acct-9"}


def _plain_call(arguments: dict[str, Any]) -> tuple[str, str]:
    """(plain derived key, plain fingerprint) of `create_ticket` on route "tools"."""
    message = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "create_ticket", "arguments": arguments},
        }
    ).encode()
    call = tool_call_of(parse_message(message), header_keys=[])
    return derived_key("tools", call), fingerprint_call("tools", call)


async def _mcp_gateway(
    gateway_factory: GatewayFactory, server: CountingMcpServer
) -> RunningGateway:
    return await gateway_factory(
        server.url,
        route=mcp_route(server, status_tool="operation_status", derive_key="arguments"),
    )


async def test_a_derived_key_and_an_mcp_fingerprint_are_keyed_and_older_calls_still_found(
    gateway_factory: GatewayFactory, server: CountingMcpServer, tmp_path: Path
) -> None:
    """A derived key named the arguments by a plain SHA-256 (`d:` + base64url), which
    confirms a guess as a fingerprint does: it is keyed now, as is the call's
    fingerprint. A call made before the upgrade, under its plain derived key, is still
    found by its retry (replayed, not a second ticket) and by the status tool."""
    plain_key, plain_fingerprint = _plain_call(ARGUMENTS)
    gateway = await _mcp_gateway(gateway_factory, server)
    async with asyncio.timeout(60), mcp_client(gateway.url + "/tools") as client:
        first = await call_with_key(client, "create_ticket", ARGUMENTS, None)
    assert first.is_error is False
    with sqlite3.connect(tmp_path / "gateway.db") as db:
        ((key, fingerprint),) = db.execute("SELECT key, fingerprint FROM operations").fetchall()
    db.close()
    assert key.startswith("d:")
    assert len(key) == len(plain_key)
    assert key != plain_key
    assert fingerprint.startswith("v1:hmac-sha256:")
    await stop_gateway(gateway)

    # As the gateway before the upgrade stored it: a plain key and fingerprint.
    await _edit_store(
        None,
        tmp_path,
        [
            f"UPDATE operations SET key = '{plain_key}', fingerprint = '{plain_fingerprint}'",
            "DELETE FROM gateway_meta WHERE name = 'derived_keys_keyed_since'",
            *_downgrade(None),
        ],
    )
    again = await _mcp_gateway(gateway_factory, server)
    async with asyncio.timeout(60), mcp_client(again.url + "/tools") as client:
        retry = await call_with_key(client, "create_ticket", ARGUMENTS, None)
        status = await client.call_tool(
            "operation_status", {"tool": "create_ticket", "arguments": ARGUMENTS}
        )
    assert retry.is_error is False
    assert retry.meta is not None
    assert retry.meta["idempotencyReplayed"] is True
    assert status.structured_content is not None
    assert (status.structured_content["key"], status.structured_content["state"]) == (
        plain_key,
        "completed",
    )
    assert len(server.tickets) == 1


async def test_plain_derived_keys_are_looked_up_only_while_they_may_exist() -> None:
    """A store that had no operations when keyed derived keys came looks nothing up by
    the plain key (a fresh install pays nothing on the miss path); an upgraded one looks
    the plain key up under the scope, then under the scope of the exact credential
    bytes, for one retention plus the clock margin, and no longer."""
    plain_key, _ = _plain_call(ARGUMENTS)
    message = parse_message(
        json.dumps(
            {
                "jsonrpc": "2.0",
                "id": 1,
                "method": "tools/call",
                "params": {"name": "create_ticket", "arguments": ARGUMENTS},
            }
        ).encode()
    )
    call = tool_call_of(message, header_keys=[])
    stored: dict[tuple[str, str], str] = {}
    asked: list[tuple[str, str]] = []

    async def find(scope: str, key: str) -> str | None:
        asked.append((scope, key))
        return stored.get((scope, key))

    now = 1_000_000.0
    caller = CallerScope("hmac:new", strips_authorization=False, legacy="hmac:exact")
    fresh = DerivedKeys(Digests(b"s" * 32), plain_since=None, clock=lambda: now)
    scope, key = await fresh.settled(caller, "tools", call, 600.0, find)
    assert (scope, asked) == (caller, [])
    assert key == fresh.of("hmac:new", "tools", call) != plain_key

    upgraded = DerivedKeys(Digests(b"s" * 32), plain_since=now - 60, clock=lambda: now)
    stored[("hmac:exact", plain_key)] = "made before the upgrade"
    scope, key = await upgraded.settled(caller, "tools", call, 600.0, find)
    assert (scope.scope, scope.legacy, key) == ("hmac:exact", None, plain_key)
    assert [k for _, k in asked] == [upgraded.of("hmac:new", "tools", call), plain_key, plain_key]

    asked.clear()
    late = DerivedKeys(Digests(b"s" * 32), plain_since=now - 600 - CLOCK_MARGIN, clock=lambda: now)
    scope, key = await late.settled(caller, "tools", call, 600.0, find)
    assert (scope, key, asked) == (caller, late.of("hmac:new", "tools", call), [])
