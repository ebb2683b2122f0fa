"""One gateway replica in the simulated world: an engine with its own clock, store and upstream.

Built exactly as `gateway.web.app` builds one, through the constructors' seams
(store, forwarder, keeper, prober, clock, and one `GraceClock` shared by the
engine and the keeper), so the engine under test is the production engine.
Its own loops run on simulated time, as tasks of the replica: the store-clock
witness loop always, the lease keeper's loop when the seed says so
(`Scenario.keeper_loop`; besides, keeper rounds are simulator actions). Every
engine call is a task the simulator starts, watches and, when the replica
crashes, cancels.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any

from gateway.config import QuotaSettings
from gateway.engine.engine import IdempotencyEngine
from gateway.engine.errors import StoreUnavailable
from gateway.engine.forwarded_key import ForwardedKeys
from gateway.engine.graces import WITNESS_INTERVAL, GraceClock
from gateway.engine.leases import LeaseKeeper
from gateway.engine.probes import Prober
from gateway.engine.quotas import ScopeQuotas
from gateway.upstream.spool import Spooler
from tests.simulation.clock import ReplicaClock, StoreClock
from tests.simulation.context import CALL, CallContext
from tests.simulation.faults import FaultyStore
from tests.simulation.upstream import ReplicaUpstream

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings, RouteSettings
    from gateway.engine.clock import Clock
    from tests.simulation.clock import WorldClock
    from tests.simulation.memory_store import MemoryStore
    from tests.simulation.upstream import ScriptedUpstream

__all__ = ["GraceFactory", "Replica"]

GraceFactory = Callable[["Clock"], GraceClock]
"""Makes a replica's `GraceClock` from its clock (a test-only seam for a broken one)."""


class Replica:
    """A gateway process: alive until `crash()`, paused while its clock is."""

    def __init__(
        self,
        name: str,
        *,
        generation: int,
        world: WorldClock,
        store: MemoryStore,
        upstream: ScriptedUpstream,
        settings: IdempotencySettings,
        route: RouteSettings,
        skew: float,
        graces: GraceFactory = GraceClock,
    ) -> None:
        self.name = name
        self.owner = f"gw-{name}-{generation}"
        self._world = world
        self.witnessed_at = float("-inf")
        self.clock = ReplicaClock(world, skew=skew)
        store_clock = store.db.clock if isinstance(store.db.clock, StoreClock) else None
        self.store = FaultyStore(store, replica=name, clock=self.clock, store_clock=store_clock)
        assert route.probe is not None
        self.upstream = ReplicaUpstream(
            upstream, replica=name, clock=self.clock, probe_path=route.probe.path
        )
        self.graces = graces(self.clock)
        self.keeper = LeaseKeeper(
            self.store,
            owner=self.owner,
            lease_seconds=settings.lease,
            tombstone_seconds=settings.tombstone_retention,
            clock=self.clock,
            graces=self.graces,
        )
        self.keeper_interval = settings.lease / 3
        self.prober = Prober(self.upstream, clock=self.clock)
        self.engine = IdempotencyEngine(
            store=self.store,
            forwarder=self.upstream,
            keeper=self.keeper,
            prober=self.prober,
            forwarded_keys=ForwardedKeys(b"k" * 32),
            quotas=ScopeQuotas(QuotaSettings()),
            settings=settings,
            routes=(route,),
            clock=self.clock,
            graces=self.graces,
            # Answers too large to keep are spooled on the loop: no thread decides an order.
            spooler=Spooler(total=1 << 30, threads=False),
        )
        # As a gateway does when it starts (`start_witness`): its first reading of the store's
        # clock, from which its graces may count, checked against what the others read.
        started = self.clock.monotonic()
        self.engine.graces.witness(store.db.clock(), before=started, after=started)
        self.engine.graces.compare_with(store.db.witnesses.values())
        self.alive = True
        self.tasks: list[asyncio.Task[Any]] = []

    async def keep_witnessing(self) -> None:
        """The store-clock witness loop every gateway runs (`start_witness`'s): a reading
        every `WITNESS_INTERVAL` seconds of simulated time (the event loop's clock is
        world time), besides the readings its decisions take, written for the processes
        that start later; each process is its own host (no trail is adopted: their
        monotonic clocks differ). A paused process takes none; a crash cancels it with
        the replica's other tasks. `witnessed_at` says when the last one was taken."""
        while True:
            await asyncio.sleep(WITNESS_INTERVAL)
            before = self.graces.monotonic()
            try:
                store_now = await self.store.now()
                self.graces.witness(store_now, before=before, after=self.graces.monotonic())
                self.witnessed_at = self._world.now
                if self.graces.rejoining:
                    self.graces.compare_with((await self.store.read_clock_witnesses()).values())
                record = self.graces.record()
                if record is not None:
                    await self.store.write_clock_witness(self.owner, record)
            except StoreUnavailable:
                continue  # reported by the requests that meet the outage

    async def keep_leases(self) -> None:
        """The lease keeper's own loop, as `LeaseKeeper.start` runs it: a round every third
        of a lease of simulated time, besides the rounds the simulator starts. A paused
        process renews nothing (its store calls wait), so its leases lapse."""
        interval = max(self.keeper_interval, 0.05)
        while True:
            await asyncio.sleep(interval)
            await self.keeper.upkeep()

    def start(self, label: str, work: Callable[[], Coroutine[Any, Any, Any]]) -> asyncio.Task[Any]:
        """Run one engine call as its own task, with its own `CallContext`.

        `work` makes the coroutine once the replica may run it (not paused), so
        a task cancelled before it began leaves no coroutine un-awaited.
        """
        context = CallContext(label=label, replica=self.name)

        async def run() -> Any:
            CALL.set(context)
            await self.clock.resumed()  # a paused process takes up nothing new
            return await work()

        task = asyncio.create_task(run(), name=f"{self.name}:{label}")
        self.tasks.append(task)
        return task

    def crash(self) -> None:
        """SIGKILL: every task is cancelled, the store link is gone for good."""
        self.alive = False
        self.store.kill()
        self.clock.resume()  # a dead process is not paused; its tasks must unwind
        for task in self.tasks:
            task.cancel()

    def reap(self) -> None:
        self.tasks = [task for task in self.tasks if not task.done()]

    def __repr__(self) -> str:
        return f"Replica({self.name}, {self.owner}, {self.clock!r}, alive={self.alive})"
