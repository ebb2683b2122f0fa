"""The gateway's one exception tree.

Every error the gateway can answer with is a subclass of `GatewayError` that
carries its HTTP status, its problem type (the last path segment of the RFC 9457
`type` URI), its title and whether the agent may safely send the same request
again. One middleware renders all of them; foreign exceptions (HTTP client
errors, driver errors, timeouts) are translated into these at the edge where
they occur.

    GatewayError
    ├── ConfigError                  (not an HTTP answer: refuses to start)
    ├── BadRequest
    │   ├── MissingKey               400 missing-key
    │   ├── InvalidKey               400 invalid-key
    │   ├── InvalidRequest           400 invalid-request
    │   ├── PayloadTooLarge          413 payload-too-large
    │   └── RequestTimeout           408 request-timeout
    ├── MissingCredentials           401 missing-credentials
    ├── Unauthorized                 401 unauthorized
    ├── ClientNotAllowed             403 client-not-allowed
    ├── NotFound
    │   ├── NoRoute                  404 no-route
    │   └── UnknownKey               404 unknown-key
    ├── MethodNotAllowed             405 method-not-allowed
    ├── KeyConflict                  (409/422: the key is taken)
    │   ├── KeyMismatch              422 key-mismatch
    │   │   └── KeyMismatchUnsettled 422 key-mismatch-unsettled
    │   ├── InProgress               409 in-progress
    │   ├── OutcomeUnknown           409 outcome-unknown
    │   ├── ReceiptExpired           409 receipt-expired
    │   ├── ReceiptNotRetained       409 receipt-not-retained
    │   ├── NotResolvable            409 not-resolvable
    │   ├── TooEarly                 409 too-early
    │   └── SimilarOperation         409 similar-operation
    ├── PreconditionFailed           412 precondition-failed
    ├── QuotaExceeded                429 quota-exceeded
    ├── StoreUnavailable             503 store-unavailable
    ├── RouteSaturated               503 route-saturated
    ├── LeaseLost                    503 lease-lost
    ├── UnsupportedTransferCoding    501 unsupported-transfer-coding
    └── UpstreamError
        ├── UpstreamUnreachable      502 upstream-unreachable
        ├── UpstreamTimeout          504 upstream-timeout
        ├── UpstreamConnectionLost   502 upstream-connection-lost
        └── UpstreamCancelled        409 outcome-unknown (an OutcomeUnknown too)
"""

from __future__ import annotations

from typing import ClassVar, Literal, Self

PROBLEM_BASE_URI = "https://idempotency-gateway.dev/problems/"

NextAction = Literal["retry", "wait", "reconcile", "fix-request", "stop"]
"""The one thing an agent should do after a problem, the same for every problem of a type:

- `retry`: send the same request with the same key (after `Retry-After`);
- `wait`: the first attempt (or the tool) is still at work: ask again later;
- `reconcile`: the outcome is unknown or its answer is gone: look it up, settle it,
  never resend;
- `fix-request`: the request itself is wrong; a changed request is a new effect;
- `stop`: the gateway will not serve this caller here (configuration, credentials).
"""


class GatewayError(Exception):
    """Base of every error the gateway answers with.

    >>> err = KeyMismatch("the key was first used with another request", key="k1")
    >>> (err.status, err.problem_type, err.safe_to_retry)
    (422, 'key-mismatch', False)
    """

    status: ClassVar[int] = 500
    problem_type: ClassVar[str] = "internal-error"
    next_action: ClassVar[NextAction] = "reconcile"
    title: ClassVar[str] = "Internal gateway error"
    safe_to_retry: bool | None = None
    """The class's default; `about` adjusts it to the record's actual state."""

    def __init__(
        self,
        detail: str,
        *,
        key: str | None = None,
        state: str | None = None,
        operation_id: str | None = None,
        retry_after: float | None = None,
        internal: str | None = None,
    ) -> None:
        super().__init__(detail)
        self.detail = detail
        self.internal = internal
        """What only the operator may read (a host, an address, driver or SQL text):
        logged with the request, never put in the caller's problem."""
        self.key = key
        self.state = state
        self.operation_id = operation_id
        self.retry_after = retry_after
        self.extensions: dict[str, object] = {}
        """More members of the problem document (RFC 9457 extensions) for this type."""

    def about(self, key: str, state: str, operation_id: str) -> Self:
        """Tie the error to the operation this attempt claimed, and to the state its
        record is in after the write.

        The state is the record's, not the one the failed attempt meant to
        leave: a retry of an `unknown` key can never be safe, whatever happened
        to this attempt, and any other state answers a retry safely (a replay,
        a wait, or a fresh attempt).
        """
        self.key = key
        self.state = state
        self.operation_id = operation_id
        self.safe_to_retry = state != "unknown"
        return self

    def concerning(self, key: str | None) -> Self:
        """Name the caller's key on a refusal that came before any record of it (a body
        too large or too slow, a quota, a saturated route, a store that is down).

        The answer then carries the key (`Idempotency-Key`, the problem's `key` and
        lookup URL) like every answer about a key; with no record there is no state.
        An error already tied to an operation keeps what `about` said.
        """
        if self.key is None:
            self.key = key
        return self

    @property
    def type_uri(self) -> str:
        return PROBLEM_BASE_URI + self.problem_type

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.detail!r}, key={self.key!r}, state={self.state!r})"


