"""A redaction erases the bytes from the live database files (security review, finding 9).

Setting a column to NULL leaves the old bytes in the SQLite WAL (until a
checkpoint) and in freed pages (unless `secure_delete` is on, which this
machine's SQLite build happens to default to, others do not). After a redact
the receipt's bytes are in neither the database file nor its WAL.
"""

from __future__ import annotations

from pathlib import Path

from conftest import GatewayFactory
from harness import ADMIN_TOKEN
from upstream import CountingUpstream

MARKER = b"patient-record-7f3a9c"


def files_of(tmp_path: Path) -> bytes:
    database = tmp_path / "gateway.db"
    wal = tmp_path / "gateway.db-wal"
    return database.read_bytes() + (wal.read_bytes() if wal.exists() else b"")


async def test_a_redacted_body_is_gone_from_the_database_file_and_its_wal(
    gateway_factory: GatewayFactory, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """The marker the upstream echoed is on disk before the redact and nowhere after."""
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN})
    answer = await gateway.post(
        "/tickets/v1/issues", key="r1", data=MARKER * 200, headers={"Content-Type": "text/plain"}
    )
    assert answer.status == 201
    assert MARKER in files_of(tmp_path)
    operation = await (await gateway.get("/operations/r1")).json()

    assert gateway.admin_url is not None  # the admin API listens on its own port
    redacted = await gateway.session.post(
        f"{gateway.admin_url}/admin/operations/{operation['id']}/redact",
        json={"reason": "data subject request"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert redacted.status == 200, await redacted.text()
    assert MARKER not in files_of(tmp_path)
