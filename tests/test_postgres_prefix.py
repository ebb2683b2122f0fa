"""The admin search by prefix on PostgreSQL (`gateway.store.postgres_prefix`).

A prefix is read through the key table's `text_pattern_ops` indexes when few
operations match, by a walk in `seq` order when many do or while the indexes
are not built: every way gives the same pages, exactly the keys and ids that
start with the text (`%`, `_` and `-` meaning themselves, case kept), in the
order operations were recorded. The indexes are built in the background on a
big key table, and one left invalid by a build that stopped is built again.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest
from pg import schema_url

from gateway.engine.models import ClaimRequest
from gateway.store import postgres as postgres_module
from gateway.store import postgres_prefix
from gateway.store.base import OperationFilter
from gateway.store.postgres import PostgresStore

pytestmark = pytest.mark.postgres

KEYS = ("k-1", "k-2", "k_%", "k-é", "K-3", "k", "kk-1", "k-10", "x-k-1")
"""Keys that start with `k-` and some that only look as if they might."""


def _claim(scope: str, key: str) -> ClaimRequest:
    return ClaimRequest(scope=scope, key=key, fingerprint="f", route="r", method="POST",
                        path="/r", owner="o", lease_seconds=30, tombstone_seconds=600)  # fmt: skip


async def _store(url: str) -> PostgresStore:
    store = PostgresStore(url, pool_size=2)
    await store.open()
    return store


async def _pages(store: PostgresStore, prefix: str, limit: int = 3) -> list[list[str]]:
    found: list[list[str]] = []
    cursor = None
    while True:
        page = await store.list_operations(
            OperationFilter(prefix=prefix), limit=limit, cursor=cursor
        )
        found.append([f"{op.scope}/{op.key}" for op in page.items])
        if (cursor := page.next_cursor) is None:
            return found


@pytest.fixture
async def filled() -> AsyncIterator[tuple[PostgresStore, list[str], str]]:
    """A store with `KEYS` claimed in two scopes; the operation ids, in creation order;
    the store's URL."""
    async with schema_url() as url:
        store = await _store(url)
        try:
            ids = []
            for key in KEYS:
                for scope in ("a", "b"):
                    claimed = await store.claim(_claim(scope, key))
                    ids.append(claimed.operation.id)
            yield store, ids, url
        finally:
            await store.close()


async def test_ranges_and_walk_give_the_same_exact_pages(
    filled: tuple[PostgresStore, list[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, ids, _ = filled
    expected = [f"{scope}/{key}" for key in KEYS if key.startswith("k-") for scope in ("a", "b")]
    assert await store.prefix_indexes.ready()
    by_ranges = await _pages(store, "k-")
    assert [item for page in by_ranges for item in page] == expected
    assert [item for page in await _pages(store, "k_%") for item in page] == ["a/k_%", "b/k_%"]
    assert await _pages(store, "k-é") == [["a/k-é", "b/k-é"]]
    assert await _pages(store, "K-") == [["a/K-3", "b/K-3"]]
    assert await _pages(store, ids[3]) == [["b/k-2"]]

    monkeypatch.setattr(postgres_module, "PREFIX_WALK_FROM", 2)
    assert await _pages(store, "k-") == by_ranges


async def test_the_walk_serves_until_the_indexes_are_valid(
    filled: tuple[PostgresStore, list[str], str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An index left invalid (a concurrent build that stopped half-way, set here by hand)
    is not read: the search walks while another replica holds the build lock, and the
    build that follows replaces the index."""
    store, _, url = filled
    expected = await _pages(store, "k-")
    monkeypatch.setattr(postgres_prefix, "IN_LINE_BELOW", 0)  # a big table: in the background
    monkeypatch.setattr(postgres_prefix, "RETRY", 0.05)
    other_replica = await asyncpg.connect(url)
    fresh = PostgresStore(url, pool_size=2)
    try:
        await other_replica.execute(
            "UPDATE pg_index SET indisvalid = false "
            "WHERE indexrelid = to_regclass('operation_keys_key_prefix')"
        )
        await other_replica.execute(
            f"SELECT pg_advisory_lock({postgres_prefix.LOCK_OF_SCHEMA})", postgres_prefix.BUILD_LOCK
        )
        await fresh.open()
        assert not await fresh.prefix_indexes.ready()
        assert await _pages(fresh, "k-") == expected
        await other_replica.execute(
            f"SELECT pg_advisory_unlock({postgres_prefix.LOCK_OF_SCHEMA})",
            postgres_prefix.BUILD_LOCK,
        )
        await fresh.prefix_indexes.wait_built()
        assert await fresh.prefix_indexes.ready()
        assert await _pages(fresh, "k-") == expected
        valid = await other_replica.fetchval(
            "SELECT indisvalid FROM pg_index "
            "WHERE indexrelid = to_regclass('operation_keys_key_prefix')"
        )
        assert valid is True
    finally:
        await fresh.close()
        await other_replica.close()
