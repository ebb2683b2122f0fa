"""Quotas that rotating credentials cannot escape, in tables that stay bounded
(security review, finding 6).

A fresh random `Authorization` per request made a fresh scope, so a per-scope
new-key limit of 3 let 200 of 200 through, and each new credential added a
table entry that was never removed. A route-wide cap counts every scope
together, and the per-scope tables keep at most `MAX_TRACKED_SCOPES` entries.
"""

from __future__ import annotations

import asyncio
import json

from conftest import GatewayFactory
from upstream import CountingUpstream

from gateway.config import QuotaSettings
from gateway.engine.quotas import MAX_TRACKED_SCOPES, ScopeQuotas


async def test_rotating_credentials_do_not_escape_the_route_wide_cap(
    gateway_factory: GatewayFactory, upstream: CountingUpstream
) -> None:
    """20 new keys under 20 different credentials, a per-scope limit of 3 and a route
    cap of 5: 5 are forwarded, the rest get 429 quota-exceeded."""
    gateway = await gateway_factory(
        upstream.url, quotas={"new_keys_per_minute": 3, "route_new_keys_per_minute": 5}
    )
    statuses = []
    for i in range(20):
        answer = await gateway.post(
            "/tickets/v1/issues",
            key=f"k{i}",
            json_body={},
            headers={"Authorization": f"Bearer rotating-{i}"},
        )
        statuses.append(answer.status)
        if answer.status == 429:
            assert json.loads(await answer.read())["type"].endswith("/quota-exceeded")
    assert statuses.count(201) == 5, statuses
    assert statuses.count(429) == 15
    assert upstream.count == 5


async def test_per_scope_tables_stay_bounded_whatever_the_number_of_credentials() -> None:
    """Three times MAX_TRACKED_SCOPES distinct scopes leave at most MAX_TRACKED_SCOPES
    entries in each per-scope table."""
    quotas = ScopeQuotas(QuotaSettings(new_keys_per_minute=10, max_operations=100))

    async def count() -> int:
        return 0

    for i in range(3 * MAX_TRACKED_SCOPES):
        await quotas.admit_new_key(f"hmac:{i}", "tickets", count)
    assert quotas.tracked_scopes() <= MAX_TRACKED_SCOPES
    await asyncio.sleep(0)
