"""Everything this package raises, in one tree.

Gateway answers that are RFC 9457 problems become `GatewayProblem` subclasses
chosen by the problem type (the last path segment of the `type` URI); a type
this client does not know becomes a plain `GatewayProblem`, so a newer gateway
never breaks an older client. Each problem keeps every field the gateway sent,
and says what to do next (`next_action`) when the gateway did.

    GatewayClientError
    ├── KeyFormatError                 (also ValueError) derive_key refused a part
    ├── GatewayConnectionError         the gateway could not be reached or its answer was lost
    ├── GatewayProblem                 any problem+json answer from the gateway
    │   ├── BadRequest
    │   │   ├── MissingKey             400 missing-key
    │   │   ├── InvalidKey             400 invalid-key
    │   │   ├── InvalidRequest         400 invalid-request
    │   │   ├── PayloadTooLarge        413 payload-too-large
    │   │   └── RequestTimeout         408 request-timeout (the body came too slowly; safe)
    │   ├── Unauthorized               401 unauthorized
    │   │   └── MissingCredentials     401 missing-credentials (no scope credential sent)
    │   ├── ClientNotAllowed           403 client-not-allowed (the route names other clients)
    │   ├── RoleForbidden              403 role-forbidden (an admin token's role may not do it)
    │   ├── NotFound
    │   │   ├── NoRoute                404 no-route
    │   │   └── UnknownKey             404 unknown-key
    │   ├── MethodNotAllowed           405 method-not-allowed
    │   ├── KeyConflict                (the key is taken)
    │   │   ├── KeyMismatch            422 key-mismatch
    │   │   │   └── KeyMismatchUnsettled 422 key-mismatch-unsettled: the first call may have run
    │   │   ├── InProgress             409 in-progress
    │   │   ├── ReceiptExpired         409 receipt-expired
    │   │   ├── ReceiptNotRetained     409 receipt-not-retained
    │   │   ├── NotResolvable          409 not-resolvable
    │   │   ├── TooEarly               409 too-early: a not_applied resolve before `allowed_at`
    │   │   └── SimilarOperation       409 similar-operation: the same request under another key
    │   ├── OutcomeUnknown             409 outcome-unknown: stop, reconcile, never resend
    │   │   ├── UpstreamTimeout        504 upstream-timeout
    │   │   └── UpstreamConnectionLost 502 upstream-connection-lost
    │   ├── PreconditionFailed         412 precondition-failed
    │   ├── QuotaExceeded              429 quota-exceeded (nothing recorded; safe to retry)
    │   ├── Unavailable                (nothing was forwarded; safe to retry)
    │   │   ├── StoreUnavailable       503 store-unavailable
    │   │   ├── RouteSaturated         503 route-saturated
    │   │   └── LeaseLost              503 lease-lost
    │   └── UpstreamUnreachable        502 upstream-unreachable (not sent; safe to retry)
    ├── ReconciliationRequired         a run's call may or may not have happened: stop
    ├── CallUnconfirmed                a call's answer could not be read (MCP); look the key up
    └── JournalError
        ├── JournalCorrupt             the journal cannot be read
        ├── IncompatibleJournal        another flow version, run id or journal format
        ├── RunLeased                  another live worker holds the run
        └── RunLeaseLost               this worker was fenced out by a newer lease
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from idempotency_gateway_client._models import SimilarTwin

if TYPE_CHECKING:
    from idempotency_gateway_client._models import Operation

__all__ = [
    "BadRequest",
    "CallUnconfirmed",
    "ClientNotAllowed",
    "GatewayClientError",
    "GatewayConnectionError",
    "GatewayProblem",
    "InProgress",
    "IncompatibleJournal",
    "InvalidKey",
    "InvalidRequest",
    "JournalCorrupt",
    "JournalError",
    "KeyConflict",
    "KeyFormatError",
    "KeyMismatch",
    "KeyMismatchUnsettled",
    "LeaseLost",
    "MethodNotAllowed",
    "MissingCredentials",
    "MissingKey",
    "NoRoute",
    "NotFound",
    "NotResolvable",
    "OutcomeUnknown",
    "PayloadTooLarge",
    "PreconditionFailed",
    "QuotaExceeded",
    "ReceiptExpired",
    "ReceiptNotRetained",
    "ReconciliationRequired",
    "RequestTimeout",
    "RoleForbidden",
    "RouteSaturated",
    "RunLeaseLost",
    "RunLeased",
    "SimilarOperation",
    "StoreUnavailable",
    "TooEarly",
    "Unauthorized",
    "Unavailable",
    "UnknownKey",
    "UpstreamConnectionLost",
    "UpstreamTimeout",
    "UpstreamUnreachable",
]


class GatewayClientError(Exception):
    """Base of every exception this package raises."""


class KeyFormatError(GatewayClientError, ValueError):
    """A key part the gateway would refuse, caught before anything is sent.

    >>> derive_key("run:7", 0, "c1")
    Traceback (most recent call last):
    KeyFormatError: run_id may not contain ':' ...
    """


class GatewayConnectionError(GatewayClientError):
    """The gateway could not be reached, or the connection broke before its answer arrived.

    With a key this is safe to retry: the gateway finishes what it started and
    the retry gets the receipt (or `in-progress`, or `outcome-unknown`).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key
        self.safe_to_retry = key is not None


