"""The idempotency state machine: the one place that decides what happens to a key.

    (new key) -> in_flight --answered--> completed
                    |  \\--provably not sent--> released --(next attempt)--> in_flight
                    \\--sent, no complete answer--> unknown --resolve/probe--> ...

For a protected request this module claims the key (durably, before the first
byte goes upstream), checks its lease right before sending, sends once, and
records the outcome under its fencing token. A key that is already taken is
answered from its record: replay, 409, or 422. HTTP handlers translate to and
from these calls; stores persist what is decided here. Nothing here imports
`aiohttp.web`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

from gateway.errors import (
    InProgress,
    KeyMismatch,
    LeaseLost,
    OutcomeUnknown,
    ReceiptExpired,
    ReceiptNotRetained,
    RouteSaturated,
    StoreUnavailable,
    UpstreamConnectionLost,
    UpstreamError,
    UpstreamTimeout,
    UpstreamUnreachable,
)
from gateway.headers import IDEMPOTENCY_KEY, Pairs, end_to_end
from gateway.models import (
    ClaimRequest,
    Evidence,
    Existing,
    Operation,
    Resolution,
    State,
    StoredResponse,
)

if TYPE_CHECKING:
    from gateway.config import IdempotencySettings, RouteSettings
    from gateway.forwarder import Forwarder, UpstreamReply
    from gateway.store.base import Store

T = TypeVar("T")
log = logging.getLogger("gateway.lifecycle")

LEASE_SAFETY_MARGIN = 0.2
"""Fraction of the lease kept in reserve: a holder past 80% of it does not send."""


class LifecycleObserver(Protocol):
    """Hooks the metrics layer implements; called on the event loop, must not block."""

    def store_call(self, operation: str, seconds: float) -> None: ...

    def upstream_call(self, route: str, seconds: float) -> None: ...

    def stale_write(self, route: str) -> None: ...


class _NoObserver:
    def store_call(self, operation: str, seconds: float) -> None:
        pass

    def upstream_call(self, route: str, seconds: float) -> None:
        pass

    def stale_write(self, route: str) -> None:
        pass


@dataclass(frozen=True, slots=True)
class ProxyRequest:
    """A request the HTTP layer has parsed, scoped and fingerprinted."""

    route: RouteSettings
    upstream_url: str
    method: str
    path: str
    headers: Pairs
    body: bytes
    scope: str
    key: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class Reply:
    """What to send back: a fresh upstream answer, a replay, or a pass-through.

    `stream` is set instead of `body` when the upstream answer was too large
    to keep; `close` must be called once the stream is done with.
    """

    status: int
    headers: Pairs
    body: bytes
    state: State | None
    key: str | None = None
    replayed: bool = False
    stream: AsyncIterator[bytes] | None = None
    close: Callable[[], None] | None = None


class _RouteGate:
    """Counts upstream calls in progress on a route; refuses past the limit instead of queueing."""

    __slots__ = ("active", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0

    def enter(self, route: str) -> None:
        if self.active >= self.limit:
            raise RouteSaturated(
                f"route {route!r} has {self.limit} upstream calls in progress", retry_after=1
            )
        self.active += 1

    def leave(self) -> None:
        self.active -= 1


class IdempotencyEngine:
    """Runs protected requests through claim, send, and outcome.

    >>> # engine = IdempotencyEngine(store=store, forwarder=forwarder,
    >>> #     settings=settings.idempotency, routes=settings.routes, owner="gw-1")
    >>> # reply = await engine.execute(proxy_request)
    """

    def __init__(
        self,
        *,
        store: Store,
        forwarder: Forwarder,
        settings: IdempotencySettings,
        routes: tuple[RouteSettings, ...],
        owner: str,
        observer: LifecycleObserver | None = None,
        fault: str | None = None,
    ) -> None:
        self._store = store
        self._forwarder = forwarder
        self._settings = settings
        self._owner = owner
        self._observer: LifecycleObserver = observer or _NoObserver()
        self._fault = fault
        self._gates = {route.name: _RouteGate(route.max_concurrency) for route in routes}
        self._held: dict[str, int] = {}
        self._renewer: asyncio.Task[None] | None = None

    @property
    def owner(self) -> str:
        return self._owner

    # -- background lease renewal --------------------------------------------

    async def start(self) -> None:
        self._renewer = asyncio.create_task(self._renew_forever(), name="lease-renewer")

    async def stop(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.gather(self._renewer, return_exceptions=True)
            self._renewer = None

    async def _renew_forever(self) -> None:
        interval = max(self._settings.lease / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            if not self._held:
                continue
            try:
                await self._store.renew(
                    dict(self._held), owner=self._owner, lease_seconds=self._settings.lease
                )
            except StoreUnavailable as exc:
                log.warning("lease renewal failed: %s", exc.detail)

    # -- the request path ------------------------------------------------------

    async def execute(self, request: ProxyRequest) -> Reply:
        """Answer a protected request; raises a `GatewayError` for every refusal."""
        gate = self._gates[request.route.name]
        gate.enter(request.route.name)
        try:
            claimed_at = time.monotonic()
            claim = await self._timed_store(
                "claim",
                self._store.claim(
                    ClaimRequest(
                        scope=request.scope,
                        key=request.key,
                        fingerprint=request.fingerprint,
                        route=request.route.name,
                        method=request.method,
                        path=request.path,
                        owner=self._owner,
                        lease_seconds=self._settings.lease,
                        tombstone_seconds=self._settings.tombstone_retention,
                    )
                ),
            )
            if isinstance(claim, Existing):
                return answer_existing(claim.operation, request.fingerprint, time.time())
            return await self._attempt(request, claim.operation, claimed_at)
        finally:
            gate.leave()

    async def passthrough(
        self,
        route: RouteSettings,
        method: str,
        url: str,
        headers: Pairs,
        body: bytes,
    ) -> Reply:
        """Proxy a request of an unprotected method: no record, same one-send forwarder."""
        gate = self._gates[route.name]
        gate.enter(route.name)
        started = time.monotonic()
        try:
            reply = await self._forwarder.send(route, method, url, headers, body)
            try:
                received = await reply.read(route.max_stored_response)
            except BaseException:
                reply.close()
                raise
        finally:
            self._observer.upstream_call(route.name, time.monotonic() - started)
            gate.leave()
        return _pass_through(reply, received, None, None)

    async def _attempt(
        self, request: ProxyRequest, operation: Operation, claimed_at: float
    ) -> Reply:
        self._held[operation.id] = operation.token
        try:
            self._inject_fault("after_claim")
            if time.monotonic() > claimed_at + self._settings.lease * (1 - LEASE_SAFETY_MARGIN):
                await self._settle_not_sent(request, operation, "the lease expired before sending")
                raise LeaseLost(
                    "this gateway was paused past its lease before sending; nothing was sent",
                    key=request.key,
                    state=State.RELEASED.value,
                )
            return await self._send(request, operation)
        finally:
            self._held.pop(operation.id, None)

    async def _send(self, request: ProxyRequest, operation: Operation) -> Reply:
        route = request.route
        started = time.monotonic()
        try:
            reply = await self._forwarder.send(
                route,
                request.method,
                request.upstream_url,
                _with_forwarded_key(request, operation),
                request.body,
            )
        except UpstreamUnreachable as exc:
            self._observer.upstream_call(route.name, time.monotonic() - started)
            await self._settle_not_sent(request, operation, exc.detail)
            raise _about(exc, request.key, State.RELEASED) from exc
        except UpstreamError as exc:
            self._observer.upstream_call(route.name, time.monotonic() - started)
            await self._settle_unknown(request, operation, exc)
            raise _about(exc, request.key, State.UNKNOWN) from exc
        return await self._receive(request, operation, reply, started)

    async def _receive(
        self, request: ProxyRequest, operation: Operation, reply: UpstreamReply, started: float
    ) -> Reply:
        route = request.route
        try:
            body = await reply.read(route.max_stored_response)
        except UpstreamError as exc:
            reply.close()
            self._observer.upstream_call(route.name, time.monotonic() - started)
            await self._settle_unknown(request, operation, exc)
            raise _about(exc, request.key, State.UNKNOWN) from exc
        self._observer.upstream_call(route.name, time.monotonic() - started)
        self._inject_fault("after_response")

        if reply.status in route.release_statuses:
            await self._settle_not_sent(
                request,
                operation,
                f"the upstream refused the request with status {reply.status}",
                status=reply.status,
            )
            return _pass_through(reply, body, State.RELEASED, request.key)

        stored = StoredResponse(
            status=reply.status,
            headers=end_to_end(reply.headers, drop=_redactions(route)),
            body=body or b"",
        )
        recorded = await self._record_receipt(request, operation, stored, retained=body is not None)
        self._inject_fault("after_receipt")
        state = recorded.state if recorded is not None else State.IN_FLIGHT
        if body is None:
            return _pass_through(reply, None, state, request.key)
        reply.close()
        return Reply(
            status=reply.status, headers=reply.headers, body=body, state=state, key=request.key
        )

    # -- outcome writes (all fenced by the attempt's token) ----------------------

    async def _record_receipt(
        self, request: ProxyRequest, operation: Operation, stored: StoredResponse, *, retained: bool
    ) -> Operation | None:
        try:
            recorded = await self._timed_store(
                "complete",
                self._store.complete(
                    operation.id,
                    operation.token,
                    stored,
                    body_retained=retained,
                    retention_seconds=self._settings.retention,
                    tombstone_seconds=self._settings.tombstone_retention,
                    resolution=Resolution(by="upstream", at=time.time()),
                ),
            )
        except StoreUnavailable as exc:
            # The effect happened and the caller gets its answer; the record stays
            # in_flight, and its lease will expire into `unknown` for reconciliation.
            log.error("receipt for %s not recorded: %s", operation.id, exc.detail)
            return None
        if recorded is None:
            await self._stale(
                request,
                operation,
                Evidence(
                    at=time.time(),
                    source="upstream",
                    detail="late answer from the upstream; the attempt's token was stale",
                    status=stored.status,
                    body_sha256=hashlib.sha256(stored.body).hexdigest() if retained else None,
                ),
            )
            return await self._store.get_by_id(operation.id)
        return recorded

    async def _settle_not_sent(
        self, request: ProxyRequest, operation: Operation, detail: str, *, status: int | None = None
    ) -> None:
        evidence = Evidence(at=time.time(), source="gateway", detail=detail, status=status)
        released = await self._timed_store(
            "release",
            self._store.release(
                operation.id,
                operation.token,
                evidence,
                tombstone_seconds=self._settings.tombstone_retention,
            ),
        )
        if released is None:
            await self._stale(request, operation, evidence)

    async def _settle_unknown(
        self, request: ProxyRequest, operation: Operation, error: UpstreamError
    ) -> None:
        evidence = Evidence(at=time.time(), source="gateway", detail=error.detail)
        marked = await self._timed_store(
            "mark_unknown", self._store.mark_unknown(operation.id, operation.token, evidence)
        )
        if marked is None:
            await self._stale(request, operation, evidence)

    async def _stale(self, request: ProxyRequest, operation: Operation, evidence: Evidence) -> None:
        self._observer.stale_write(request.route.name)
        log.warning("stale write refused for %s (token %d)", operation.id, operation.token)
        await self._timed_store("add_evidence", self._store.add_evidence(operation.id, evidence))

    async def _timed_store(self, name: str, call: Awaitable[T]) -> T:
        started = time.monotonic()
        try:
            return await call
        finally:
            self._observer.store_call(name, time.monotonic() - started)

    def _inject_fault(self, window: str) -> None:
        """Test-only: die with SIGKILL in the named window (`testing.fault = "crash_<window>"`)."""
        if self._fault == "crash_" + window:
            os.kill(os.getpid(), signal.SIGKILL)


def answer_existing(operation: Operation, fingerprint: str, now: float) -> Reply:
    """Answer a request whose key is bound to an operation this caller does not hold."""
    key = operation.key
    if operation.fingerprint != fingerprint:
        raise KeyMismatch(
            "this key was first used with a different request (method, path, query or body)",
            key=key,
            state=operation.state.value,
            operation_id=operation.id,
        )
    if operation.state is State.COMPLETED:
        if operation.receipt_available(now):
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
            raise ReceiptNotRetained(
                "the first response was too large to keep; it was delivered once",
                key=key,
                state=operation.state.value,
                operation_id=operation.id,
            )
        raise ReceiptExpired(
            "the stored response has expired; the key stays used and is not forwarded again",
            key=key,
            state=operation.state.value,
            operation_id=operation.id,
        )
    if operation.state is State.UNKNOWN:
        raise OutcomeUnknown(
            "the first attempt may or may not have taken effect; resolve the operation",
            key=key,
            state=operation.state.value,
            operation_id=operation.id,
        )
    raise InProgress(
        "a request with this key is still in flight",
        key=key,
        state=operation.state.value,
        operation_id=operation.id,
        retry_after=1,
    )


def _with_forwarded_key(request: ProxyRequest, operation: Operation) -> Pairs:
    forward = request.route.forward_key
    if forward is False:
        return request.headers
    value = operation.id if forward == "operation_id" else request.key
    return (*request.headers, (IDEMPOTENCY_KEY, value))


def _redactions(route: RouteSettings) -> frozenset[str]:
    return frozenset(name.lower() for name in route.redact_response_headers)


def _pass_through(
    reply: UpstreamReply, body: bytes | None, state: State | None, key: str | None
) -> Reply:
    if body is not None:
        reply.close()
        return Reply(status=reply.status, headers=reply.headers, body=body, state=state, key=key)
    return Reply(
        status=reply.status,
        headers=reply.headers,
        body=b"",
        state=state,
        key=key,
        stream=reply.rest(),
        close=reply.close,
    )


def _about(error: UpstreamError, key: str, state: State) -> UpstreamError:
    error.key = key
    error.state = state.value
    return error


__all__ = [
    "IdempotencyEngine",
    "LifecycleObserver",
    "ProxyRequest",
    "Reply",
    "UpstreamConnectionLost",
    "UpstreamTimeout",
    "answer_existing",
]
