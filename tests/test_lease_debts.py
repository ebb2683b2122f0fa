"""The writes a gateway owes the store after an outage (issue: "never twice, proven", defect 10).

When a claim's commit fails, the keeper remembers to release that claim if it
landed after all: it was surely never sent. The suspicion was that the debt
could be paid against the wrong attempt: a later claim of the same key,
granted, sent, and let go while its own outcome write was owed. These tests
drive the real engine on a real SQLite store and a real upstream; the store
is wrapped (through the constructor, as production wires it) to fail one
commit and to hold the keeper's read at the worst moment.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from harness import settings_for
from upstream import CountingUpstream

from gateway.engine.engine import IdempotencyEngine
from gateway.engine.errors import GatewayError, InProgress, StoreUnavailable
from gateway.engine.exchange import ProxyRequest
from gateway.engine.forwarded_key import ForwardedKeys
from gateway.engine.leases import LeaseKeeper
from gateway.engine.models import State
from gateway.engine.probes import Prober
from gateway.engine.quotas import ScopeQuotas
from gateway.store.sqlite import SqliteStore
from gateway.upstream.forwarder import Forwarder


class FlakyStore:
    """A real store that fails the next `claim` or `complete` (the commit is lost), and
    can hold `get` before it reads until the test lets it go."""

    def __init__(self, inner: SqliteStore) -> None:
        self._inner = inner
        self.fail_next: set[str] = set()
        self.hold_reads: asyncio.Event | None = None
        self.read_waiting = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _maybe_fail(self, verb: str) -> None:
        if verb in self.fail_next:
            self.fail_next.discard(verb)
            raise StoreUnavailable(f"the {verb} commit was lost (test)")

    async def claim(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("claim")
        return await self._inner.claim(*args, **kwargs)

    async def complete(self, *args: Any, **kwargs: Any) -> Any:
        self._maybe_fail("complete")
        return await self._inner.complete(*args, **kwargs)

    async def get(self, scope: str, key: str) -> Any:
        if self.hold_reads is not None:
            self.read_waiting.set()
            await self.hold_reads.wait()
        return await self._inner.get(scope, key)


@dataclass
class World:
    store: FlakyStore
    keeper: LeaseKeeper
    engine: IdempotencyEngine
    request: ProxyRequest


@pytest_asyncio.fixture
async def world(tmp_path: Path, upstream: CountingUpstream) -> AsyncIterator[World]:
    """An engine as `create_app` wires one (no background keeper loop: the test runs it)."""
    settings = settings_for(tmp_path, upstream.url)
    route = settings.routes[0]
    inner = SqliteStore(path=tmp_path / "gateway.db")
    await inner.open()
    store = FlakyStore(inner)
    forwarder = Forwarder(settings.routes)
    await forwarder.start()
    keeper = LeaseKeeper(
        store,  # type: ignore[arg-type]
        owner="gw-test",
        lease_seconds=30.0,
        tombstone_seconds=settings.idempotency.tombstone_retention,
    )
    engine = IdempotencyEngine(
        store=store,  # type: ignore[arg-type]
        forwarder=forwarder,
        keeper=keeper,
        prober=Prober(forwarder),
        forwarded_keys=ForwardedKeys(b"k" * 32),
        quotas=ScopeQuotas(settings.quotas),
        settings=settings.idempotency,
        routes=settings.routes,
    )
    request = ProxyRequest(
        route=route,
        upstream_url=f"{upstream.url}/v1/issues",
        method="POST",
        path="/tickets/v1/issues",
        headers=(("Content-Type", "application/json"),),
        body=b'{"amount": 42}',
        scope="scope-a",
        key="pay-42",
        fingerprint="sha256:test",
    )
    try:
        yield World(store, keeper, engine, request)
    finally:
        await forwarder.close()
        await inner.close()


async def test_a_failed_claims_debt_never_releases_a_later_sent_attempt(
    world: World, upstream: CountingUpstream
) -> None:
    """Claim 1's commit is lost; while the keeper is about to pay that debt, claim 2 is
    granted, sent, and its receipt write fails. The keeper must not release attempt 2 as
    "never sent": the retry would be a second effect."""
    world.store.fail_next.add("claim")
    with pytest.raises(StoreUnavailable):
        await world.engine.execute(world.request)
    assert upstream.count == 0

    world.store.hold_reads = asyncio.Event()
    paying = asyncio.create_task(world.keeper.settle_debts())
    await world.store.read_waiting.wait()  # the keeper is about to read the key

    world.store.fail_next.add("complete")
    reply = await world.engine.execute(world.request)  # claim 2: granted and sent
    assert reply.status == 201
    assert reply.state is State.IN_FLIGHT  # its receipt is owed, not written
    assert upstream.count == 1

    world.store.hold_reads.set()
    world.store.hold_reads = None
    await paying
    operation = await world.store.get("scope-a", "pay-42")
    assert operation is not None
    assert operation.state is State.IN_FLIGHT, operation  # never "released"

    with pytest.raises(GatewayError) as refused:  # the retry meets attempt 2, unsent again
        await world.engine.execute(world.request)
    assert isinstance(refused.value, InProgress)

    await world.keeper.settle_debts()  # the owed receipt lands
    replay = await world.engine.execute(world.request)
    assert (replay.status, replay.replayed) == (201, True)
    assert upstream.count == 1


async def test_a_failed_claim_that_landed_is_released_once_the_store_is_back(
    world: World, upstream: CountingUpstream
) -> None:
    """The debt itself still works: a claim whose commit outcome was lost but which did
    land is released (it was never sent), so the retry is sent once, not refused."""

    async def landed_then_lost(*args: Any, **kwargs: Any) -> Any:
        await SqliteStore.claim(world.store._inner, *args, **kwargs)
        raise StoreUnavailable("the commit's acknowledgement was lost (test)")

    world.store.claim = landed_then_lost  # type: ignore[method-assign]
    with pytest.raises(StoreUnavailable):
        await world.engine.execute(world.request)
    del world.store.claim
    landed = await world.store.get("scope-a", "pay-42")
    assert landed is not None
    assert landed.state is State.IN_FLIGHT

    await world.keeper.settle_debts()
    freed = await world.store.get("scope-a", "pay-42")
    assert freed is not None
    assert freed.state is State.RELEASED
    reply = await world.engine.execute(world.request)
    assert reply.status == 201
    assert upstream.count == 1


def test_an_attempt_that_ends_late_keeps_the_newer_attempts_lease(world: World) -> None:
    """Attempt 1 of a key ends (its late answer was refused) after the same process began
    attempt 2 (same operation, newer token): only attempt 1's hold and debt go; attempt 2
    is still held, so the keeper never takes it for an unsent orphan (found by the
    simulation: the newer hold was dropped, and a later failed claim's debt released
    attempt 2 after it was sent)."""
    keeper = world.keeper
    keeper.hold("op_1", 1, scope="s", key="k", asked_at=0.0)
    keeper.hold("op_1", 3, scope="s", key="k", asked_at=1.0)  # a newer attempt of the key

    async def owed() -> None:
        return None

    keeper.owe("op_1", 1, owed)
    keeper.owe("op_1", 3, owed)
    keeper.drop("op_1", 1)
    assert keeper.holds("op_1")
    assert keeper.debts == 2  # attempt 1's debt did not replace attempt 3's
    keeper.drop("op_1", 3)
    assert not keeper.holds("op_1")
