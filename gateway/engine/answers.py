"""Answering a key that is already taken: from its record, brought up to date or waited on.

A retry, a duplicate in flight and a lookup all meet a record this caller
does not hold. Before it is answered the record is brought up to date (a
lapsed lease turns `unknown`, a due probe may settle it); with `Prefer:
wait=N` the caller waits for the outcome, woken by the outcome write itself
or by another replica's notification. The answer is then judged from the
record alone (replay, 409 or 422), the same on every replica.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from gateway.engine.errors import (
    InProgress,
    KeyMismatch,
    KeyMismatchUnsettled,
    OutcomeUnknown,
    ReceiptExpired,
    ReceiptNotRetained,
    StoreUnavailable,
)
from gateway.engine.exchange import ProxyRequest, Reply
from gateway.engine.models import RECEIPT_SOURCES, Operation, State

if TYPE_CHECKING:
    from gateway.engine.clock import Clock
    from gateway.engine.exchange import LifecycleObserver, StoreTimer
    from gateway.engine.leases import LeaseKeeper
    from gateway.engine.settle import Settler
    from gateway.store.base import Store

CROSS_PROCESS_POLL = (0.05, 1.0)
"""Backoff bounds when waiting on a key another process holds (no in-process signal)."""


class KeyRecords:
    """Reads a taken key's record up to date, and waits for its outcome."""

    def __init__(
        self,
        *,
        store: Store,
        keeper: LeaseKeeper,
        settler: Settler,
        observer: LifecycleObserver,
        timed: StoreTimer,
        clock: Clock,
    ) -> None:
        self._store = store
        self._keeper = keeper
        self._settler = settler
        self._observer = observer
        self._timed = timed
        self._clock = clock
        self._settled: dict[str, asyncio.Event] = {}
        self.cross_process_signals = False
        """True once the store delivers other replicas' outcomes (PostgreSQL LISTEN)."""

    async def lookup(self, scope: str, key: str) -> Operation | None:
        """The operation for a key, brought up to date (expired lease, due probe) on the way."""
        operation = await self._timed("get", self._store.get(scope, key))
        return None if operation is None else await self.refresh(operation)

    async def refresh(self, operation: Operation) -> Operation | None:
        """The record brought up to date (expired lease, due probe); `None` once it is
        forgotten (past its tombstone): nothing may be answered from a record the key
        no longer has."""
        if operation.lease_expired() and not self._keeper.holds(operation.id):
            expired = await self._store.expire_orphans(owner=None)
            self._observer.lease_expired(expired)
            current = await self._store.get_by_id(operation.id)
            if current is None:
                return None
            operation = current
        if operation.state is State.UNKNOWN:
            return await self._settler.probe(operation)
        return operation

    async def wait(self, operation: Operation, seconds: float) -> Operation | None:
        """Prefer: wait=N: the outcome once known, or the in-flight record when N runs out.

        Woken by the outcome write itself (in this process, or another replica's
        through the store's notifications); the store is re-read at least every
        `CROSS_PROCESS_POLL[1]` seconds in case a notification was missed.
        """
        deadline = self._clock.monotonic() + seconds
        poll = CROSS_PROCESS_POLL[0]
        event: asyncio.Event | None = None
        watched = False
        while operation.state is State.IN_FLIGHT:
            remaining = deadline - self._clock.monotonic()
            if remaining <= 0:
                break
            held_here = self._keeper.holds(operation.id)
            if held_here or self.cross_process_signals:
                # Registered before the store is asked or re-read, and kept until
                # it fires: a signal between a re-read and the wait is not lost.
                if event is None:
                    event = self._settled.setdefault(operation.id, asyncio.Event())
                if not held_here and not watched:
                    # Another process holds it: ask its outcome write to signal us,
                    # then re-read at once (the outcome may predate the watch).
                    watched = True
                    with contextlib.suppress(StoreUnavailable):  # then the wait polls
                        await self._timed("watch", self._store.watch(operation.id))
                elif not event.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(event.wait(), min(remaining, CROSS_PROCESS_POLL[1]))
                if event.is_set():
                    event = None  # used up: the next turn registers a fresh one
            else:  # held by another process and no signal reaches us: poll with backoff
                await asyncio.sleep(min(poll, remaining))
                poll = min(poll * 2, CROSS_PROCESS_POLL[1])
            current = await self._store.get_by_id(operation.id)
            refreshed = None if current is None else await self.refresh(current)
            if refreshed is None:  # forgotten meanwhile
                self._settled.pop(operation.id, None)
                return None
            operation = refreshed
        if not self._keeper.holds(operation.id):
            self._settled.pop(operation.id, None)
        return operation

    def notify(self, operation_id: str) -> None:
        """An outcome was recorded (possibly by another replica): wake its waiters."""
        event = self._settled.pop(operation_id, None)
        if event is not None:
            event.set()


def key_mismatch(key: str, state: str, operation_id: str) -> KeyMismatch:
    """The 422 for a key already bound to another request.

    On a settled operation the request is wrong and a changed one is a new
    effect (`key-mismatch`, `fix-request`). While the key's first call is
    `in_flight` or `unknown` it may have happened, and a new key for the
    "fixed" request could be its second effect: `key-mismatch-unsettled`,
    `reconcile`.
    """
    if state in (State.IN_FLIGHT.value, State.UNKNOWN.value):
        return KeyMismatchUnsettled(
            f"this key was first used with a different request (method, path, query or "
            f"body), and that first call is {state}: it may have taken effect. Settle it "
            "before sending anything else for this effect",
            key=key,
            state=state,
            operation_id=operation_id,
        )
    return KeyMismatch(
        "this key was first used with a different request (method, path, query or body)",
        key=key,
        state=state,
        operation_id=operation_id,
    )


def answer_existing(operation: Operation, request: ProxyRequest) -> Reply:
    """Answer a request whose key is bound to an operation this caller does not hold.

    Judged from the record alone, its times against the store's clock
    (`observed_at`), so every replica answers a retry the same way.
    """
    key = operation.key
    state, op_id = operation.state.value, operation.id
    if not request.same_request(operation.fingerprint):
        raise key_mismatch(key, state, op_id)
    if operation.state is State.COMPLETED:
        if operation.receipt_available():
            assert operation.response is not None
            by = operation.resolution.by if operation.resolution else "upstream"
            return Reply.replay(operation.response, key, RECEIPT_SOURCES.get(by, "upstream"))
        if not operation.body_retained:
            resolution = operation.resolution
            if any(item.source == "redaction" for item in operation.evidence):
                detail = "the stored response was erased by an operator; the key stays used"
            elif resolution is None or resolution.by == "upstream":
                detail = (
                    "the first response was too large to keep (over max_stored_response): "
                    "the upstream's answer arrived whole and was relayed once, to the first "
                    "caller"
                )
            else:
                detail = (
                    f"the operation was settled as applied by {resolution.by} without a response"
                )
            raise ReceiptNotRetained(detail, key=key, state=state, operation_id=op_id)
        raise ReceiptExpired(
            "the stored response has expired; the key stays used and is not forwarded again",
            key=key,
            state=state,
            operation_id=op_id,
        )
    if operation.state is State.UNKNOWN:
        raise OutcomeUnknown(
            "the first attempt may or may not have taken effect; resolve the operation",
            key=key,
            state=state,
            operation_id=op_id,
        )
    raise InProgress(
        "a request with this key is still in flight",
        key=key,
        state=state,
        operation_id=op_id,
        retry_after=1,
    )
