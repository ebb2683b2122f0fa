"""How a receipt is kept is said by its row, never sniffed (security review, 7 and 10).

A body that happened to start with the sealed envelope's magic (`IGE1`) was
taken for a sealed one: with encryption off its replay, its lookup, every admin
listing that held it and its redaction answered 500. And with encryption on,
stored response headers (`X-Upstream-Token`) stayed in clear.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path

import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN
from upstream import CountingUpstream

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
LOOKALIKE = b"IGE1" + bytes(range(256)) + b"not sealed at all"


def db_bytes(tmp_path: Path) -> bytes:
    wal = tmp_path / "gateway.db-wal"
    return (tmp_path / "gateway.db").read_bytes() + (wal.read_bytes() if wal.exists() else b"")


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
async def test_a_body_that_looks_sealed_replays_byte_for_byte(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, encrypted: bool
) -> None:
    """Replay, lookup, admin listing and redaction all work on an `IGE1...` body."""
    store = {"encryption_keys": [base64.b64encode(os.urandom(32)).decode()]} if encrypted else {}
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN}, store=store)
    path = "/tickets/v1/issues?echo=1"
    first = await gateway.post(path, key="look-1", data=LOOKALIKE)
    assert (first.status, await first.read()) == (201, LOOKALIKE)
    replay = await gateway.post(path, key="look-1", data=LOOKALIKE)
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert await replay.read() == LOOKALIKE

    lookup = await gateway.get("/operations/look-1")
    assert lookup.status == 200
    listing = await gateway.admin_get("/admin/operations", headers=ADMIN)
    assert listing.status == 200
    operation_id = (await lookup.json())["id"]
    redacted = await gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{operation_id}/redact",
        json={"reason": "test"},
        headers=ADMIN,
    )
    assert redacted.status == 200, await redacted.text()


async def test_encryption_covers_stored_response_headers(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """With encryption keys, a stored header value is not on disk in clear; the replay
    still carries it."""
    key = base64.b64encode(os.urandom(32)).decode()
    gateway = await gateway_factory(upstream.url, store={"encryption_keys": [key]})
    path = "/tickets/v1/issues?token=1"
    first = await gateway.post(path, key="hdr-1", json_body={})
    assert first.headers["X-Upstream-Token"] == "tok-9f8e7d6c5b"
    replay = await gateway.post(path, key="hdr-1", json_body={})
    assert replay.headers["X-Upstream-Token"] == "tok-9f8e7d6c5b"
    assert b"tok-9f8e7d6c5b" not in db_bytes(tmp_path)
