"""Values the core passes around: operations, receipts, claims.

These are frozen dataclasses, not pydantic models: they never cross the wire
as-is (the HTTP layer renders them), and the hot path creates one or two of them
per request, so they stay plain and cheap. Times are POSIX seconds on the
store's clock.
"""

from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, NamedTuple

if TYPE_CHECKING:
    from gateway.engine.history import NewEvent


class State(enum.StrEnum):
    """Where an operation stands. The transitions live in `gateway.engine`."""

    IN_FLIGHT = "in_flight"
    COMPLETED = "completed"
    UNKNOWN = "unknown"
    RELEASED = "released"


Headers = tuple[tuple[str, str], ...]
"""Header pairs in order, repeated names kept: a replay must match byte for byte."""

ResolvedBy = Literal["upstream", "probe", "owner", "admin"]


@dataclass(frozen=True, slots=True)
class ReplayableReceipt:
    """What a retry of a completed key is answered from, and nothing more.

    A replay is the hottest read the gateway makes: it needs the receipt and
    the fingerprint to compare, not the operation's whole story (evidence,
    resolution, times), so the store reads and decodes only these.
    """

    operation_id: str
    attempts: int
    fingerprint: str
    response: StoredResponse
    source: str = "upstream"
    """Who made the receipt (`RECEIPT_SOURCES`): said to the retry, whose status is then
    the probe's or the operator's, not the tool's."""


RECEIPT_SOURCES = {
    "upstream": "upstream",
    "probe": "probe",
    "owner": "operator",
    "admin": "operator",
}
"""Who made a completed operation's receipt, by its resolution's `by`: the tool's own
answer, a probe's answer (a lookup's status: 200 where the tool's create said 201), or an
operator's statement."""


@dataclass(frozen=True, slots=True)
class StoredResponse:
    """An upstream answer as the gateway keeps it (hop-by-hop and redacted headers removed).

    >>> StoredResponse(201, (("content-type", "application/json"),), b"{}").status
    201
    """

    status: int
    headers: Headers
    body: bytes


@dataclass(frozen=True, slots=True)
class Evidence:
    """What a writer learned after it lost the right to write it (stale token, late probe).

    Kept on the operation so whoever reconciles sees every fact, even the ones
    that arrived too late to decide anything.
    """

    at: float
    source: str
    detail: str
    status: int | None = None
    body_sha256: str | None = None

    def repeats(self, latest: Evidence | None) -> bool:
        """The same fact as `latest` but for its time: not kept again (a probe asking every
        few minutes and hearing "too soon" is one fact; the history's probe event counts
        the asks). The stores' SQL applies the same rule to the stored JSON."""
        return latest is not None and dataclasses.replace(latest, at=self.at) == self

    def as_json(self) -> dict[str, object]:
        return {
            "at": self.at,
            "source": self.source,
            "detail": self.detail,
            "status": self.status,
            "body_sha256": self.body_sha256,
        }


@dataclass(frozen=True, slots=True)
class Resolution:
    """Who settled the outcome, when, and why."""

    by: ResolvedBy
    at: float
    note: str | None = None