class GatewayProblem(GatewayClientError):
    """An RFC 9457 problem answered by the gateway, with every field it carried.

    >>> try:
    ...     await client.request("POST", "/tickets/v1/issues", key=key, json={"title": "x"})
    ... except GatewayProblem as problem:
    ...     problem.status, problem.problem_type, problem.safe_to_retry, problem.next_action
    (422, 'key-mismatch', False, 'fix-request')

    `next_action` is the one thing to do after a problem of this type, as the
    gateway says it: `retry` (the same request, same key, after `retry_after`),
    `wait` (still at work: ask again later), `reconcile` (look the operation up
    and settle it; never resend), `fix-request` (the request is wrong; a changed
    one is a new effect) or `stop`. None when the body has none (an older
    gateway): it is read, never guessed from the type.
    """

    problem_type: ClassVar[str] = ""

    def __init__(
        self,
        problem: dict[str, Any],
        *,
        status: int,
        retry_after: float | None = None,
    ) -> None:
        self.problem = problem
        self.status = status
        self.title: str = str(problem.get("title", ""))
        self.detail: str = str(problem.get("detail", ""))
        self.type_uri: str = str(problem.get("type", ""))
        self.key: str | None = _optional_str(problem.get("key"))
        self.state: str | None = _optional_str(problem.get("state"))
        self.operation: str | None = _optional_str(problem.get("operation"))
        safe = problem.get("safe_to_retry")
        self.safe_to_retry: bool | None = safe if isinstance(safe, bool) else None
        self.next_action: str | None = _optional_str(problem.get("next_action"))
        self.retry_after = retry_after
        super().__init__(f"{status} {self.kind}: {self.detail or self.title}")

    @property
    def kind(self) -> str:
        """The problem type as the gateway sent it (also for types this client does not know)."""
        return self.type_uri.rstrip("/").rsplit("/", 1)[-1] or self.problem_type

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(status={self.status}, problem_type={self.kind!r}, "
            f"key={self.key!r}, state={self.state!r}, safe_to_retry={self.safe_to_retry!r}, "
            f"next_action={self.next_action!r})"
        )


def _optional_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


class BadRequest(GatewayProblem):
    problem_type = "bad-request"


class MissingKey(BadRequest):
    problem_type = "missing-key"


class InvalidKey(BadRequest):
    problem_type = "invalid-key"


class InvalidRequest(BadRequest):
    problem_type = "invalid-request"


class PayloadTooLarge(BadRequest):
    problem_type = "payload-too-large"


class RequestTimeout(BadRequest):
    """The request body did not arrive in time; nothing was recorded."""

    problem_type = "request-timeout"


class Unauthorized(GatewayProblem):
    problem_type = "unauthorized"


class MissingCredentials(Unauthorized):
    """No scope credential was sent, and the gateway does not let callers share one scope."""

    problem_type = "missing-credentials"


class ClientNotAllowed(GatewayProblem):
    """This client may not use the route (`clients = [...]` on the route names others)."""

    problem_type = "client-not-allowed"


