"""PostgreSQL-only behaviours: replicas migrating at once, an unreachable server."""

from __future__ import annotations

import asyncio
import socket

import pytest
from pg import drop_schema, fresh_schema, require_postgres, url_for

from gateway.errors import StoreUnavailable
from gateway.models import ClaimRequest

pytestmark = pytest.mark.postgres


async def test_replicas_starting_together_migrate_once() -> None:
    """Six stores opening one empty schema at once all succeed on one schema version."""
    postgres_store = require_postgres()
    schema = await fresh_schema()
    stores = [postgres_store(url_for(schema), pool_size=2) for _ in range(6)]
    try:
        await asyncio.gather(*(store.open() for store in stores))
        secrets = {await store.scope_secret() for store in stores}
        assert len(secrets) == 1  # one scope secret shared by every replica
        for store in stores:
            await store.ping()
    finally:
        await asyncio.gather(*(store.close() for store in stores))
        await drop_schema(schema)


async def test_an_unreachable_server_is_store_unavailable() -> None:
    """Connection failures surface as StoreUnavailable, never as a driver error."""
    postgres_store = require_postgres()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    store = postgres_store(f"postgresql://postgres@127.0.0.1:{port}/test", pool_size=1)
    with pytest.raises(StoreUnavailable):
        await store.open()
    with pytest.raises(StoreUnavailable):
        await store.claim(
            ClaimRequest(
                scope="s",
                key="k",
                fingerprint="f",
                route="r",
                method="POST",
                path="/r",
                owner="o",
                lease_seconds=1,
                tombstone_seconds=1,
            )
        )
