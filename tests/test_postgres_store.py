"""PostgreSQL-only behaviours: replicas migrating at once, an unreachable server."""

from __future__ import annotations

import asyncio

import pytest
from pg import claim_request, drop_schema, fresh_schema, require_postgres, url_for

from gateway.engine.errors import StoreUnavailable
from gateway.engine.models import NewAttempt, Resolution, StoredResponse

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


async def test_an_unreachable_server_is_store_unavailable(refused_port: int) -> None:
    """Connection failures surface as StoreUnavailable, never as a driver error."""
    postgres_store = require_postgres()
    store = postgres_store(f"postgresql://postgres@127.0.0.1:{refused_port}/test", pool_size=1)
    with pytest.raises(StoreUnavailable):
        await store.open()
    with pytest.raises(StoreUnavailable):
        await store.claim(claim_request("k"))


async def test_only_watched_operations_are_signalled_to_other_replicas() -> None:
    """An outcome reaches other replicas' `subscribe` callbacks only if one of them
    watched the operation: no NOTIFY (a database-wide commit lock) for the rest."""
    postgres_store = require_postgres()
    schema = await fresh_schema()
    writer = postgres_store(url_for(schema), pool_size=2)
    waiter = postgres_store(url_for(schema), pool_size=2)
    signalled: list[str] = []
    arrived = asyncio.Event()

    def on_settled(operation_id: str) -> None:
        signalled.append(operation_id)
        arrived.set()

    try:
        await writer.open()
        await waiter.open()
        assert await waiter.subscribe(on_settled)
        claims = []
        for key in ("quiet", "watched"):
            result = await writer.claim(claim_request(key))
            assert isinstance(result, NewAttempt)
            claims.append(result.operation)
        quiet, watched = claims
        await waiter.watch(watched.id)
        await waiter.watch(watched.id)  # watching twice is harmless

        for operation in (quiet, watched):
            done = await writer.complete(
                operation.id,
                operation.token,
                StoredResponse(status=201, headers=(), body=b"{}"),
                body_retained=True,
                retention_seconds=60,
                tombstone_seconds=600,
                resolution=Resolution(by="upstream", at=0.0),
            )
            assert done is not None
        await asyncio.wait_for(arrived.wait(), 5)
        await asyncio.sleep(0.3)  # a notification for `quiet` would have come by now
        assert signalled == [watched.id]
    finally:
        await asyncio.gather(writer.close(), waiter.close())
        await drop_schema(schema)
