"""Outcome writes: an attempt's result recorded under its fencing token, or owed.

The engine decides which outcome an attempt has (an answer, a refusal, a
send that may have landed); this module records it so that only the attempt
still holding the key can: every write is fenced by the attempt's token, a
refused (stale) write leaves evidence instead, and a write the store cannot
take now becomes a debt the lease keeper pays later. The caller is told the
record's state as it stands after the write, not the state it meant to set.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from gateway.engine.errors import StoreUnavailable, UpstreamError, UpstreamTimeout
from gateway.engine.history import NewEvent
from gateway.engine.lifecycle_events import (
    UnknownKind,
    answered_event,
    released_event,
    sent_event,
    unknown_event,
)
from gateway.engine.models import Evidence, Operation, Resolution, State, StoredResponse
from gateway.telemetry.tracer import NO_TRACER, Tracer

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings
    from gateway.engine.clock import Clock
    from gateway.engine.digests import Digests
    from gateway.engine.exchange import LifecycleObserver, ProxyRequest, StoreTimer
    from gateway.engine.leases import LeaseKeeper
    from gateway.store.base import Store

log = logging.getLogger("gateway.lifecycle")


class OutcomeWriter:
    """Writes `complete`, `release` and `mark_unknown`, fenced by the attempt's token."""

    def __init__(
        self,
        *,
        store: Store,
        keeper: LeaseKeeper,
        settings: IdempotencySettings,
        observer: LifecycleObserver,
        timed: StoreTimer,
        clock: Clock,
        forwarded_key: Callable[[ProxyRequest, Operation], str | None],
        tracer: Tracer = NO_TRACER,
        digests: Digests | None = None,
    ) -> None:
        self._forwarded_key = forwarded_key
        self._digests = digests
        self._store = store
        self._keeper = keeper
        self._settings = settings
        self._observer = observer
        self._timed = timed
        self._clock = clock
        self._tracer = tracer

    async def complete(
        self, request: ProxyRequest, operation: Operation, stored: StoredResponse, *, retained: bool
    ) -> State:
        events = (
            self._sent(request, operation),
            answered_event(stored.status, attempt=operation.attempts),
        )
        retention = request.retention or self._settings.retention
        tombstone = request.retention or self._settings.tombstone_retention

        async def write() -> Operation | None:
            return await self._store.complete(
                operation.id,
                operation.token,
                stored,
                body_retained=retained,
                retention_seconds=retention,
                tombstone_seconds=tombstone,
                resolution=Resolution(by="upstream", at=self._clock.time()),
                events=events,
            )

        async def late(current: Operation) -> Operation | None:
            """The answer still decides where it is the truth (`Store.complete_late`)."""
            if current.attempts != operation.attempts:
                return None
            return await self._store.complete_late(
                operation.id,
                operation.attempts,
                stored,
                body_retained=retained,
                retention_seconds=retention,
                tombstone_seconds=tombstone,
                events=events,
            )

        def evidence() -> Evidence:  # only a refused (stale) write needs it
            return Evidence(
                at=self._clock.time(),
                source="upstream",
                detail="the upstream answered after this attempt lost its token",
                status=stored.status,
                body_sha256=hashlib.sha256(stored.body).hexdigest() if retained else None,
            )

        # The effect happened and the caller gets its answer either way; if the
        # receipt could not be written yet, the keeper retries it.
        return await self._fenced_write(
            request, operation, "complete", write, evidence, events, late=late
        )

    async def release(
        self, request: ProxyRequest, operation: Operation, detail: str, *, status: int | None = None
    ) -> State:
        """The key may be sent again: nothing was sent, or the upstream refused it with
        `status` (then it was sent, and answered)."""
        evidence = Evidence(at=self._clock.time(), source="gateway", detail=detail, status=status)
        events: tuple[NewEvent, ...] = (released_event(detail, status=status),)
        if status is not None:
            events = (
                self._sent(request, operation),
                answered_event(status, attempt=operation.attempts),
                *events,
            )

        async def write() -> Operation | None:
            return await self._store.release(
                operation.id,
                operation.token,
                evidence,
                tombstone_seconds=request.retention or self._settings.tombstone_retention,
                retention_seconds=request.retention or self._settings.retention,
                events=events,
            )

        # Refused as stale, only what the attempt did stays (its send and the refusal it
        # got, if sent): the release was not this attempt's to make.
        return await self._fenced_write(
            request, operation, "release", write, lambda: evidence, events[:-1]
        )

    async def mark_unknown(
        self, request: ProxyRequest, operation: Operation, error: UpstreamError
    ) -> State:
        evidence = Evidence(at=self._clock.time(), source="gateway", detail=error.detail)

        kind: UnknownKind = "timed-out" if isinstance(error, UpstreamTimeout) else "connection-lost"
        events = (self._sent(request, operation), unknown_event(kind, error.detail))

        async def write() -> Operation | None:
            return await self._store.mark_unknown(
                operation.id, operation.token, evidence, events=events
            )

        self._observer.became_unknown(request.route.name, error.problem_type)
        log.warning(
            "outcome unknown",
            extra={"event": "unknown", "operation_id": operation.id, "key": request.key,
                   "route": request.route.name, "reason": error.problem_type},
        )  # fmt: skip
        return await self._fenced_write(
            request, operation, "mark_unknown", write, lambda: evidence, events
        )

    def _sent(self, request: ProxyRequest, operation: Operation) -> NewEvent:
        forwarded = self._forwarded_key(request, operation)
        digest = None if self._digests is None else self._digests.body(request.scope, request.body)
        return sent_event(
            operation.token, forwarded, attempt=operation.attempts, body_digest=digest
        )

    async def _fenced_write(
        self,
        request: ProxyRequest,
        operation: Operation,
        name: str,
        write: Callable[[], Awaitable[Operation | None]],
        evidence: Callable[[], Evidence],
        events: tuple[NewEvent, ...],
        *,
        late: Callable[[Operation], Awaitable[Operation | None]] | None = None,
    ) -> State:
        """Run an outcome write in the attempt's record span; return the record's state
        once it is done.

        That state, not the one the write meant to set, is what the caller is
        told: a stale token leaves evidence and the record as another writer
        left it, and the attempt's own events (its send, what it learned) stay
        in the history as evidence, so a stale attempt is never invisible. A
        late answer (`late`) still settles a record where it is the truth
        (`Store.complete_late`). A store outage leaves a debt the keeper pays
        later; the record is then `in_flight` while this attempt's lease surely
        stands, and past that nobody here can tell whether another replica found
        it expired: `unknown`, the answer that never invites a blind retry.
        """

        refused = False

        async def settle() -> Operation | None:
            nonlocal refused
            written = await self._timed(name, write())
            if written is not None:
                return written
            refused = True
            self._observer.stale_write(request.route.name)
            log.warning("stale %s refused for %s (token %d)", name, operation.id, operation.token)
            current = await self._store.get_by_id(operation.id)
            if late is not None and current is not None:
                return await self._late_answer(request, operation, current, late, evidence, events)
            await self._timed(
                "add_evidence", self._store.add_evidence(operation.id, evidence(), events)
            )
            return await self._store.get_by_id(operation.id)

        with self._tracer.record(request, operation, name) as span:
            try:
                recorded = await settle()
            except StoreUnavailable as exc:
                log.error(
                    "%s for %s not recorded yet: %s", name, operation.id, exc.internal or exc.detail
                )
                self._keeper.owe(operation.id, operation.token, settle)
                # A write refused as stale says someone else holds the record now: its state
                # is unknown to this process until it can read again.
                state = State.UNKNOWN if refused else self.own_state(operation)
            else:
                if recorded is None:  # forgotten meanwhile: the key may be bound anew
                    recorded = await self._store.get(request.scope, request.key)
                state = State.RELEASED if recorded is None else recorded.state
            span.state(state)
            return state

    async def _late_answer(
        self,
        request: ProxyRequest,
        operation: Operation,
        current: Operation,
        late: Callable[[Operation], Awaitable[Operation | None]],
        evidence: Callable[[], Evidence],
        events: tuple[NewEvent, ...],
    ) -> Operation | None:
        """An answer that arrived after its attempt lost its token. It completes a release
        it proves wrong (no newer attempt began) or fills an operator's `applied` that
        has no receipt; after a newer attempt it is evidence and a possible duplicate;
        against any other completed record, evidence. Each is said in the log and the
        metrics (`late_answers`)."""
        route = request.route.name
        settled = await late(current)
        if settled is not None:
            outcome = "completed_released" if current.state is State.RELEASED else "attached"
            self._observer.late_answer(route, outcome)
            log.error(
                "a late answer settled %s (%s): attempt %d was answered after it lost its "
                "token",
                operation.id,
                outcome,
                operation.attempts,
                extra={"event": "late_answer", "operation_id": operation.id, "key": request.key,
                       "route": route, "outcome": outcome},
            )  # fmt: skip
            return settled
        duplicate = current.attempts > operation.attempts
        outcome = "possible_duplicate" if duplicate else "evidence"
        self._observer.late_answer(route, outcome)
        if duplicate:
            log.error(
                "possible duplicate: attempt %d of %s was answered (the effect happened) after "
                "attempt %d began",
                operation.attempts,
                operation.id,
                current.attempts,
                extra={"event": "possible_duplicate", "operation_id": operation.id,
                       "key": request.key, "route": route},
            )  # fmt: skip
        await self._timed(
            "add_evidence", self._store.add_evidence(operation.id, evidence(), events)
        )
        return await self._store.get_by_id(operation.id)

    def own_state(self, operation: Operation) -> State:
        """The record's state while this process holds the attempt and has not written
        its outcome: `in_flight` while the lease surely stands; past that another
        replica may have found it expired, and `unknown` never invites a blind retry."""
        return State.IN_FLIGHT if self._keeper.surely_holds(operation.id) else State.UNKNOWN
