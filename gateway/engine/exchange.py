"""Values exchanged between the HTTP layer and the engine, and the engine's observer hooks.

Kept apart from `gateway.engine.engine` so the state machine module holds only
decisions, and so the HTTP layer can build and render these without pulling
in the engine.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, TypeVar

from gateway.engine.errors import GatewayError, StoreUnavailable
from gateway.engine.headers import without
from gateway.engine.models import State, StoredResponse

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.clock import Clock
    from gateway.engine.fairness import Hold
    from gateway.engine.headers import Pairs
    from gateway.engine.models import Operation
    from gateway.upstream.spool import Spool

T = TypeVar("T")


class UpstreamAnswer(Protocol):
    """An upstream answer whose status and headers have arrived; the body is read on demand.

    Reading raises `UpstreamTimeout` or `UpstreamConnectionLost` when the body
    does not arrive whole: the request was sent, so its effect is ambiguous.
    """

    status: int
    headers: Pairs

    async def read(self, limit: int) -> bytes | None:
        """The whole body, or `None` once it exceeds `limit` (what was read is kept)."""

    def rest(self) -> AsyncIterator[bytes]:
        """After `read` returned `None`: the bytes already read, then the remainder."""

    def close(self) -> None:
        """Give the connection back (or drop it); safe to call more than once."""


class Upstream(Protocol):
    """Where the engine sends requests and probes: `gateway.upstream.forwarder.Forwarder` in
    production, a scripted world in the simulation.

    `send` sends once and never retries; it raises `UpstreamUnreachable` only
    when it can prove nothing was sent (connect refused, DNS, TLS handshake),
    and `UpstreamTimeout` or `UpstreamConnectionLost` for anything after the
    first byte went out.
    """

    def gate(self, route: RouteSettings, scope: str) -> Hold:
        """A slot of the route held around one upstream call of `scope`
        (`gateway.engine.fairness.RouteSlots`); raises `RouteSaturated` when the route
        is full and `QuotaExceeded` when the scope holds its share while others wait."""

    async def send(
        self,
        route: RouteSettings,
        method: str,
        url: str,
        headers: Sequence[tuple[str, str]],
        body: bytes,
    ) -> UpstreamAnswer: ...


@dataclass(slots=True)
class RequestTrace:
    """What one request's log line reports; filled in by whoever learns each fact.

    Never holds a credential or a body: only the route, the key, the scope (a
    client name or an HMAC, logged as a short hash), the outcome and timings.
    """

    request_id: str
    route: str | None = None
    key: str | None = None
    scope: str | None = None
    operation_id: str | None = None
    attempt: int | None = None
    outcome: str | None = None
    state: str | None = None
    upstream_seconds: float | None = None
    error: str | None = None
    """What went wrong inside (a host, driver text): for the log line only."""
    problem: str | None = None
    """The problem type the request was answered with (`key-mismatch`), if one."""
    problem_status: int | None = None
    """That problem's status: an MCP refusal is a result inside a 200, and the key's
    request log says what it refused with."""

    def refused(self, error: GatewayError) -> None:
        """The request was answered with `error`'s problem."""
        self.problem = error.problem_type
        self.problem_status = error.status

    def saw(self, operation: Operation) -> None:
        """The operation this request is answered about (the log line and the span name it)."""
        self.operation_id = operation.id
        self.attempt = operation.attempts


@dataclass(frozen=True, slots=True)
class Receipt:
    """The upstream's answer to a protected call, to keep and replay."""

    stored: StoredResponse


@dataclass(frozen=True, slots=True)
class Released:
    """The upstream proved it did not process the call: the key is released and
    its answer passed on as it came."""

    status: int
    headers: Pairs
    body: bytes
    detail: str


AnswerOutcome = Receipt | Released


class Dialect(Protocol):
    """How a front end that is not plain HTTP sends a protected call and reads
    its answer (the MCP front end: the key goes in the JSON-RPC body, the
    receipt is one response inside a stream).

    `outcome` raises `UpstreamError` (`UpstreamTimeout`,
    `UpstreamConnectionLost`, `UpstreamCancelled`) when the answer cannot
    tell whether the call took effect: the engine then marks the operation
    `unknown`, with the error's detail as evidence.
    """

    send_method: str

    def body_for(self, forwarded_key: str | None) -> bytes:
        """The body to send, carrying the forwarded key where the protocol wants it."""

    async def outcome(self, answer: UpstreamAnswer) -> AnswerOutcome:
        """Read the answer (as far as needed) and say what it means."""