class ConfigError(GatewayError):
    """The configuration is invalid; the message names the key and the bad value."""

    problem_type = "invalid-config"
    next_action: ClassVar[NextAction] = "stop"
    title = "Invalid configuration"


class BadRequest(GatewayError):
    status = 400
    problem_type = "bad-request"
    next_action: ClassVar[NextAction] = "fix-request"
    title = "Bad request"
    safe_to_retry = False


class MissingKey(BadRequest):
    problem_type = "missing-key"
    title = "Idempotency-Key header required"


class InvalidKey(BadRequest):
    problem_type = "invalid-key"
    title = "Invalid Idempotency-Key header"


class InvalidRequest(BadRequest):
    problem_type = "invalid-request"
    title = "Invalid request"


class PayloadTooLarge(BadRequest):
    status = 413
    problem_type = "payload-too-large"
    title = "Request body too large"


class RequestTimeout(BadRequest):
    status = 408
    problem_type = "request-timeout"
    next_action: ClassVar[NextAction] = "retry"
    title = "The request body did not arrive in time; nothing was recorded"
    safe_to_retry = True


class MissingCredentials(GatewayError):
    """None of the scope headers came, and the config shares no anonymous scope."""

    status = 401
    problem_type = "missing-credentials"
    next_action: ClassVar[NextAction] = "stop"
    title = "Credentials required"
    safe_to_retry = False


class Unauthorized(GatewayError):
    status = 401
    problem_type = "unauthorized"
    next_action: ClassVar[NextAction] = "stop"
    title = "Missing or invalid credentials"
    safe_to_retry = False


class RoleForbidden(GatewayError):
    """A named admin token whose role may not do this (`[[admin.tokens]]` `role`)."""

    status = 403
    problem_type = "role-forbidden"
    next_action: ClassVar[NextAction] = "stop"
    title = "This admin token's role may not do this"
    safe_to_retry = False


class ClientNotAllowed(GatewayError):
    """The route's `clients` list does not name the caller's client."""

    status = 403
    problem_type = "client-not-allowed"
    next_action: ClassVar[NextAction] = "stop"
    title = "This client may not use the route"
    safe_to_retry = False


class NotFound(GatewayError):
    status = 404
    problem_type = "not-found"
    next_action: ClassVar[NextAction] = "stop"
    title = "Not found"
    safe_to_retry = False


class NoRoute(NotFound):
    problem_type = "no-route"
    title = "No route matches this path"


class UnknownKey(NotFound):
    problem_type = "unknown-key"
    next_action: ClassVar[NextAction] = "retry"
    title = "No operation with this key in this scope"


class MethodNotAllowed(GatewayError):
    status = 405
    problem_type = "method-not-allowed"
    next_action: ClassVar[NextAction] = "fix-request"
    title = "Method not allowed"
    safe_to_retry = False

    def __init__(self, detail: str, *, allow: str = "") -> None:
        super().__init__(detail)
        self.allow = allow


class KeyConflict(GatewayError):
    """The key is already bound to an operation that forbids forwarding this request."""

    status = 409
    safe_to_retry = False


class KeyMismatch(KeyConflict):
    status = 422
    problem_type = "key-mismatch"
    next_action: ClassVar[NextAction] = "fix-request"
    title = "Idempotency-Key reused with a different request"


class KeyMismatchUnsettled(KeyMismatch):
    """The key's operation is `in_flight` or `unknown`: the earlier call may have happened.

    A plain `key-mismatch` says "fix the request, then it is a new effect under a
    new key". Said while the first call's outcome is open, that advice makes a
    second effect when the two requests meant the same thing (an agent that
    re-serialised its arguments in a way the fingerprint still tells apart). So
    this one says `reconcile`: settle the earlier call first.
    """

    problem_type = "key-mismatch-unsettled"
    next_action: ClassVar[NextAction] = "reconcile"
    title = "Idempotency-Key reused with a different request while its first call is unsettled"


class InProgress(KeyConflict):
    problem_type = "in-progress"
    next_action: ClassVar[NextAction] = "wait"
    title = "A request with this key is still in flight"
    safe_to_retry = True


class OutcomeUnknown(KeyConflict):
    problem_type = "outcome-unknown"
    next_action: ClassVar[NextAction] = "reconcile"
    title = "The outcome of the request with this key is unknown"