class RoleForbidden(GatewayProblem):
    """A named admin token whose role may not do this (the admin API)."""

    problem_type = "role-forbidden"


class NotFound(GatewayProblem):
    problem_type = "not-found"


class NoRoute(NotFound):
    problem_type = "no-route"


class UnknownKey(NotFound):
    problem_type = "unknown-key"


class MethodNotAllowed(GatewayProblem):
    problem_type = "method-not-allowed"


class KeyConflict(GatewayProblem):
    """The key is bound to an operation that forbids forwarding this request."""


class KeyMismatch(KeyConflict):
    """The key was first used with a different request; a new effect needs a new key."""

    problem_type = "key-mismatch"


class KeyMismatchUnsettled(KeyMismatch):
    """The key was first used with a different request whose call may have happened; reconcile.

    That first call is still `in_flight` or `unknown`. If both requests meant the same
    effect, sending this one under a new key could make it twice: settle the key's first
    call before anything else (`Run` stops with `ReconciliationRequired`, as on an unknown
    outcome). An `except KeyMismatch` catches it too: test for this class first.
    """

    problem_type = "key-mismatch-unsettled"


class InProgress(KeyConflict):
    """An attempt with this key is still in flight (raised once the client's wait is spent)."""

    problem_type = "in-progress"


class ReceiptExpired(KeyConflict):
    """The effect happened, but its stored response is gone; never resend."""

    problem_type = "receipt-expired"


class ReceiptNotRetained(KeyConflict):
    """The effect happened, but its response was too large to keep; never resend."""

    problem_type = "receipt-not-retained"


class NotResolvable(KeyConflict):
    """Only an `unknown` operation can be resolved."""

    problem_type = "not-resolvable"