class ProxyRequest(NamedTuple):
    """A protected request a front end has parsed, scoped and fingerprinted.

    `method` and `path` are what the record shows (`tools/call` and the tool
    name on MCP routes); `wait_seconds` comes from `Prefer: wait=N`, already
    capped by `max_wait`. `dialect`, when set, sends the call and reads its
    answer instead of the plain HTTP exchange. `retention`, when set, replaces
    both the receipt and the tombstone retention (derived MCP keys), which
    also always forward the operation id (`forward_operation_id`).
    """

    route: RouteSettings
    upstream_url: str
    method: str
    path: str
    headers: Pairs
    body: bytes
    scope: str
    key: str
    fingerprint: str
    wait_seconds: float = 0.0
    trace: RequestTrace | None = None
    dialect: Dialect | None = None
    retention: float | None = None
    forward_operation_id: bool = False
    """Forward the operation id whatever the route's `forward_key` (derived MCP keys:
    the derived key names arguments, not an effect the caller chose)."""
    record: Callable[[], dict[str, Any] | None] | None = None
    """Builds the request as operators see it (`gateway.engine.recorded_request`): called
    only when a claim may bind a new key, never for a replay."""
    distinct: bool = False
    """Marked as a deliberate second effect (`Idempotency-Distinct: ?1`): never refused
    as the same request under a new key (`gateway.engine.twins`)."""
    derived: bool = False
    """The key was derived from the request (MCP `derive_key`): never refused as similar,
    since its fingerprint is its key."""
    legacy_fingerprint: str | None = None
    """The request's fingerprint in the form before version 2, keyed (HTTP routes;
    `gateway.engine.fingerprint`): a key bound under that form is the same request when
    this one matches it, and twins of that form are looked up by it too."""
    plain_fingerprints: tuple[str, ...] = ()
    """The request's fingerprints as a gateway before keyed fingerprints stored them
    (`gateway.engine.digests`): a replica of that version, still serving during a rolling
    upgrade, may bind a key with one; compared here, never stored or looked up."""

    def same_request(self, fingerprint: str) -> bool:
        """Whether a stored fingerprint, in any of its forms, is this request's."""
        return (
            fingerprint == self.fingerprint
            or fingerprint == self.legacy_fingerprint
            or fingerprint in self.plain_fingerprints
        )


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
    similar: str | None = None
    """The lookup URL of a completed operation with the same request under another key
    (`Idempotency-Similar`), on a live answer."""
    receipt_source: str | None = None
    """On a replay, who made the receipt (`Idempotency-Receipt-Source`): a probe's or an
    operator's status is theirs, not the tool's."""
    spool: Spool | None = None
    """Where `stream` comes from when the answer is spooled: the upstream is read by a
    task of its own, which ends (`Spool.when_ended`) with its last byte."""

    @classmethod
    def replay(cls, response: StoredResponse, key: str, source: str = "upstream") -> Reply:
        """A completed key's receipt, answered again, saying who made it
        (`Idempotency-Receipt-Source`): a probe's or an operator's status is theirs."""
        return cls(
            status=response.status,
            headers=response.headers,
            body=response.body,
            state=State.COMPLETED,
            key=key,
            replayed=True,
            receipt_source=source,
        )

    def holding(self, *releases: Callable[[], None]) -> Reply:
        """This reply, whose `close` also gives back what its stream holds (a route slot,
        a scope's count): an answer streamed after its handler returned still holds them."""
        closes = (self.close, *releases) if self.close is not None else releases

        def close() -> None:
            for release in closes:
                release()

        return replace(self, close=close)

    @classmethod
    def from_upstream(
        cls,
        reply: UpstreamAnswer,
        body: bytes | None,
        *,
        state: State | None = None,
        key: str | None = None,
    ) -> Reply:
        """An upstream answer as it came: whole when `body` was read, else streamed."""
        if body is not None:
            reply.close()
            return cls(status=reply.status, headers=reply.headers, body=body, state=state, key=key)
        return cls(
            status=reply.status,
            headers=reply.headers,
            body=b"",
            state=state,
            key=key,
            stream=reply.rest(),
            close=reply.close,
        )


class LifecycleObserver(Protocol):
    """Hooks the metrics layer implements; called on the event loop, must not block."""

    def store_call(self, operation: str, seconds: float) -> None: ...

    def store_error(self, operation: str) -> None: ...

    def upstream_call(self, route: str, seconds: float) -> None: ...

    def stale_write(self, route: str) -> None: ...

    def became_unknown(self, route: str, reason: str) -> None: ...

    def lease_expired(self, count: int) -> None: ...

    def probe_result(self, route: str, result: str) -> None: ...

    def late_answer(self, route: str, outcome: str) -> None:
        """An attempt's answer arrived after it lost its token: `completed_released`,
        `attached`, `possible_duplicate` (a newer attempt was sent) or `evidence`."""

    def resolved(self, by: str, outcome: str) -> None: ...


class StoreTimer:
    """Times the engine's store calls for the observer, and counts the failed ones.

    One instance is shared by the engine's parts, so every store call they
    make is reported the same way.
    """

    def __init__(self, observer: LifecycleObserver, clock: Clock) -> None:
        self._observer = observer
        self._clock = clock

    async def __call__(self, name: str, call: Awaitable[T]) -> T:
        started = self._clock.monotonic()
        try:
            return await call
        except StoreUnavailable:
            self._observer.store_error(name)
            raise
        finally:
            self._observer.store_call(name, self._clock.monotonic() - started)


def receipt_of(route: RouteSettings, answer: UpstreamAnswer, body: bytes) -> StoredResponse:
    """What a receipt keeps of an upstream answer: its status, its headers minus the
    route's redactions (`Set-Cookie` always), and `body`. One rule for the answers the
    engine records and the probe answers it adopts."""
    return StoredResponse(
        status=answer.status,
        headers=without(answer.headers, frozenset(route.redact_response_headers)),
        body=body,
    )


class NoObserver:
    """The observer for engines nobody watches (unit tests, tools)."""

    def store_call(self, operation: str, seconds: float) -> None:
        pass

    def store_error(self, operation: str) -> None:
        pass

    def upstream_call(self, route: str, seconds: float) -> None:
        pass

    def stale_write(self, route: str) -> None:
        pass

    def became_unknown(self, route: str, reason: str) -> None:
        pass

    def lease_expired(self, count: int) -> None:
        pass

    def probe_result(self, route: str, result: str) -> None:
        pass

    def late_answer(self, route: str, outcome: str) -> None:
        pass

    def resolved(self, by: str, outcome: str) -> None:
        pass


__all__ = [
    "LifecycleObserver",
    "NoObserver",
    "ProxyRequest",
    "Reply",
    "RequestTrace",
    "StoreTimer",
    "Upstream",
    "UpstreamAnswer",
    "receipt_of",
]