class ReceiptExpired(KeyConflict):
    problem_type = "receipt-expired"
    next_action: ClassVar[NextAction] = "reconcile"
    title = "The stored response for this key has expired"


class ReceiptNotRetained(KeyConflict):
    problem_type = "receipt-not-retained"
    next_action: ClassVar[NextAction] = "reconcile"
    title = "The response for this key was not kept"


class NotResolvable(KeyConflict):
    problem_type = "not-resolvable"
    next_action: ClassVar[NextAction] = "stop"
    title = "Only an operation whose outcome is unknown can be resolved"


class TooEarly(KeyConflict):
    """A `not_applied` resolve while the tool may still be applying the last send.

    Releasing the key then lets the agent's retry be sent while the first send
    may still land: two effects. `allowed_at` (and `Retry-After`) say when
    the release is accepted; an admin may `force` it sooner, on the record.
    """

    problem_type = "too-early"
    next_action: ClassVar[NextAction] = "wait"
    title = "The last send may still be applied; it is too early to release"
    safe_to_retry = True
    """The same resolve again after `Retry-After`: nothing was changed by this one."""


class SimilarOperation(KeyConflict):
    """A new key for the same request as an `in_flight` or `unknown` operation of the scope.

    The caller most likely lost the key of its first attempt: sending this one
    could be a second effect. Nothing is recorded for the new key; the problem
    names the other operation (`similar_operation`), which is what to settle.
    """

    problem_type = "similar-operation"
    title = "The same request is already in flight or unknown under another key"
    next_action: ClassVar[NextAction] = "reconcile"


class PreconditionFailed(GatewayError):
    status = 412
    problem_type = "precondition-failed"
    next_action: ClassVar[NextAction] = "fix-request"
    title = "The operation changed since it was read"
    safe_to_retry = False


class QuotaExceeded(GatewayError):
    status = 429
    problem_type = "quota-exceeded"
    next_action: ClassVar[NextAction] = "retry"
    title = "This client is over one of its quotas; nothing was recorded"
    safe_to_retry = True


STORE_DOWN = "the operation store did not answer; retry the same request later"
"""The public detail of every store failure; the driver's own words go to the log."""


class StoreUnavailable(GatewayError):
    status = 503
    problem_type = "store-unavailable"
    next_action: ClassVar[NextAction] = "retry"
    title = "The operation store is unavailable; nothing was forwarded"
    safe_to_retry = True


class RouteSaturated(GatewayError):
    status = 503
    problem_type = "route-saturated"
    next_action: ClassVar[NextAction] = "retry"
    title = "The route is at its concurrency limit; nothing was forwarded"
    safe_to_retry = True


class LeaseLost(GatewayError):
    """The gateway was paused past its lease before sending; it sent nothing and released."""

    status = 503
    problem_type = "lease-lost"
    next_action: ClassVar[NextAction] = "retry"
    title = "The gateway lost its lease before sending; nothing was forwarded"
    safe_to_retry = True


class UnsupportedTransferCoding(GatewayError):
    """RFC 9112 6.1: a transfer coding the gateway cannot undo is refused, not passed on."""

    status = 501
    problem_type = "unsupported-transfer-coding"
    next_action: ClassVar[NextAction] = "fix-request"
    title = "The request's Transfer-Encoding is not supported; only chunked is"
    safe_to_retry = False


class UpstreamError(GatewayError):
    status = 502
    problem_type = "upstream-error"
    next_action: ClassVar[NextAction] = "reconcile"
    title = "Upstream error"


class UpstreamUnreachable(UpstreamError):
    problem_type = "upstream-unreachable"
    next_action: ClassVar[NextAction] = "retry"
    title = "The upstream could not be reached; the request was not sent"
    safe_to_retry = True


class UpstreamTimeout(UpstreamError):
    status = 504
    problem_type = "upstream-timeout"
    title = "The upstream did not answer in time; the outcome is unknown"
    safe_to_retry = False


class UpstreamConnectionLost(UpstreamError):
    problem_type = "upstream-connection-lost"
    title = "The upstream connection was lost before a complete answer; the outcome is unknown"
    safe_to_retry = False


class UpstreamCancelled(UpstreamError, OutcomeUnknown):
    """The upstream answered that it cancelled the call (MCP's `-32800`).

    The answer is complete but says nothing of the effect, which the tool may
    have applied before the cancellation: the key becomes `unknown`, as for
    any upstream failure after sending (hence an `UpstreamError`, which the
    engine records so). It was neither a timeout nor a lost connection, so
    the problem is the one that names what it leaves: `outcome-unknown`.
    """

    status = 409
    problem_type = OutcomeUnknown.problem_type
    title = OutcomeUnknown.title
    safe_to_retry = False