class TooEarly(KeyConflict):
    """A `not_applied` resolve while the tool may still be applying the last send.

    Releasing the key now would let a retry be sent while the first send may
    still land: two effects. The operation stays `unknown`. Check the tool
    again at `allowed_at` (an ISO 8601 time; `retry_after` is the same
    instant in seconds from the answer) and resolve then; `last_send_age` is
    how long ago, in seconds, the last send was.
    """

    problem_type = "too-early"

    def __init__(
        self,
        problem: dict[str, Any],
        *,
        status: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(problem, status=status, retry_after=retry_after)
        self.allowed_at: str | None = _optional_str(problem.get("allowed_at"))
        age = problem.get("last_send_age")
        self.last_send_age: float | None = (
            float(age) if isinstance(age, int | float) and not isinstance(age, bool) else None
        )


class SimilarOperation(KeyConflict):
    """The gateway refused a new key whose request is the same as another key's operation.

    Most likely the key of a first attempt was lost (a crash before the journal
    was written, a key made afresh). Nothing was sent. `similar_operation` names
    that other operation (the twin: its key, state, lookup path and id), which
    is the one to settle; the refused key stays bound to it for the route's
    `similar_window`, so repeating it gets this same refusal. `Run` stops on a
    twin whose outcome is `unknown` and otherwise takes the twin's key over.
    """

    problem_type = "similar-operation"

    def __init__(
        self,
        problem: dict[str, Any],
        *,
        status: int,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(problem, status=status, retry_after=retry_after)
        self.similar_operation: SimilarTwin | None = SimilarTwin.from_document(
            problem.get("similar_operation")
        )


class OutcomeUnknown(GatewayProblem):
    """The effect may or may not have happened: stop and reconcile; never resend."""

    problem_type = "outcome-unknown"


class UpstreamTimeout(OutcomeUnknown):
    """Sent, but no complete answer in time; the key is now `unknown`."""

    problem_type = "upstream-timeout"


class UpstreamConnectionLost(OutcomeUnknown):
    """Sent, but the connection broke before a complete answer; the key is now `unknown`."""

    problem_type = "upstream-connection-lost"


class PreconditionFailed(GatewayProblem):
    """The operation changed since the lookup whose ETag was sent."""

    problem_type = "precondition-failed"


class QuotaExceeded(GatewayProblem):
    """This client is over one of its quotas; nothing was recorded (see `retry_after`)."""

    problem_type = "quota-exceeded"


class Unavailable(GatewayProblem):
    """Nothing was recorded or forwarded; the same request with the same key may be resent."""


class StoreUnavailable(Unavailable):
    problem_type = "store-unavailable"


class RouteSaturated(Unavailable):
    problem_type = "route-saturated"


class LeaseLost(Unavailable):
    problem_type = "lease-lost"


class UpstreamUnreachable(GatewayProblem):
    """The upstream could not be reached; nothing was sent and the key is released."""

    problem_type = "upstream-unreachable"


class ReconciliationRequired(GatewayClientError):
    """A run's call may have taken effect, and no receipt says what it returned.

    The run stops here. Settle the key (a route probe, `GatewayClient.resolve`,
    or an operator), then resume: the next lookup finds the settled state.
    `problem` is the gateway's answer when there was one; a `KeyMismatchUnsettled`
    says the key's first call, of another request, may have happened, and it is
    that call to settle. When the gateway refused the call as the same request as
    another key's operation (`SimilarOperation`), `similar_operation` names that
    twin: settle the twin, not `key`, which was never sent.
    """

    def __init__(
        self,
        message: str,
        *,
        key: str,
        call_id: str,
        operation: Operation | None = None,
        problem: GatewayProblem | None = None,
        similar_operation: SimilarTwin | None = None,
    ) -> None:
        super().__init__(message)
        self.key = key
        self.call_id = call_id
        self.operation = operation
        self.problem = problem
        self.similar_operation = similar_operation


class CallUnconfirmed(GatewayClientError):
    """A call may have reached the gateway, and what came back is no answer this client can read.

    An MCP session raises the SDK's `MCPError` alike for a server's JSON-RPC
    error answer (which the gateway keeps as the receipt), a read timeout and
    a lost stream; only the gateway knows which it was. `Run` therefore looks
    the key up at once and records the receipt it finds; it raises this when
    the gateway has none to give (nothing recorded, the key released, or
    still in flight past `settle_timeout`). The call then has no result, and
    the next `resume()` looks it up again before sending. The SDK's error is
    the `__cause__`.
    """

    def __init__(self, message: str, *, key: str, call_id: str) -> None:
        super().__init__(message)
        self.key = key
        self.call_id = call_id


class JournalError(GatewayClientError):
    """The run journal refuses this worker or this run."""


class JournalCorrupt(JournalError):
    """The journal exists but cannot be read as a journal."""


class IncompatibleJournal(JournalError):
    """The journal was written for another flow version, another run or another format."""


class RunLeased(JournalError):
    """Another live worker holds the run; this one must not advance it."""

    def __init__(self, message: str, *, holder: str, token: int, expires_at: float) -> None:
        super().__init__(message)
        self.holder = holder
        self.token = token
        self.expires_at = expires_at


class RunLeaseLost(JournalError):
    """A newer lease (a higher fencing token) took the run over; this worker must stop."""

    def __init__(self, message: str, *, holder: str | None, token: int | None) -> None:
        super().__init__(message)
        self.holder = holder
        self.token = token


PROBLEM_CLASSES: dict[str, type[GatewayProblem]] = {
    cls.problem_type: cls
    for cls in (
        BadRequest,
        MissingKey,
        InvalidKey,
        InvalidRequest,
        PayloadTooLarge,
        RequestTimeout,
        Unauthorized,
        MissingCredentials,
        ClientNotAllowed,
        RoleForbidden,
        NoRoute,
        NotFound,
        UnknownKey,
        MethodNotAllowed,
        KeyMismatch,
        KeyMismatchUnsettled,
        InProgress,
        ReceiptExpired,
        ReceiptNotRetained,
        NotResolvable,
        TooEarly,
        SimilarOperation,
        OutcomeUnknown,
        UpstreamTimeout,
        UpstreamConnectionLost,
        PreconditionFailed,
        QuotaExceeded,
        StoreUnavailable,
        RouteSaturated,
        LeaseLost,
        UpstreamUnreachable,
    )
}
"""Problem type -> exception class; a type not listed maps to `GatewayProblem` itself."""
