"""Every answer of the admin API is no cache's to keep and never sniffed (security review).

Operations, notes and recorded requests pass through the admin API: a browser or
proxy cache must not keep them (`Cache-Control: no-store`), and a JSON answer
must never be sniffed into a page that runs (`X-Content-Type-Options: nosniff`),
for the problems it answers as much as for the documents.
"""

from __future__ import annotations

import pytest
from conftest import GatewayFactory
from harness import ADMIN_TOKEN
from upstream import CountingUpstream

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.mark.parametrize(
    ("path", "headers", "status"),
    [
        ("/admin/operations", ADMIN, 200),
        ("/admin/overview", ADMIN, 200),
        ("/admin/operations", {}, 401),
        ("/admin/operations/op_missing", ADMIN, 404),
        ("/admin/verify", ADMIN, 200),
    ],
)
async def test_admin_answers_are_not_stored_nor_sniffed(
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    path: str,
    headers: dict[str, str],
    status: int,
) -> None:
    gateway = await gateway_factory(upstream.url, admin={"token": ADMIN_TOKEN})
    answer = await gateway.admin_get(path, headers=headers)
    assert answer.status == status
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["X-Content-Type-Options"] == "nosniff"
