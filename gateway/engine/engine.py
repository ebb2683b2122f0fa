"""The idempotency state machine: the one place that decides what happens to a key.

    (new key) -> in_flight --answered--> completed
                    |  \\--provably not sent--> released --(next attempt)--> in_flight
                    \\--sent, no complete answer / lease expired--> unknown
    unknown --resolve applied / probe applied--> completed
    unknown --resolve not_applied / probe not applied (late enough)--> released

For a protected request this module claims the key (durably, before the first
byte goes upstream), checks its lease right before sending, sends once, and
decides the outcome, which `gateway.engine.outcomes` records under the
attempt's fencing token. A key that is already taken is answered from its
record (`gateway.engine.answers`: replay, wait, 409 or 422). Unknown outcomes
are settled by a resolution or by a probe's verdict (`gateway.engine.settle`).
`IdempotencyEngine` is the one entry point for all of it: front ends
translate to and from its calls; stores persist what is decided here.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import secrets
import signal
from typing import TYPE_CHECKING

from gateway.engine.answers import KeyRecords, answer_existing, key_mismatch
from gateway.engine.calibrator import Calibrator, SightObserver, request_kind
from gateway.engine.clock import SYSTEM_CLOCK, Clock
from gateway.engine.digests import Digests
from gateway.engine.errors import (
    InProgress,
    LeaseLost,
    QuotaExceeded,
    RouteSaturated,
    StoreUnavailable,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.engine.exchange import (
    Dialect,
    LifecycleObserver,
    NoObserver,
    ProxyRequest,
    Released,
    Reply,
    StoreTimer,
    UpstreamAnswer,
    receipt_of,
)
from gateway.engine.graces import GraceClock
from gateway.engine.headers import IDEMPOTENCY_KEY, Pairs, header_value
from gateway.engine.keys import operation_url
from gateway.engine.lifecycle_events import (
    CANCELLATION_HELD,
    cancellation_held_event,
    request_claimed,
)
from gateway.engine.models import (
    ClaimRequest,
    ClaimResult,
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    ResolvedBy,
    Similar,
    State,
    StoredResponse,
)
from gateway.engine.outcomes import OutcomeWriter
from gateway.engine.settle import Outcome, ReleaseWindow, Settler
from gateway.engine.twins import guard_for, similar_refusal
from gateway.telemetry.tracer import NO_TRACER, Span, Tracer
from gateway.upstream.spool import Spooler

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings, RouteSettings
    from gateway.engine.exchange import Upstream
    from gateway.engine.forwarded_key import ForwardedKeys
    from gateway.engine.leases import LeaseKeeper
    from gateway.engine.probes import Prober
    from gateway.engine.quotas import ScopeQuotas
    from gateway.store.base import Store

log = logging.getLogger("gateway.lifecycle")

_CLAIM_WAITS = (0.0, 0.05, 0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
"""Waits before each look for a held-back cancellation's operation (`cancellation_held`)."""

_CLAIMS_ON_A_STEPPING_CLOCK = 3
"""Claims a request tries while the store's clock steps under each before it gives up
(503 store-unavailable, nothing sent, safe to retry)."""

READER_GRACE = 10.0
"""Seconds a stopping gateway lets answers still being read (spooled) end and be recorded."""

