"""Stored bodies encrypted at rest, readable across a key rotation."""

from __future__ import annotations

import base64
import os
import sqlite3
from pathlib import Path

import pytest
from harness import settings_for, start_gateway, stop_gateway
from upstream import CountingUpstream

from gateway.store.crypto import BodyCipher, CipherError

SECRET = "ssn-123-45-6789"


def new_key() -> str:
    return base64.b64encode(os.urandom(32)).decode()


def stored_bodies(db: Path) -> list[bytes]:
    with sqlite3.connect(db) as connection:
        return [
            bytes(row[0])
            for row in connection.execute("SELECT response_body FROM operations")
            if row[0] is not None
        ]


async def test_bodies_are_sealed_on_disk_and_replayed_in_clear(
    tmp_path: Path, upstream: CountingUpstream
) -> None:
    """With encryption keys, the database holds no plaintext body, and replays are exact."""
    old, new = new_key(), new_key()
    settings = settings_for(tmp_path, upstream.url, store={"encryption_keys": [old]})
    gateway = await start_gateway(settings)
    try:
        first = await gateway.post("/tickets/v1/issues", key="e1", json_body={"ssn": SECRET})
        body = await first.read()
        assert SECRET.encode() in body
    finally:
        await stop_gateway(gateway)
    assert all(SECRET.encode() not in stored for stored in stored_bodies(tmp_path / "gateway.db"))

    rotated = settings_for(tmp_path, upstream.url, store={"encryption_keys": [new, old]})
    gateway = await start_gateway(rotated)
    try:
        retry = await gateway.post("/tickets/v1/issues", key="e1", json_body={"ssn": SECRET})
        assert retry.headers["Idempotent-Replayed"] == "true"
        assert await retry.read() == body
        await gateway.post("/tickets/v1/issues", key="e2", json_body={"ssn": SECRET})
    finally:
        await stop_gateway(gateway)
    assert upstream.count == 2


def test_a_body_sealed_for_one_operation_does_not_open_for_another() -> None:
    """The operation id is bound into the seal: moved or altered bodies are refused."""
    cipher = BodyCipher([new_key()])
    sealed = cipher.seal(b"receipt", "op_a")
    with pytest.raises(CipherError):
        cipher.open(sealed, "op_b")
    with pytest.raises(CipherError):
        cipher.open(sealed[:-1] + bytes([sealed[-1] ^ 1]), "op_a")
    with pytest.raises(CipherError):
        BodyCipher([new_key()]).open(sealed, "op_a")
    with pytest.raises(CipherError):  # only a row marked sealed is ever opened
        BodyCipher([new_key()]).open(b"plain bytes", "op_a")
