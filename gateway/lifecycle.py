"""The idempotency state machine: the one place that decides what happens to a key.

    (new key) -> in_flight --answered--> completed
                    |  \\--provably not sent--> released --(next attempt)--> in_flight
                    \\--sent, no complete answer / lease expired--> unknown
    unknown --resolve applied / probe applied--> completed
    unknown --resolve not_applied / probe not applied (late enough)--> released

For a protected request this module claims the key (durably, before the first
byte goes upstream), checks its lease right before sending, sends once, and
records the outcome under its fencing token. A key that is already taken is
answered from its record: replay, wait, 409 or 422. Unknown outcomes are
settled here too, by a resolution or by a probe's verdict. HTTP handlers
translate to and from these calls; stores persist what is decided here.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import signal
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Literal, TypeVar

from gateway.clock import SYSTEM_CLOCK, Clock
from gateway.errors import (
    InProgress,
    KeyMismatch,
    LeaseLost,
    NotResolvable,
    OutcomeUnknown,
    PreconditionFailed,
    ReceiptExpired,
    ReceiptNotRetained,
    StoreUnavailable,
    UpstreamError,
    UpstreamUnreachable,
)
from gateway.exchange import (
    LifecycleObserver,
    NoObserver,
    ProxyRequest,
    Reply,
    UpstreamAnswer,
    receipt_of,
)
from gateway.headers import IDEMPOTENCY_KEY, Pairs
from gateway.models import (
    ClaimRequest,
    Evidence,
    Existing,
    Operation,
    Resolution,
    ResolvedBy,
    State,
    StoredResponse,
)

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings, RouteSettings
    from gateway.exchange import Upstream
    from gateway.forwarded_key import ForwardedKeys
    from gateway.leases import LeaseKeeper
    from gateway.probes import Prober
    from gateway.quotas import ScopeQuotas
    from gateway.store.base import Store

T = TypeVar("T")
log = logging.getLogger("gateway.lifecycle")

LEASE_SAFETY_MARGIN = 0.2
"""Fraction of the lease kept in reserve: a holder past 80% of it does not send."""

CROSS_PROCESS_POLL = (0.05, 1.0)
"""Backoff bounds when waiting on a key another process holds (no in-process signal)."""

Outcome = Literal["applied", "not_applied"]


class IdempotencyEngine:
    """Runs protected requests through claim, send and outcome, and settles unknowns.

    >>> # engine = IdempotencyEngine(store=store, forwarder=forwarder, keeper=keeper,
    >>> #     prober=prober, settings=settings.idempotency, routes=settings.routes)
    >>> # reply = await engine.execute(proxy_request)
    """

    def __init__(
        self,
        *,
        store: Store,
        forwarder: Upstream,
        keeper: LeaseKeeper,
        prober: Prober,
        forwarded_keys: ForwardedKeys,
        quotas: ScopeQuotas,
        settings: IdempotencySettings,
        routes: tuple[RouteSettings, ...],
        observer: LifecycleObserver | None = None,
        fault: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
    ) -> None:
        self._store = store
        self._clock = clock
        self._forwarder = forwarder
        self._keeper = keeper
        self._prober = prober
        self._forwarded_keys = forwarded_keys
        self._quotas = quotas
        self._settings = settings
        self._routes = {route.name: route for route in routes}
        self._observer: LifecycleObserver = observer or NoObserver()
        self._fault = fault
        self._settled: dict[str, asyncio.Event] = {}
        self.cross_process_signals = False
        """True once the store delivers other replicas' outcomes (PostgreSQL LISTEN)."""

    # -- the request path ------------------------------------------------------

    async def execute(self, request: ProxyRequest) -> Reply:
        """Answer a protected request; raises a `GatewayError` for every refusal.

        The route's concurrency gate is held from the claim to the outcome of an
        attempt, not while a retry waits (`Prefer: wait`) or a probe runs: a
        waiting duplicate does not take an upstream slot.
        """
        with self._quotas.in_flight(request.scope):
            if self._quotas.limits_new_keys:
                await self._admit_if_new(request)
            self._inject_fault("before_claim")
            # A probe may release the key, or its record be forgotten (past its
            # tombstone) while this request waited: then the key starts over.
            operation: Operation | None = None
            for _ in range(3):
                with self._forwarder.gate(request.route):
                    claimed_at = self._clock.monotonic()
                    try:
                        claim = await self._timed(
                            "claim", self._store.claim(self._claim_of(request))
                        )
                    except StoreUnavailable:
                        self._keeper.claim_failed(request.scope, request.key)
                        raise
                    if not isinstance(claim, Existing):
                        return await self._attempt(request, claim.operation, claimed_at)
                operation = await self._refresh(claim.operation)
                if operation is not None and request.trace is not None:
                    request.trace.operation_id = operation.id
                if (
                    operation is not None
                    and request.wait_seconds > 0
                    and operation.state is State.IN_FLIGHT
                ):
                    operation = await self._wait(operation, request.wait_seconds)
                if operation is None:
                    continue
                if operation.state is not State.RELEASED or (
                    operation.fingerprint != request.fingerprint
                ):
                    return answer_existing(operation, request.fingerprint)
            if operation is None:  # still changing hands: answer from what stands now
                operation = await self._timed("get", self._store.get(request.scope, request.key))
            if operation is not None:
                return answer_existing(operation, request.fingerprint)
            raise InProgress(
                "the key's record changed hands while this request waited; send it again",
                key=request.key,
                state=State.RELEASED.value,
                retry_after=1,
            )

    def answer_from_receipt(self, request: ProxyRequest) -> Reply | None:
        """A retry of a completed operation, answered from the committed record at once.

        No task, no claim, no wait for a group commit: a completed record is
        final, so `execute` would give the same answer (a replay, a 422, or a
        receipt that is gone). `None` when the store cannot tell without
        waiting or the key is anything but completed: then call `execute`.
        """
        started = self._clock.monotonic()
        operation = self._store.peek_completed(request.scope, request.key)
        if operation is None:
            return None
        # Timed only when it answered: PostgreSQL's peek is a constant `None`.
        self._observer.store_call("peek", self._clock.monotonic() - started)
        with self._quotas.in_flight(request.scope):
            if request.trace is not None:
                request.trace.operation_id = operation.id
            return answer_existing(operation, request.fingerprint)

    async def _admit_if_new(self, request: ProxyRequest) -> None:
        """With key quotas on, a new key is charged before it is claimed (one extra read)."""
        if await self._timed("get", self._store.get(request.scope, request.key)) is None:
            await self._quotas.admit_new_key(
                request.scope,
                request.route.name,
                lambda: self._store.count_for_scope(request.scope),
            )

    def _claim_of(self, request: ProxyRequest) -> ClaimRequest:
        return ClaimRequest(
            scope=request.scope,
            key=request.key,
            fingerprint=request.fingerprint,
            route=request.route.name,
            method=request.method,
            path=request.path,
            owner=self._keeper.owner,
            lease_seconds=self._settings.lease,
            tombstone_seconds=self._settings.tombstone_retention,
        )

    async def _attempt(
        self, request: ProxyRequest, operation: Operation, claimed_at: float
    ) -> Reply:
        if request.trace is not None:
            request.trace.operation_id = operation.id
        if log.isEnabledFor(logging.DEBUG):  # the extra dict is not free on every request
            log.debug(
                "claimed",
                extra={"event": "claim", "operation_id": operation.id, "key": request.key,
                       "attempt": operation.attempts, "token": operation.token},
            )  # fmt: skip
        self._keeper.hold(
            operation.id, operation.token, scope=request.scope, key=request.key, asked_at=claimed_at
        )
        relayed = False
        try:
            self._inject_fault("after_claim")
            # Measured on this host's monotonic clock from before the claim was
            # asked for: never longer than the lease the store granted.
            elapsed = self._clock.monotonic() - claimed_at
            if elapsed > self._settings.lease * (1 - LEASE_SAFETY_MARGIN):
                state = await self._release(
                    request, operation, "the lease expired before sending; nothing was sent"
                )
                raise LeaseLost(
                    "this gateway was paused past its lease before sending; nothing was sent"
                ).about(request.key, state.value)
            reply, relayed = await self._send(request, operation)
            return reply
        finally:
            if not relayed:  # a relayed answer ends the attempt with its last byte
                self._end_attempt(operation)

    def _end_attempt(self, operation: Operation) -> None:
        self._keeper.drop(operation.id, operation.token)
        self._notify(operation.id)

    def _with_forwarded_key(self, request: ProxyRequest, operation: Operation) -> Pairs:
        value = self._forwarded_keys.of(request.route, operation)
        return request.headers if value is None else (*request.headers, (IDEMPOTENCY_KEY, value))

    async def _send(self, request: ProxyRequest, operation: Operation) -> tuple[Reply, bool]:
        """Send once and record the outcome; True when the reply's stream carries the
        rest of the attempt (an answer too large to keep, see `_relay`)."""
        route = request.route
        started = self._clock.monotonic()
        try:
            reply = await self._forwarder.send(
                route,
                request.method,
                request.upstream_url,
                self._with_forwarded_key(request, operation),
                request.body,
            )
            self._inject_fault("after_send")
            body = await _read_or_close(reply, route.max_stored_response)
        except UpstreamUnreachable as exc:
            self._upstream_done(request, started)
            state = await self._release(request, operation, exc.detail)
            raise exc.about(request.key, state.value) from exc
        except UpstreamError as exc:
            self._upstream_done(request, started)
            state = await self._mark_unknown(request, operation, exc)
            raise exc.about(request.key, state.value) from exc
        if body is None and reply.status not in route.release_statuses:
            return self._relay(request, operation, reply, started), True
        self._upstream_done(request, started)
        self._inject_fault("after_response")
        return await self._record(request, operation, reply, body), False

    def _upstream_done(self, request: ProxyRequest, started: float) -> None:
        seconds = self._clock.monotonic() - started
        self._observer.upstream_call(request.route.name, seconds)
        if request.trace is not None:
            request.trace.upstream_seconds = seconds

    async def _record(
        self,
        request: ProxyRequest,
        operation: Operation,
        reply: UpstreamAnswer,
        body: bytes | None,
    ) -> Reply:
        route = request.route
        if reply.status in route.release_statuses:  # a refusal: passed on, kept or not
            state = await self._release(
                request,
                operation,
                f"the upstream refused the request with status {reply.status}",
                status=reply.status,
            )
            return Reply.from_upstream(reply, body, state=state, key=request.key)
        assert body is not None  # an answer too large to keep is relayed instead
        state = await self._complete(
            request, operation, receipt_of(route, reply, body), retained=True
        )
        self._inject_fault("after_receipt")
        return Reply.from_upstream(reply, body, state=state, key=request.key)

    def _relay(
        self, request: ProxyRequest, operation: Operation, reply: UpstreamAnswer, started: float
    ) -> Reply:
        """An answer too large to keep: streamed to the caller, recorded once it ends.

        Only an answer that arrived whole is a receipt (`completed`, body not
        kept); one cut off mid-body is `unknown`. A release status is decided
        from the status line alone, as for a kept answer. The caller must read
        the stream to its end (`gateway.proxy_view.write_reply` does, even
        after its client left): the attempt, and its lease, end with it.
        """
        route = request.route

        async def body() -> AsyncIterator[bytes]:
            try:
                try:
                    async for chunk in reply.rest():
                        yield chunk
                except UpstreamError as exc:
                    self._upstream_done(request, started)
                    await self._mark_unknown(request, operation, exc)
                    raise
                self._upstream_done(request, started)
                stored = receipt_of(route, reply, b"")
                await self._complete(request, operation, stored, retained=False)
            finally:
                reply.close()
                self._end_attempt(operation)

        return Reply(
            status=reply.status,
            headers=reply.headers,
            body=b"",
            state=self._own_state(operation),
            key=request.key,
            stream=body(),
        )

    # -- outcome writes, all fenced by the attempt's token ------------------------

    async def _complete(
        self, request: ProxyRequest, operation: Operation, stored: StoredResponse, *, retained: bool
    ) -> State:
        async def write() -> Operation | None:
            return await self._store.complete(
                operation.id,
                operation.token,
                stored,
                body_retained=retained,
                retention_seconds=self._settings.retention,
                tombstone_seconds=self._settings.tombstone_retention,
                resolution=Resolution(by="upstream", at=self._clock.time()),
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
        return await self._fenced_write(request, operation, "complete", write, evidence)

    async def _release(
        self, request: ProxyRequest, operation: Operation, detail: str, *, status: int | None = None
    ) -> State:
        evidence = Evidence(at=self._clock.time(), source="gateway", detail=detail, status=status)

        async def write() -> Operation | None:
            return await self._store.release(
                operation.id,
                operation.token,
                evidence,
                tombstone_seconds=self._settings.tombstone_retention,
            )

        return await self._fenced_write(request, operation, "release", write, lambda: evidence)

    async def _mark_unknown(
        self, request: ProxyRequest, operation: Operation, error: UpstreamError
    ) -> State:
        evidence = Evidence(at=self._clock.time(), source="gateway", detail=error.detail)

        async def write() -> Operation | None:
            return await self._store.mark_unknown(operation.id, operation.token, evidence)

        self._observer.became_unknown(request.route.name, error.problem_type)
        log.warning(
            "outcome unknown",
            extra={"event": "unknown", "operation_id": operation.id, "key": request.key,
                   "route": request.route.name, "reason": error.problem_type},
        )  # fmt: skip
        return await self._fenced_write(request, operation, "mark_unknown", write, lambda: evidence)

    async def _fenced_write(
        self,
        request: ProxyRequest,
        operation: Operation,
        name: str,
        write: Callable[[], Awaitable[Operation | None]],
        evidence: Callable[[], Evidence],
    ) -> State:
        """Run an outcome write; return the record's state once it is done.

        That state, not the one the write meant to set, is what the caller is
        told: a stale token leaves evidence and the record as another writer
        left it. A store outage leaves a debt the keeper pays later; the record
        is then `in_flight` while this attempt's lease surely stands, and past
        that nobody here can tell whether another replica found it expired:
        `unknown`, the answer that never invites a blind retry.
        """

        async def settle() -> Operation | None:
            written = await self._timed(name, write())
            if written is not None:
                return written
            self._observer.stale_write(request.route.name)
            log.warning("stale %s refused for %s (token %d)", name, operation.id, operation.token)
            await self._timed("add_evidence", self._store.add_evidence(operation.id, evidence()))
            return await self._store.get_by_id(operation.id)

        try:
            recorded = await settle()
        except StoreUnavailable as exc:
            log.error(
                "%s for %s not recorded yet: %s", name, operation.id, exc.internal or exc.detail
            )
            self._keeper.owe(operation.id, operation.token, settle)
            return self._own_state(operation)
        if recorded is None:  # forgotten meanwhile: the key may be bound anew
            current = await self._store.get(request.scope, request.key)
            return current.state if current is not None else State.RELEASED
        return recorded.state

    def _own_state(self, operation: Operation) -> State:
        """The record's state while this process holds the attempt and has not written
        its outcome: `in_flight` while the lease surely stands; past that another
        replica may have found it expired, and `unknown` never invites a blind retry."""
        return State.IN_FLIGHT if self._keeper.surely_holds(operation.id) else State.UNKNOWN

    # -- keys met by a request or a lookup ---------------------------------------

    async def lookup(self, scope: str, key: str) -> Operation | None:
        """The operation for a key, brought up to date (expired lease, due probe) on the way."""
        operation = await self._timed("get", self._store.get(scope, key))
        return None if operation is None else await self._refresh(operation)

    async def _refresh(self, operation: Operation) -> Operation | None:
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
            return await self.probe(operation)
        return operation

    async def _wait(self, operation: Operation, seconds: float) -> Operation | None:
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
            refreshed = None if current is None else await self._refresh(current)
            if refreshed is None:  # forgotten meanwhile
                self._settled.pop(operation.id, None)
                return None
            operation = refreshed
        if not self._keeper.holds(operation.id):
            self._settled.pop(operation.id, None)
        return operation

    def notify_settled(self, operation_id: str) -> None:
        """An outcome was recorded (possibly by another replica): wake its waiters."""
        self._notify(operation_id)

    def _notify(self, operation_id: str) -> None:
        event = self._settled.pop(operation_id, None)
        if event is not None:
            event.set()

    # -- settling unknown outcomes ---------------------------------------------------

    async def resolve(
        self,
        operation: Operation,
        *,
        outcome: Outcome,
        by: ResolvedBy,
        response: StoredResponse | None = None,
        note: str | None = None,
        expected_version: int | None = None,
    ) -> Operation:
        """Settle an `unknown` operation: `applied` completes it, `not_applied` releases it.

        The verdict is about the attempt `operation` was read at (its token): if
        a newer attempt was sent meanwhile, or someone settled it first, nothing
        changes and `NotResolvable` (or `PreconditionFailed` for a stale
        `expected_version`) says what the record is now.
        """
        if operation.state is not State.UNKNOWN:
            raise NotResolvable(
                f"the operation is {operation.state.value}; only an unknown one can be resolved",
                key=operation.key,
                state=operation.state.value,
                operation_id=operation.id,
            )
        resolved = await self._timed(
            "resolve",
            self._store.resolve(
                operation.id,
                token=operation.token,
                expected_version=expected_version,
                state=State.COMPLETED if outcome == "applied" else State.RELEASED,
                response=response,
                resolution=Resolution(by=by, at=self._clock.time(), note=note),
                retention_seconds=self._settings.retention,
                tombstone_seconds=self._settings.tombstone_retention,
            ),
        )
        if resolved is None:
            current = await self._store.get_by_id(operation.id)
            if current is None or current.state is not State.UNKNOWN:
                state = current.state.value if current else "forgotten"
                raise NotResolvable(
                    f"the operation is {state} now; only an unknown one can be resolved",
                    key=operation.key,
                    state=state,
                    operation_id=operation.id,
                )
            if current.token != operation.token:
                raise NotResolvable(
                    f"the operation was retried (attempt {current.attempts}) since it was read; "
                    "look it up again before resolving",
                    key=operation.key,
                    state=current.state.value,
                    operation_id=operation.id,
                )
            raise PreconditionFailed(
                "the operation changed since it was read (If-Match did not match)",
                key=operation.key,
                state=current.state.value,
                operation_id=operation.id,
            )
        self._prober.forget(operation.id)
        self._observer.resolved(by, outcome)
        log.info(
            "resolved",
            extra={"event": "resolution", "operation_id": operation.id, "key": operation.key,
                   "by": by, "outcome": outcome, "state": resolved.state.value},
        )  # fmt: skip
        return resolved

    async def probe(self, operation: Operation) -> Operation | None:
        """Ask the route's probe about an unknown operation and act on the answer.

        A verdict is about one attempt: the one current when the probe was
        sent, read afresh from the store (never from a snapshot a caller held).
        It settles the operation only while that attempt is still current (the
        resolution is fenced by its token); otherwise it is kept as evidence.
        "Not applied" counts only once the probe was sent `not_applied_after`
        past the attempt's last lease expiry, both on the store's clock: the
        upstream may still be applying a request it received late.
        """
        route = self._routes.get(operation.route)
        probe = route.probe if route is not None else None
        if route is None or probe is None or not self._prober.due(operation.id):
            return operation
        asked = await self._store.get_by_id(operation.id)
        if asked is None or asked.state is not State.UNKNOWN:
            return asked  # settled meanwhile, or forgotten (None)
        forwarded = self._forwarded_keys.of(route, asked)
        if forwarded is None:  # the config refuses a probe on such a route
            return asked
        answer = await self._prober.ask(route, asked, forwarded)
        response = answer.response
        if response is None:
            return await self._probe_evidence(
                route, asked, "error", f"probe failed: {answer.error}"
            )
        if response.status in probe.applied_statuses:
            return await self._probe_settles(route, asked, "applied", response)
        if response.status in probe.not_applied_statuses:
            if asked.observed_at >= self._last_send_bound(asked) + probe.not_applied_after:
                return await self._probe_settles(route, asked, "not_applied", None)
            return await self._probe_evidence(
                route,
                asked,
                "not_applied_too_soon",
                f"probe answered {response.status} (not applied), but attempt {asked.attempts} "
                "may have been sent less than not_applied_after before; kept unknown",
                status=response.status,
            )
        return await self._probe_evidence(
            route,
            asked,
            "inconclusive",
            f"probe answered {response.status}, neither applied nor not applied",
            status=response.status,
        )

    def _last_send_bound(self, operation: Operation) -> float:
        """The latest moment, on the store's clock, the attempt's holder could have sent."""
        if operation.lease_expires_at is not None:
            return operation.lease_expires_at
        return (operation.sent_at or operation.created_at) + self._settings.lease

    async def _probe_settles(
        self,
        route: RouteSettings,
        asked: Operation,
        outcome: Outcome,
        response: StoredResponse | None,
    ) -> Operation | None:
        try:
            settled = await self.resolve(
                asked, outcome=outcome, by="probe", response=response, note="settled by probe"
            )
        except (NotResolvable, PreconditionFailed) as exc:
            return await self._probe_evidence(
                route,
                asked,
                "superseded",
                f"probe said {outcome} about attempt {asked.attempts}, which is no longer "
                f"current ({exc.detail}); kept as evidence only",
                status=response.status if response is not None else None,
            )
        self._observer.probe_result(route.name, outcome)
        return settled

    async def _probe_evidence(
        self,
        route: RouteSettings,
        operation: Operation,
        result: str,
        detail: str,
        *,
        status: int | None = None,
    ) -> Operation | None:
        self._observer.probe_result(route.name, result)
        log.info(
            "probe",
            extra={"event": "probe", "operation_id": operation.id, "key": operation.key,
                   "route": route.name, "result": result, "status": status},
        )  # fmt: skip
        evidence = Evidence(at=self._clock.time(), source="probe", detail=detail, status=status)
        await self._store.add_evidence(operation.id, evidence)
        return await self._store.get_by_id(operation.id)

    async def reconcile_unknown(self, *, batch: int = 100) -> int:
        """Probe every due unknown operation once (background sweep); count the settled."""
        settled = 0
        cursor: str | None = None
        while True:
            page = await self._store.list_operations(
                state=State.UNKNOWN, limit=batch, cursor=cursor
            )
            for operation in page.items:
                route = self._routes.get(operation.route)
                if route is None or route.probe is None or not self._prober.due(operation.id):
                    continue
                probed = await self.probe(operation)
                if probed is not None and probed.state is not State.UNKNOWN:
                    settled += 1
            if page.next_cursor is None:
                return settled
            cursor = page.next_cursor

    # -- helpers ---------------------------------------------------------------------

    async def _timed(self, name: str, call: Awaitable[T]) -> T:
        started = self._clock.monotonic()
        try:
            return await call
        except StoreUnavailable:
            self._observer.store_error(name)
            raise
        finally:
            self._observer.store_call(name, self._clock.monotonic() - started)

    def _inject_fault(self, window: str) -> None:
        """Test-only: `testing.fault = "crash_<window>"` dies with SIGKILL in that window,
        `"pause_<window>"` stops itself with SIGSTOP there (a test resumes it with SIGCONT)."""
        if self._fault == "crash_" + window:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self._fault == "pause_" + window:
            os.kill(os.getpid(), signal.SIGSTOP)


def answer_existing(operation: Operation, fingerprint: str) -> Reply:
    """Answer a request whose key is bound to an operation this caller does not hold.

    Judged from the record alone, its times against the store's clock
    (`observed_at`), so every replica answers a retry the same way.
    """
    key = operation.key
    state, op_id = operation.state.value, operation.id
    if operation.fingerprint != fingerprint:
        raise KeyMismatch(
            "this key was first used with a different request (method, path, query or body)",
            key=key,
            state=state,
            operation_id=op_id,
        )
    if operation.state is State.COMPLETED:
        if operation.receipt_available():
            assert operation.response is not None
            response = operation.response
            return Reply(
                status=response.status,
                headers=response.headers,
                body=response.body,
                state=State.COMPLETED,
                key=key,
                replayed=True,
            )
        if not operation.body_retained:
            resolution = operation.resolution
            if any(item.source == "redaction" for item in operation.evidence):
                detail = "the stored response was erased by an operator; the key stays used"
            elif resolution is None or resolution.by == "upstream":
                detail = "the first response was too large to keep; it was delivered once"
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


async def _read_or_close(reply: UpstreamAnswer, limit: int) -> bytes | None:
    try:
        return await reply.read(limit)
    except BaseException:
        reply.close()
        raise
