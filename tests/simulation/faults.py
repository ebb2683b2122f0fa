"""A replica's connection to the store, with the failures a real database has.

`FaultyStore` implements the `Store` protocol around a `MemoryStore` and is
what a replica's engine, keeper and prober are given (through their
constructors: nothing is monkeypatched). The simulator scripts it:

- `arm("lost", verb)`: the next matching call does not apply and raises
  `StoreUnavailable` (the commit was lost with the connection);
- `arm("ambiguous", verb)`: the next matching call applies, then raises
  `StoreUnavailable` (the commit landed, its acknowledgement did not);
- `down = True` / `False`: every call raises while the store is unreachable;
- `kill()`: every call raises forever (the replica crashed);
- `hold`: a hook the simulator sets to park a call before it applies
  (latency), so other replicas' calls overtake it;
- a step of the store's clock waiting for one transaction (`StoreClock.step_during`)
  is on exactly while the matching call applies.

A paused replica issues nothing: every call first waits for its clock to be
resumed. Calls only ever wait *before* they apply, never between applying
and returning, so an engine's view of a write it made is never stale by the
time it sees it (the answer-state invariant relies on that).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, TypeVar

from gateway.engine.errors import StoreUnavailable
from gateway.engine.models import NewAttempt, ReplayableReceipt, Similar
from tests.simulation.context import CALL

if TYPE_CHECKING:
    from gateway.engine.calibration import Calibration, CalibrationChange
    from gateway.engine.history import NewEvent
    from gateway.engine.models import (
        ClaimRequest,
        ClaimResult,
        Evidence,
        Operation,
        Resolution,
        State,
        StoredResponse,
    )
    from gateway.store.base import HistoryPage, OperationFilter, Page, Renewal, SweepReport
    from tests.simulation.clock import ReplicaClock, StoreClock
    from tests.simulation.memory_store import MemoryStore

__all__ = ["WRITES", "ArmedFault", "FaultKind", "FaultyStore"]

T = TypeVar("T")
FaultKind = Literal["lost", "ambiguous"]
Hold = Callable[[str, str], "asyncio.Future[None] | None"]

WRITES = (
    "claim",
    "complete",
    "complete_late",
    "mark_unknown",
    "release",
    "renew",
    "add_evidence",
    "resolve",
    "expire_orphans",
    "sweep",
    "redact",
    "save_calibration",
)
"""Verbs that change the database: the ones an ambiguous commit can hit."""


@dataclass(slots=True)
class ArmedFault:
    kind: FaultKind
    verb: str | None
    """None: the next call of any verb (a write, for `ambiguous`)."""

    def matches(self, verb: str) -> bool:
        if self.verb is not None:
            return self.verb == verb
        return self.kind == "lost" or verb in WRITES


class FaultyStore:
    """`Store` for one replica: the shared memory store behind scripted faults."""

    def __init__(
        self,
        inner: MemoryStore,
        *,
        replica: str,
        clock: ReplicaClock,
        store_clock: StoreClock | None = None,
    ) -> None:
        self._inner = inner
        self._replica = replica
        self._clock = clock
        self._store_clock = store_clock
        """The database's clock, when a step of it may wait for a transaction."""
        self.down = False
        self.dead = False
        self.armed: list[ArmedFault] = []
        self.hold: Hold | None = None
        self.fired: list[tuple[str, str]] = []
        """(kind, verb) of every fault that fired, for the run's summary."""

    def arm(self, kind: FaultKind, verb: str | None = None) -> None:
        self.armed.append(ArmedFault(kind, verb))

    def kill(self) -> None:
        self.dead = True
        self.armed.clear()

    def _refuse_if_unreachable(self, verb: str) -> None:
        if self.dead:
            self._noted(verb, None)
            raise StoreUnavailable(f"replica {self._replica} is dead")
        if self.down:
            self._noted(verb, None)
            raise StoreUnavailable(f"the store is unreachable from {self._replica}")

    def _noted(self, verb: str, kind: FaultKind | None) -> None:
        call = CALL.get()
        if call is not None:
            call.store_errors.append(verb)
            if kind == "ambiguous":
                call.ambiguous_commits.append(verb)
        if kind is not None:
            self.fired.append((kind, verb))

    def _take(self, verb: str) -> ArmedFault | None:
        for index, fault in enumerate(self.armed):
            if fault.matches(verb):
                return self.armed.pop(index)
        return None

    async def _call(self, verb: str, run: Callable[[], Awaitable[T]]) -> T:
        self._refuse_if_unreachable(verb)
        await self._clock.resumed()
        if self.hold is not None:
            parked = self.hold(self._replica, verb)
            if parked is not None:
                await parked
                await self._clock.resumed()
        self._refuse_if_unreachable(verb)
        fault = self._take(verb)
        if fault is not None and (fault.kind == "lost" or verb not in WRITES):
            # A read has no commit to lose or keep: it just fails.
            self._noted(verb, "lost")
            raise StoreUnavailable(f"{verb}: the connection was lost before the commit")
        steps = self._store_clock.during(verb) if self._store_clock is not None else nullcontext()
        with steps:  # one transaction: the memory store's verbs never await inside
            result = await run()
        if fault is not None:
            self._noted(verb, "ambiguous")
            raise StoreUnavailable(f"{verb}: the connection was lost after the commit")
        return result

    # -- the Store protocol ------------------------------------------------------------

    async def open(self) -> None:
        await self._inner.open()  # at start-up, before any fault can be scripted

    async def close(self) -> None:
        await self._inner.close()

    async def subscribe(self, on_settled: Callable[[str], None]) -> bool:
        return False

    async def watch(self, operation_id: str) -> None:
        return None

    async def ping(self) -> None:
        await self._call("ping", self._inner.ping)

    async def now(self) -> float:
        return await self._call("now", self._inner.now)

    async def scope_secret(self) -> bytes:
        return await self._call("scope_secret", self._inner.scope_secret)

    async def read_clock_witnesses(self) -> dict[str, bytes]:
        return await self._call("witness", self._inner.read_clock_witnesses)

    async def write_clock_witness(self, host: str, witness: bytes) -> None:
        await self._call("witness", lambda: self._inner.write_clock_witness(host, witness))

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        result = await self._call("claim", lambda: self._inner.claim(request))
        call = CALL.get()
        if call is not None and isinstance(result, NewAttempt):
            call.claimed = result.operation.id
        elif call is not None and isinstance(result, Similar):
            call.refused_by = result.twin.id
        return result

    async def complete(
        self,
        operation_id: str,
        token: int,
        response: StoredResponse,
        *,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        resolution: Resolution,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._call(
            "complete",
            lambda: self._inner.complete(
                operation_id,
                token,
                response,
                body_retained=body_retained,
                retention_seconds=retention_seconds,
                tombstone_seconds=tombstone_seconds,
                resolution=resolution,
                events=events,
            ),
        )

    async def complete_late(
        self,
        operation_id: str,
        attempt: int,
        response: StoredResponse,
        *,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._call(
            "complete_late",
            lambda: self._inner.complete_late(
                operation_id,
                attempt,
                response,
                body_retained=body_retained,
                retention_seconds=retention_seconds,
                tombstone_seconds=tombstone_seconds,
                events=events,
            ),
        )

    async def mark_unknown(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._call(
            "mark_unknown",
            lambda: self._inner.mark_unknown(operation_id, token, evidence, events),
        )

    async def release(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        *,
        tombstone_seconds: float,
        retention_seconds: float = 0.0,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._call(
            "release",
            lambda: self._inner.release(
                operation_id,
                token,
                evidence,
                tombstone_seconds=tombstone_seconds,
                retention_seconds=retention_seconds,
                events=events,
            ),
        )

    async def renew(self, leases: dict[str, int], *, owner: str, lease_seconds: float) -> Renewal:
        return await self._call(
            "renew", lambda: self._inner.renew(leases, owner=owner, lease_seconds=lease_seconds)
        )

    async def add_evidence(
        self, operation_id: str, evidence: Evidence, events: Sequence[NewEvent] = ()
    ) -> None:
        await self._call(
            "add_evidence", lambda: self._inner.add_evidence(operation_id, evidence, events)
        )

    def history_seal(self) -> None:
        return None

    async def history(
        self, operation_id: str, *, after: int = 0, limit: int | None = None
    ) -> HistoryPage:
        return await self._call(
            "history", lambda: self._inner.history(operation_id, after=after, limit=limit)
        )

    async def get(self, scope: str, key: str) -> Operation | None:
        return await self._call("get", lambda: self._inner.get(scope, key))

    async def get_by_id(self, operation_id: str) -> Operation | None:
        return await self._call("get_by_id", lambda: self._inner.get_by_id(operation_id))

    def peek_receipt(self, scope: str, key: str) -> ReplayableReceipt | None:
        # Synchronous: an unreachable or paused store cannot answer without waiting.
        if self.dead or self.down or self._clock.paused:
            return None
        return self._inner.peek_receipt(scope, key)

    async def resolve(
        self,
        operation_id: str,
        *,
        token: int,
        expected_version: int | None,
        state: State,
        response: StoredResponse | None,
        resolution: Resolution,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
        calibrated: tuple[str, str] | None = None,
    ) -> Operation | None:
        return await self._call(
            "resolve",
            lambda: self._inner.resolve(
                operation_id,
                token=token,
                expected_version=expected_version,
                state=state,
                response=response,
                resolution=resolution,
                retention_seconds=retention_seconds,
                tombstone_seconds=tombstone_seconds,
                events=events,
                calibrated=calibrated,
            ),
        )

    async def calibration_samples(
        self,
        *,
        route: str,
        kind: str,
        scope: str | None,
        completed_since: float | None,
        limit: int,
    ) -> tuple[Operation, ...]:
        return await self._call(
            "calibration_samples",
            lambda: self._inner.calibration_samples(
                route=route,
                kind=kind,
                scope=scope,
                completed_since=completed_since,
                limit=limit,
            ),
        )

    async def calibrations(self, route: str) -> tuple[Calibration, ...]:
        return await self._call("calibrations", lambda: self._inner.calibrations(route))

    async def save_calibration(self, change: CalibrationChange) -> Calibration | None:
        return await self._call("save_calibration", lambda: self._inner.save_calibration(change))

    async def route_kinds(self, route: str, *, limit: int) -> tuple[str, ...]:
        return await self._call("route_kinds", lambda: self._inner.route_kinds(route, limit=limit))

    async def latest_of_request(
        self, *, scope: str, route: str, fingerprints: tuple[str, ...]
    ) -> Operation | None:
        return await self._call(
            "latest_of_request",
            lambda: self._inner.latest_of_request(
                scope=scope, route=route, fingerprints=fingerprints
            ),
        )

    async def list_operations(
        self, where: OperationFilter, *, limit: int, cursor: str | None
    ) -> Page:
        return await self._call(
            "list_operations",
            lambda: self._inner.list_operations(where, limit=limit, cursor=cursor),
        )

    async def expire_orphans(self, *, owner: str | None) -> int:
        return await self._call("expire_orphans", lambda: self._inner.expire_orphans(owner=owner))

    async def sweep(self, *, batch: int) -> SweepReport:
        return await self._call("sweep", lambda: self._inner.sweep(batch=batch))

    async def count_by_state(self) -> dict[State, int]:
        return await self._call("count_by_state", self._inner.count_by_state)

    async def count_for_scope(self, scope: str) -> int:
        return await self._call("count_for_scope", lambda: self._inner.count_for_scope(scope))

    async def unbind_past(self, scope: str, key: str, limit: int) -> bool:
        return await self._call("unbind_past", lambda: self._inner.unbind_past(scope, key, limit))

    async def redact(
        self,
        operation_id: str,
        evidence: Evidence,
        *,
        expected_version: int | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        return await self._call(
            "redact",
            lambda: self._inner.redact(
                operation_id, evidence, expected_version=expected_version, events=events
            ),
        )