class Operation(NamedTuple):
    """One idempotency key in one scope, and everything known about its effect.

    `token` is the fencing token: it grows on every attempt and every
    resolution (not when an attempt turns `unknown`), and an outcome is
    written only by the holder of the current one. `version` grows on every
    write and makes the ETag.

    `observed_at` is the store's clock at the moment this copy was read or
    written. Every judgement of the record's own times (has the lease run
    out, has the receipt expired, is a probe's grace over) compares them with
    `observed_at`, never with the reader's clock: a replica whose clock is
    off by minutes decides exactly as one whose clock is right.

    `lease_expires_at` outlives the attempt: once the outcome is written it
    is the attempt's last lease expiry, the latest moment its holder could
    have sent (a probe's `not_applied_after` grace counts from it).

    A NamedTuple rather than a frozen dataclass: stores build two of these per
    request, and a frozen dataclass's `__init__` (one `object.__setattr__` per
    field) was a fifth of the store's CPU in the profile. Just as immutable.
    """

    id: str
    scope: str
    key: str
    state: State
    route: str
    method: str
    path: str
    fingerprint: str
    attempts: int
    token: int
    version: int
    created_at: float
    updated_at: float
    lease_owner: str | None = None
    lease_expires_at: float | None = None
    sent_at: float | None = None
    response: StoredResponse | None = None
    body_retained: bool = True
    expires_at: float | None = None
    forgotten_at: float | None = None
    resolution: Resolution | None = None
    evidence: tuple[Evidence, ...] = ()
    observed_at: float = 0.0
    history_seq: int = 0
    """How many history events the operation has (`gateway.engine.history`)."""
    history_head: str = ""
    """The hash of its last event: the end of the chain, kept with the record."""

    @property
    def etag(self) -> str:
        return f'"{self.id}.{self.version}"'

    def receipt_available(self) -> bool:
        """True when a completed operation can still be replayed byte for byte.

        Judged on the store's clock (`observed_at`). A body the sweep dropped
        reads back as no response at all, whatever the clocks say, so it can
        never be replayed as an empty one.
        """
        return (
            self.state is State.COMPLETED
            and self.response is not None
            and self.body_retained
            and (self.expires_at is None or self.observed_at < self.expires_at)
        )

    def lease_expired(self) -> bool:
        """True for an `in_flight` record whose lease ran out, on the store's clock."""
        return (
            self.state is State.IN_FLIGHT
            and self.lease_expires_at is not None
            and self.lease_expires_at <= self.observed_at
        )


@dataclass(frozen=True, slots=True)
class NewAttempt:
    """The store granted this caller the right to send: a fresh key or a released one."""

    operation: Operation
    twin: Operation | None = None
    """Another operation of the scope and route with the same request that did not
    refuse this one: a completed one (the answer names it), or any one when the
    request was marked distinct (the histories of both name the other)."""


@dataclass(frozen=True, slots=True)
class Existing:
    """The key is bound to an operation the caller does not own; the lifecycle decides."""

    operation: Operation


@dataclass(frozen=True, slots=True)
class Similar:
    """Refused: the same request is another key's operation, not settled (`SimilarGuard`).

    Nothing was recorded for the key but the binding to its twin, which keeps
    refusing it for the guard's window.
    """

    twin: Operation


ClaimResult = NewAttempt | Existing | Similar


UNSETTLED = (State.IN_FLIGHT, State.UNKNOWN)
"""The states of a twin that refuse a new key on a route with `similar_guard = "unsettled"`."""


class SimilarGuard(NamedTuple):
    """How a claim that would start a new attempt looks for its twins: operations of the
    same scope and route with the same fingerprint under another key.

    A twin in one of `refuse` whose current attempt began less than `window`
    seconds ago (store clock) refuses the claim (`Similar`), and so does a
    binding a refusal left on the key within `window`; when this process
    cannot vouch for the store's clock over a whole window (`vouched` false,
    see `GraceClock.trusted_for`), every twin and binding counts as within it.
    A claim marked `distinct` is never refused, its twin only noted. A
    `derived` key's claim looks for no twin but is serialized with its twins'
    claims like any other (`gateway.engine.twins`).
    """

    window: float
    refuse: tuple[State, ...] = UNSETTLED
    distinct: bool = False
    derived: bool = False
    vouched: bool = True

    def since(self, now: float) -> float:
        """The store time the window starts at, seen at store time `now` (a store's query
        bound; `-inf` when this process cannot vouch for it)."""
        return now - self.window if self.vouched else float("-inf")

    def within(self, moment: float | None, now: float) -> bool:
        """Whether store time `moment` is within the window at store time `now`."""
        return moment is None or moment > self.since(now)


class ClaimRequest(NamedTuple):
    """Everything the store needs to bind a key to a request and lease it."""

    scope: str
    key: str
    fingerprint: str
    route: str
    method: str
    path: str
    owner: str
    lease_seconds: float
    tombstone_seconds: float
    claimed: NewEvent | None = None
    """The `claimed` event a new key's first attempt records (with the request kept in
    its payload); a new attempt of a released key records a plain one."""
    similar: SimilarGuard | None = None
    """The guard against the same request under a new key; `None`: not guarded (a
    derived key, or the route's guard is off)."""
    kind: str | None = None
    """The request's kind (`gateway.config.applies_to`), kept so that a probe's
    calibration finds a recent completed operation of the kind."""
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