LEASE_SAFETY_MARGIN = 0.2
"""Fraction of the lease kept in reserve: a holder past 80% of it does not send."""


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
        tracer: Tracer = NO_TRACER,
        fault: str | None = None,
        clock: Clock = SYSTEM_CLOCK,
        graces: GraceClock | None = None,
        sight_observer: SightObserver | None = None,
        digests: Digests | None = None,
        spooler: Spooler | None = None,
    ) -> None:
        self._store = store
        self.digests = digests if digests is not None else Digests(secrets.token_bytes(32))
        """Keyed digests of what callers sent (the scope secret's, in a gateway): the
        history's `body_digest` and the recorded request's `digest`."""
        self._spooler = spooler if spooler is not None else Spooler(total=1 << 30)
        self._readers: set[asyncio.Task[None]] = set()
        self._tracer = tracer
        self._clock = clock
        self._forwarder = forwarder
        self._keeper = keeper
        self._forwarded_keys = forwarded_keys
        self._quotas = quotas
        self._settings = settings
        self._routes = routes
        self._observer: LifecycleObserver = observer or NoObserver()
        self._timed = StoreTimer(self._observer, clock)
        self._fault = fault
        self.graces = graces if graces is not None else GraceClock(clock)
        """The store's clock as this process vouches for it; `start_witness`, the claims,
        the lease keeper's renewals (given the same one) and the release checks feed it."""
        self.calibrator = Calibrator(
            store=store, prober=prober, forwarded_keys=forwarded_keys, observer=sight_observer
        )
        """What a probe can see (`gateway.engine.calibrator`): its checks and trust."""
        self._settler = Settler(
            store=store,
            prober=prober,
            forwarded_keys=forwarded_keys,
            settings=settings,
            routes=routes,
            observer=self._observer,
            timed=self._timed,
            clock=clock,
            graces=self.graces,
            calibrator=self.calibrator,
            tracer=tracer,
        )
        self._records = KeyRecords(
            store=store,
            keeper=keeper,
            settler=self._settler,
            observer=self._observer,
            timed=self._timed,
            clock=clock,
        )
        self._outcomes = OutcomeWriter(
            store=store,
            keeper=keeper,
            settings=settings,
            observer=self._observer,
            timed=self._timed,
            clock=clock,
            forwarded_key=self._forwarded_key,
            tracer=tracer,
            digests=self.digests,
        )

    # -- the request path ------------------------------------------------------

    async def execute(self, request: ProxyRequest) -> Reply:
        """Answer a protected request; raises a `GatewayError` for every refusal.

        The route's concurrency gate is held from the claim to the outcome of an
        attempt, not while a retry waits (`Prefer: wait`) or a probe runs: a
        waiting duplicate does not take an upstream slot.
        """
        if request.dialect is None and self._spooler.full:
            raise RouteSaturated(
                "the gateway's answer spools are full (max_spool_total): nothing was sent; "
                "retry with the same key",
                retry_after=1,
            )
        with self._quotas.in_flight(request.scope) as request_hold:
            if self._quotas.limits_new_keys:
                await self._admit_if_new(request)
            self._inject_fault("before_claim")
            # A probe may release the key, or its record be forgotten (past its
            # tombstone) while this request waited: then the key starts over.
            operation: Operation | None = None
            for _ in range(3):
                with self._forwarder.gate(request.route, request.scope) as slot:
                    asked_at = self._clock.monotonic()
                    with self._tracer.claim(request) as span:
                        try:
                            claim, claimed_at = await self._claim(request, asked_at)
                        except StoreUnavailable:
                            self._keeper.claim_failed(request.scope, request.key)
                            raise
                        if isinstance(claim, Similar):
                            await self._within_bindings(request)
                            raise similar_refusal(request.key, claim.twin)
                        span.operation(claim.operation)
                    if not isinstance(claim, Existing):
                        reply = await self._attempt(request, claim.operation, claimed_at)
                        if reply.spool is not None:
                            # The upstream is read past this block, by the spool's reader:
                            # the route's slot is held until its last byte, and the
                            # scope's count until the relay to the caller ends.
                            reply.spool.when_ended(slot.keep())
                            reply = reply.holding(request_hold.keep())
                        if claim.twin is None:
                            return reply
                        return dataclasses.replace(reply, similar=operation_url(claim.twin.key))
                operation = await self._records.refresh(claim.operation)
                if operation is not None and request.trace is not None:
                    request.trace.saw(operation)
                if (
                    operation is not None
                    and request.wait_seconds > 0
                    and operation.state is State.IN_FLIGHT
                ):
                    operation = await self._records.wait(operation, request.wait_seconds)
                if operation is None:
                    continue
                if operation.state is not State.RELEASED or not request.same_request(
                    operation.fingerprint
                ):
                    return answer_existing(operation, request)
            if operation is None:  # still changing hands: answer from what stands now
                operation = await self._timed("get", self._store.get(request.scope, request.key))
            if operation is not None:
                return answer_existing(operation, request)
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
        receipt = self._store.peek_receipt(request.scope, request.key)
        if receipt is None:
            return None
        # Timed only when it answered: PostgreSQL's peek is a constant `None`.
        self._observer.store_call("peek", self._clock.monotonic() - started)
        with self._quotas.in_flight(request.scope):
            if request.trace is not None:
                request.trace.operation_id = receipt.operation_id
                request.trace.attempt = receipt.attempts
            if not request.same_request(receipt.fingerprint):
                raise key_mismatch(request.key, State.COMPLETED.value, receipt.operation_id)
            return Reply.replay(receipt.response, request.key, receipt.source)

    async def _admit_if_new(self, request: ProxyRequest) -> None:
        """With key quotas on, a new key is charged before it is claimed (one extra read)."""
        if await self._timed("get", self._store.get(request.scope, request.key)) is None:
            await self._quotas.admit_new_key(
                request.scope,
                request.route.name,
                lambda: self._store.count_for_scope(request.scope),
            )

    async def _within_bindings(self, request: ProxyRequest) -> None:
        """A `similar-operation` refusal binds its key to the twin (a row the scope keeps):
        past the scope's `max_bindings` the binding is dropped again and the refusal is
        `429 quota-exceeded` instead (nothing forwarded), so refusals cannot fill the store."""
        limit = self._quotas.max_bindings
        if limit and await self._timed(
            "unbind", self._store.unbind_past(request.scope, request.key, limit)
        ):
            raise QuotaExceeded(
                f"this client holds more than max_bindings ({limit}) keys refused as the "
                "same request as another key's; nothing was sent",
                retry_after=60,
            )

    async def _claim(self, request: ProxyRequest, asked_at: float) -> tuple[ClaimResult, float]:
        """Claim the key (first asked at monotonic `asked_at`); claim it again if the store's
        clock stepped during the claim. Returns the claim and when it was asked.

        The claim's reading of the store's clock is a witness (`GraceClock`): a
        step shorter than the periodic witnesses' interval is still seen by the
        claim it happened in. Such a claim wrote its lease and its attempt's
        start on a clock that was off, and judged `similar_window` on it (as far
        as this process vouched for it, `SimilarGuard.vouched`). Nothing was
        sent yet, so the attempt is released and the key claimed again, with the
        window not vouched for. After a backward step the new claim waits until
        the clock is settled (`GraceClock.unsettled`): a record dated while the
        clock is back for a moment would look an hour old to a process that never
        saw the step, which would count its release window as long over.
        """
        claim_request = self._claim_of(request)
        for attempt in range(_CLAIMS_ON_A_STEPPING_CLOCK):
            if attempt:
                asked_at = self._clock.monotonic()
            claim = await self._timed("claim", self._store.claim(claim_request))
            steps = self.graces.steps_seen
            observed = (
                claim.twin.observed_at
                if isinstance(claim, Similar)
                else claim.operation.observed_at
            )
            self.graces.witness(observed, before=asked_at, after=self._clock.monotonic())
            if not isinstance(claim, NewAttempt):
                return claim, asked_at
            stepped = self.graces.steps_seen != steps
            if not stepped and not self.graces.unsettled():
                return claim, asked_at
            await self._outcomes.release(
                request,
                claim.operation,
                "the store's clock stepped during the claim; claimed again"
                if stepped
                else "the store's clock was not settled (a recent step, or this process "
                "went unwatched for a while); claimed again once it was",
            )
            await self.graces.settled()
            guard = claim_request.similar
            if guard is not None:
                claim_request = claim_request._replace(similar=guard._replace(vouched=False))
        raise StoreUnavailable(
            "the store's clock kept stepping during the claim; nothing was sent: send the "
            "same request again",
            internal="clock steps at every claim",
        )

    def _claim_of(self, request: ProxyRequest) -> ClaimRequest:
        return ClaimRequest(
            scope=request.scope,
            key=request.key,
            fingerprint=request.fingerprint,
            route=request.route.name,
            method=request.method,
            path=request.path,
            kind=request_kind(request.route, request.method, request.path),
            legacy_fingerprint=request.legacy_fingerprint,
            plain_fingerprints=request.plain_fingerprints,
            owner=self._keeper.owner,
            lease_seconds=self._settings.lease,
            tombstone_seconds=request.retention or self._settings.tombstone_retention,
            claimed=request_claimed(request.record()) if request.record is not None else None,
            similar=guard_for(
                request.route,
                trusted_for=self.graces.trusted_for(),
                distinct=request.distinct,
                derived=request.derived,
            ),
        )

    async def _attempt(
        self, request: ProxyRequest, operation: Operation, claimed_at: float
    ) -> Reply:
        if request.trace is not None:
            request.trace.saw(operation)
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
                state = await self._outcomes.release(
                    request, operation, "the lease expired before sending; nothing was sent"
                )
                raise LeaseLost(
                    "this gateway was paused past its lease before sending; nothing was sent"
                ).about(request.key, state.value, operation.id)
            reply, relayed = await self._send(request, operation)
            return reply
        finally:
            if not relayed:  # a relayed answer ends the attempt with its last byte
                self._end_attempt(operation)

    def _end_attempt(self, operation: Operation) -> None:
        self._keeper.drop(operation.id, operation.token)
        self._records.notify(operation.id)

    def forwarded_key(self, route: RouteSettings, operation: Operation) -> str | None:
        """What `route` sends upstream as the key of `operation`: what an operator
        searches the tool for when settling it by hand."""
        return self._forwarded_keys.of(route, operation)

    def _forwarded_key(self, request: ProxyRequest, operation: Operation) -> str | None:
        if request.forward_operation_id:
            return operation.id
        return self._forwarded_keys.of(request.route, operation)

    def _with_forwarded_key(self, request: ProxyRequest, operation: Operation) -> Pairs:
        value = self._forwarded_key(request, operation)
        return request.headers if value is None else (*request.headers, (IDEMPOTENCY_KEY, value))

    async def _send(self, request: ProxyRequest, operation: Operation) -> tuple[Reply, bool]:
        """Send once and record the outcome; True when the reply's stream carries the
        rest of the attempt (an answer too large to keep, see `_relay`)."""
        if request.dialect is not None:
            return await self._send_in_dialect(request, operation, request.dialect), False
        route = request.route
        started = self._clock.monotonic()
        try:
            with self._tracer.upstream(request, operation, request.method) as span:
                reply = await self._send_once(
                    request, operation, request.method, request.body, span
                )
                body = await _read_or_close(reply, route.max_stored_response)
        except UpstreamError as exc:
            raise await self._send_failed(request, operation, started, exc) from exc
        if body is None:
            return await self._spooled(request, operation, reply, started), True
        self._upstream_done(request, started)
        self._inject_fault("after_response")
        return await self._record(request, operation, reply, body), False

    async def _send_in_dialect(
        self, request: ProxyRequest, operation: Operation, dialect: Dialect
    ) -> Reply:
        """Send a front end's call (see `Dialect`) once, and record what its answer means.

        The whole exchange is bounded by the route's `max_call`: a call whose
        answer has not come by then is `unknown`, as any answer that stops.
        """
        route = request.route
        started = self._clock.monotonic()
        answer: UpstreamAnswer | None = None
        try:
            with self._tracer.upstream(request, operation, dialect.send_method) as span:
                body = dialect.body_for(self._forwarded_key(request, operation))
                answer = await self._send_once(request, operation, dialect.send_method, body, span)
                try:
                    async with asyncio.timeout(route.max_call):
                        outcome = await dialect.outcome(answer)
                except TimeoutError as exc:
                    raise UpstreamTimeout(
                        f"no complete answer within the route's max_call ({route.max_call:g}s)"
                    ) from exc
        except UpstreamError as exc:
            raise await self._send_failed(request, operation, started, exc) from exc
        finally:
            if answer is not None:
                answer.close()
        self._upstream_done(request, started)
        self._inject_fault("after_response")
        if isinstance(outcome, Released):
            state = await self._outcomes.release(
                request, operation, outcome.detail, status=outcome.status
            )
            return Reply(outcome.status, outcome.headers, outcome.body, state, key=request.key)
        stored = outcome.stored
        state = await self._outcomes.complete(request, operation, stored, retained=True)
        self._inject_fault("after_receipt")
        return Reply(stored.status, stored.headers, stored.body, state, key=request.key)

    async def _send_once(
        self, request: ProxyRequest, operation: Operation, method: str, body: bytes, span: Span
    ) -> UpstreamAnswer:
        """The one send of an attempt, inside its upstream span (which also covers reading
        the answer), with the forwarded key."""
        answer = await self._forwarder.send(
            request.route,
            method,
            request.upstream_url,
            self._with_forwarded_key(request, operation),
            body,
        )
        span.status(answer.status)
        self._inject_fault("after_send")
        return answer

    async def _send_failed(
        self, request: ProxyRequest, operation: Operation, started: float, error: UpstreamError
    ) -> UpstreamError:
        """Record what a failed send proves, and return the error to answer with: nothing
        sent (`UpstreamUnreachable`) releases the key, anything later makes it `unknown`."""
        self._upstream_done(request, started)
        if isinstance(error, UpstreamUnreachable):
            state = await self._outcomes.release(request, operation, error.detail)
        else:
            state = await self._outcomes.mark_unknown(request, operation, error)
        return error.about(request.key, state.value, operation.id)

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
            state = await self._outcomes.release(
                request,
                operation,
                f"the upstream refused the request with status {reply.status}",
                status=reply.status,
            )
            return Reply.from_upstream(reply, body, state=state, key=request.key)
        assert body is not None  # an answer too large to keep is relayed instead
        state = await self._outcomes.complete(
            request, operation, receipt_of(route, reply, body), retained=True
        )
        self._inject_fault("after_receipt")
        return Reply.from_upstream(reply, body, state=state, key=request.key)

    async def _spooled(
        self, request: ProxyRequest, operation: Operation, reply: UpstreamAnswer, started: float
    ) -> Reply:
        """An answer too large to keep: read to its end by a task of its own, whatever the
        caller does, and relayed to the caller from a spool (`gateway.upstream.spool`).

        The outcome never waits for the caller: a release status releases at the
        status line (as a kept answer would); an answer that arrives whole is
        `completed` (its body not kept) before the relay can end; one cut off
        mid-body is `unknown`. An answer longer than the route's `max_spool`
        (by its `Content-Length`, or once the spool is full) is `completed` at
        that moment and the rest handed to the caller as it is read: only a
        caller that stops reading loses its copy, never the receipt.
        """
        route = request.route
        spool = self._spooler.open(route.max_spool)
        if reply.status in route.release_statuses:
            state: State | None = await self._outcomes.release(
                request,
                operation,
                f"the upstream refused the request with status {reply.status}",
                status=reply.status,
            )
            self._end_attempt(operation)
            decided = True
        else:
            state = self._outcomes.own_state(operation)
            decided = False

        async def complete() -> None:
            nonlocal decided, state
            decided = True
            stored = receipt_of(route, reply, b"")
            state = await self._outcomes.complete(request, operation, stored, retained=False)
            self._end_attempt(operation)

        async def read_to_end() -> None:
            nonlocal decided
            try:
                if not decided and _content_length(reply) > route.max_spool:
                    await complete()
                async for chunk in reply.rest():
                    if spool.closed:  # the caller left: read on only while the outcome waits
                        if decided:
                            break
                        continue
                    if await spool.append(chunk):
                        continue
                    if not decided:
                        await complete()
                    if not await spool.hand_over(chunk):
                        break  # past the spool, with nobody left to read: nothing to keep
            except UpstreamError as exc:
                self._upstream_done(request, started)
                if not decided:
                    decided = True
                    await self._outcomes.mark_unknown(request, operation, exc)
                    self._end_attempt(operation)
                spool.end(exc)
                return
            except BaseException as exc:
                if not decided:
                    self._end_attempt(operation)  # its lease lapses: unknown, by the sweep
                spool.end(UpstreamConnectionLost("the gateway stopped reading the answer"))
                if not isinstance(exc, Exception):
                    raise
                log.error("reading a spooled answer failed", exc_info=exc)
                return
            finally:
                reply.close()
            self._upstream_done(request, started)
            if not decided:
                await complete()
            spool.end()

        reader = asyncio.ensure_future(read_to_end())
        self._readers.add(reader)
        reader.add_done_callback(self._readers.discard)

        return Reply(
            status=reply.status,
            headers=reply.headers,
            body=b"",
            state=state,
            key=request.key,
            stream=spool.chunks(),
            close=spool.close,
            spool=spool,
        )

    # -- keys met by a lookup, and settling unknown outcomes ------------------------

    @property
    def cross_process_signals(self) -> bool:
        """True once the store delivers other replicas' outcomes (PostgreSQL LISTEN)."""
        return self._records.cross_process_signals

    @cross_process_signals.setter
    def cross_process_signals(self, value: bool) -> None:
        self._records.cross_process_signals = value

    async def lookup(self, scope: str, key: str) -> Operation | None:
        """The operation for a key, brought up to date (expired lease, due probe) on the way."""
        return await self._records.lookup(scope, key)

    async def find_request(
        self, scope: str, route: str, fingerprints: tuple[str, ...]
    ) -> Operation | None:
        """The latest operation of a request in a scope, whatever key it was made under
        (by its fingerprint, in any of the forms given), brought up to date like `lookup`."""
        found = await self._store.latest_of_request(
            scope=scope, route=route, fingerprints=fingerprints
        )
        return None if found is None else await self._records.lookup(scope, found.key)

    def notify_settled(self, operation_id: str) -> None:
        """An outcome was recorded (possibly by another replica): wake its waiters."""
        self._records.notify(operation_id)

    async def resolve(
        self,
        operation: Operation,
        *,
        outcome: Outcome,
        by: ResolvedBy,
        response: StoredResponse | None = None,
        note: str | None = None,
        expected_version: int | None = None,
        actor: str | None = None,
        force: bool = False,
        share_with_owner: bool = False,
    ) -> Operation:
        """Settle an `unknown` operation: `applied` completes it, `not_applied` releases it
        (see `Settler.resolve`)."""
        return await self._settler.resolve(
            operation,
            outcome=outcome,
            by=by,
            response=response,
            note=note,
            expected_version=expected_version,
            actor=actor,
            force=force,
            share_with_owner=share_with_owner,
        )

    async def attach(
        self,
        operation: Operation,
        response: StoredResponse,
        *,
        note: str,
        actor: str,
        expected_version: int | None = None,
        share_with_owner: bool = False,
    ) -> Operation:
        """Attach the receipt an `applied` settlement went without, once (`Settler.attach`)."""
        return await self._settler.attach(
            operation,
            response,
            note=note,
            actor=actor,
            expected_version=expected_version,
            share_with_owner=share_with_owner,
        )

    def release_window(self, operation: Operation) -> ReleaseWindow | None:
        """Until when the tool may still apply the operation's last send (`Settler`)."""
        return self._settler.release_window(operation)

    async def cancellation_held(self, scope: str, key: str, fingerprint: str) -> bool:
        """Record that a client's cancellation of the protected call under `key` was held
        back: the history says so (the client meant it to stop; the call ran on), and the
        log names the key and the operation. Changes no version.

        A cancellation can overtake the claim by moments, so the operation is looked for
        again a few times (about 6 s in all); one of another request under the key (a
        refused reuse) is not this call's. False when none was found."""
        for delay in _CLAIM_WAITS:
            await asyncio.sleep(delay)
            operation = await self._store.get(scope, key)
            if operation is not None and operation.fingerprint == fingerprint:
                break
        else:
            return False
        event = cancellation_held_event(attempt=operation.attempts)
        evidence = Evidence(at=self._clock.time(), source="client", detail=CANCELLATION_HELD)
        await self._store.add_evidence(operation.id, evidence, (event,))
        log.info(
            "cancellation of a protected call held back",
            extra={"event": "mcp_cancel", "route": operation.route, "key": key,
                   "operation_id": operation.id},
        )  # fmt: skip
        return True

    def has_probe(self, route_name: str) -> bool:
        return any(r.name == route_name and r.probe is not None for r in self._routes)

    async def probe(self, operation: Operation, *, now: bool = False) -> Operation | None:
        """Ask the route's probe about an unknown operation and act on the answer (`now`:
        an operator asked, whatever the probe's backoff says)."""
        return await self._settler.probe(operation, now=now)

    async def reconcile_unknown(self, *, batch: int = 100) -> int:
        """Probe every due unknown operation once (background sweep); count the settled."""
        return await self._settler.reconcile_unknown(batch=batch)

    async def close(self) -> None:
        """Cancel what runs in the background (probes scheduled at a window's end), after
        the answers still being read have had `READER_GRACE` to end and be recorded."""
        if self._readers:
            await asyncio.wait(set(self._readers), timeout=READER_GRACE)
            for reader in set(self._readers):
                reader.cancel()
        await self._settler.close()

    async def refresh_probe_metrics(self) -> None:
        """Show what the shared calibration rows say of every route's probe (blind or not)."""
        await self.calibrator.refresh_metrics(self._routes)

    # -- helpers ---------------------------------------------------------------------

    def _inject_fault(self, window: str) -> None:
        """Test-only: `testing.fault = "crash_<window>"` dies with SIGKILL in that window,
        `"pause_<window>"` stops itself with SIGSTOP there (a test resumes it with SIGCONT)."""
        if self._fault == "crash_" + window:
            os.kill(os.getpid(), signal.SIGKILL)
        elif self._fault == "pause_" + window:
            os.kill(os.getpid(), signal.SIGSTOP)


def _content_length(answer: UpstreamAnswer) -> int:
    """The answer's declared length, or 0 when it declares none (or nonsense)."""
    value = (header_value(answer.headers, "Content-Length") or "").strip()
    return int(value) if value.isdigit() else 0


async def _read_or_close(reply: UpstreamAnswer, limit: int) -> bytes | None:
    try:
        return await reply.read(limit)
    except BaseException:
        reply.close()
        raise
