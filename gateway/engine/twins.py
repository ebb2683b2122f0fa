"""The same request under a new key: which twin refuses a claim, decided once for every store.

An agent that lost its key (a crash before its journal was written, a model
that writes a fresh key each time) sends the same request again under a new
one; the key alone cannot tell that it is the same effect, the fingerprint
can. A store that is about to start a new attempt finds the key's *twin*
(another key's operation of the same scope and route with the same
fingerprint, whose current attempt began within the guard's window) and any
binding an earlier refusal left on the key, inside the claim's transaction,
and asks `refusing_twin` what they mean. The stores find; this module decides.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway.engine.errors import SimilarOperation
from gateway.engine.keys import operation_url
from gateway.engine.models import UNSETTLED, SimilarGuard, State

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.models import ClaimRequest, Operation

TWIN_STATES = (State.IN_FLIGHT, State.UNKNOWN, State.COMPLETED)
"""States in which an operation is anyone's twin: a released one applied nothing."""

_REFUSE = {"unsettled": UNSETTLED, "all": (*UNSETTLED, State.COMPLETED)}


def guard_for(
    route: RouteSettings, *, trusted_for: float, distinct: bool, derived: bool
) -> SimilarGuard | None:
    """The guard a claim on `route` carries; `None` when the route does not guard.

    `trusted_for` is how long this process has seen the store's clock keep
    pace with its own (`GraceClock.trusted_for`): a window longer than that
    cannot be vouched for, so every twin, however old it looks, is within it.
    A derived key is never refused (its fingerprint is its key) but still
    claims under the guard's lock, so that an explicit twin racing it sees it.

    >>> from gateway.config import RouteSettings
    >>> route = RouteSettings(name="t", prefix="/t", upstream="http://127.0.0.1:1")
    >>> guard_for(route, trusted_for=3600.0, distinct=False, derived=False).vouched
    True
    >>> guard_for(route, trusted_for=5.0, distinct=False, derived=False).vouched
    False
    """
    refuse = _REFUSE.get(route.similar_guard)
    window = route.similar_window
    if refuse is None or window <= 0:
        return None
    vouched = trusted_for >= window
    if derived:
        return SimilarGuard(window, refuse=(), derived=True, vouched=vouched)
    return SimilarGuard(window, refuse=refuse, distinct=distinct, vouched=vouched)


def is_twin(candidate: Operation, guard: SimilarGuard, now: float) -> bool:
    """Whether an operation of the same scope, route and fingerprint (another key) is a
    twin at store time `now`: not released or forgotten, its attempt within the window."""
    return (
        candidate.state in TWIN_STATES
        and (candidate.forgotten_at is None or candidate.forgotten_at > now)
        and guard.within(candidate.sent_at, now)
    )


BINDING_SWEEP_SLACK = 86400.0
"""How long past its window a refused key's binding is kept before the sweep drops it: a
binding judged by a process that cannot vouch for the store's clock outlives its window."""


def twin_order(candidate: Operation, guard: SimilarGuard) -> tuple[bool, float]:
    """Sort key, largest first: a twin that refuses before one that does not, then the
    latest attempt (`Idempotency-Similar` names the latest completed one)."""
    return (candidate.state in guard.refuse, candidate.sent_at or 0.0)


def refusing_twin(
    guard: SimilarGuard, *, bound: Operation | None, twin: Operation | None
) -> Operation | None:
    """The operation that refuses the claim, or `None` to claim.

    `bound` is the twin a refusal of this key (same request, within the
    window) named: the key keeps being refused in its name, whatever that
    operation's state now, so an agent that retries the refused key after the
    twin completed does not make the second effect. `twin` is the best twin
    found (`twin_order`). A request marked distinct is never refused.
    """
    if guard.distinct or guard.derived:
        return None
    if bound is not None:
        return bound
    if twin is not None and twin.state in guard.refuse:
        return twin
    return None


def noted_twin(guard: SimilarGuard, twin: Operation | None) -> Operation | None:
    """The twin a claim that went ahead names: the one the distinct marker went past
    (both histories note the other), or a completed one (`Idempotency-Similar`)."""
    if twin is None or guard.derived:
        return None
    if guard.distinct:
        return twin
    return twin if twin.state is State.COMPLETED else None


def distinct_of(request: ClaimRequest, twin: Operation | None) -> str | None:
    """The twin's id when the claim is marked distinct beside it: its `claimed` event
    says `distinct_from`, and the twin's history gets a `distinct-twin` event."""
    guard = request.similar
    if twin is None or guard is None or not guard.distinct:
        return None
    return twin.id


def similar_refusal(key: str, twin: Operation) -> SimilarOperation:
    """The 409 for a claim `twin` refused: it names the twin, which is what to settle.

    It says what to do without a way around it: the distinct marker is for the
    people who write agents, not for a caller that may be a model.
    """
    waiting = "is still in flight" if twin.state is State.IN_FLIGHT else f"is {twin.state.value}"
    error = SimilarOperation(
        f"the same request {waiting} under key {twin.key!r}; nothing was recorded or sent "
        "for this key. Settle that operation first: look it up, wait for its outcome, or "
        "have it resolved",
        key=key,
    )
    error.extensions["similar_operation"] = {
        "key": twin.key,
        "state": twin.state.value,
        "operation": operation_url(twin.key),
        "operation_id": twin.id,
    }
    return error
