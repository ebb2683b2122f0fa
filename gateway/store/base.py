"""The `Store` protocol: the few verbs the state machine needs persisted.

Stores persist what `gateway.engine` decides; they never decide. Each verb
is one atomic transaction. Every outcome write is conditional on the caller's
fencing token, so a writer whose attempt was superseded (a new attempt, a
resolution) can never overwrite a newer truth: it gets `None` back and
records what it learned with `add_evidence` instead. Every operation a store
returns carries `observed_at`, the store's clock when it was read or
written, so nobody compares a record's times with another clock.

Failures of the database itself surface as `gateway.engine.errors.StoreUnavailable`,
never as a driver exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from gateway.engine.calibration import Calibration, CalibrationChange
    from gateway.engine.history import Checkpoint, EventRow, KeyedFrom, NewEvent
    from gateway.engine.models import (
        ClaimRequest,
        ClaimResult,
        Evidence,
        Operation,
        ReplayableReceipt,
        Resolution,
        State,
        StoredResponse,
    )
    from gateway.engine.request_lines import RequestBatch, RequestLog
    from gateway.store.history_rows import CheckpointEntry, HistorySeal


@dataclass(frozen=True, slots=True)
class Page:
    """One page of an operator listing; `next_cursor` is opaque to callers."""

    items: tuple[Operation, ...]
    next_cursor: str | None


@dataclass(frozen=True, slots=True)
class OperationFilter:
    """Which operations an operator listing keeps; a field left `None` keeps them all."""

    state: State | None = None
    route: str | None = None
    key: str | None = None
    """That key in whichever scopes hold it: an operator has a key from an agent's log,
    not its scope."""
    older_than: float | None = None
    """Created at least this many seconds ago, on the store's own clock (the clock
    `created_at` was written with)."""
    prefix: str | None = None
    """Keys or operation ids that start with this text (`%` and `_` match themselves)."""


def like_prefix(text: str) -> str:
    """A `LIKE ... ESCAPE '\\'` pattern for values starting with `text`: keys may hold
    `%` and `_`, which an operator's search means literally."""
    escaped = text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return escaped + "%"


@dataclass(frozen=True, slots=True)
class HistoryPage:
    """Events of one operation in `seq` order, with their payloads opened (decrypted;
    `None` where erased or unreadable)."""

    events: tuple[EventRow, ...]
    payloads: tuple[bytes | None, ...]


@dataclass(frozen=True, slots=True)
class ChainEvidence:
    """An operation, its history and what guards the history, read in one snapshot (so a
    write between two reads is never taken for an edit)."""

    operation: Operation
    page: HistoryPage
    keyed_from: KeyedFrom | None = None
    checkpoint: Checkpoint | None = None


@dataclass(frozen=True, slots=True)
class Renewal:
    """What one round of lease renewals found, and when (the store's clock)."""

    renewed: frozenset[str]
    """Leases extended: their holders still hold them."""
    lapsed: frozenset[str]
    """Leases of this owner that had run out while their records were still `in_flight`:
    not renewed but recorded `lease-expired` (now `unknown`), so the holder carries on
    only as the stale holder of its attempt."""
    at: float
    """The store's clock at the renewal: a witness (`gateway.engine.graces`)."""


@dataclass(frozen=True, slots=True)
class SweepReport:
    """What one bounded sweep pass changed."""

    receipts_expired: int = 0
    forgotten: int = 0


class SettledSignal(Protocol):
    """The wire between the worker processes of one gateway on one SQLite file.

    A worker that records the outcome of an operation another worker waits on
    publishes its id; every other worker hears it. PostgreSQL needs none:
    LISTEN/NOTIFY is its wire.
    """

    def publish(self, operation_id: str) -> None: ...

    def listen(self, on_settled: Callable[[str], None]) -> None: ...


class Store(Protocol):
    """Durable home of operations. Implementations: SQLite and PostgreSQL.

    Guarantees every implementation must give (the conformance suite in
    `tests/test_store_conformance.py` checks each one):

    - `claim` is atomic per (scope, key): of many concurrent claims for a new
      or released key, exactly one gets `NewAttempt`; it returns only once
      the claim is durable.
    - Outcome writes (`complete`, `mark_unknown`, `release`) apply only while
      the token matches and the state is `in_flight` or `unknown` (turning
      `unknown` keeps the token, so a holder whose lease lapsed still records
      the real answer it got), and return `None` otherwise. A completed
      receipt is never overwritten.
    - `resolve` applies only to an `unknown` operation at the caller's token,
      and bumps the token: a verdict is about one attempt.
    - Times come from the store's own clock, and every returned operation's
      `observed_at` is that clock at the read or write. `lease_expires_at` is
      kept after the attempt ends (the latest moment its holder could send).
    - A receipt whose body the sweep dropped reads back with `response=None`
      (and `body_retained` still true), never as an empty body.
    """

    async def open(self) -> None:
        """Connect, take any exclusive lock, and migrate the schema."""

    async def close(self) -> None: ...

    async def subscribe(self, on_settled: Callable[[str], None]) -> bool:
        """Deliver `on_settled(operation_id)` when another process records an outcome.

        Returns False when the store has no such channel (SQLite: one process,
        so every outcome is recorded by this process and signalled in memory).
        """

    async def watch(self, operation_id: str) -> None:
        """Ask for `on_settled(operation_id)` once another process records its outcome.

        Outcome writes signal only watched operations: signalling every one
        would cost each write (PostgreSQL: a NOTIFY, which serializes commits)
        for the rare retry that waits. A no-op where `subscribe` is.
        """

    async def ping(self) -> None:
        """Raise `StoreUnavailable` unless the store answers and is migrated."""

    async def now(self) -> float:
        """The store's clock, in POSIX seconds."""

    async def scope_secret(self) -> bytes:
        """The HMAC key for header-derived scopes, created once and shared by replicas."""

    async def upgraded_since(self, change: str) -> float | None:
        """When this store's gateway first made `change` (one of `rows.UPGRADES`: began
        to normalise credentials for scopes, or to key derived MCP keys), recorded the
        first time it is asked, on the store's clock; None when it always did (the store
        had no operations then, so nothing of the old form to look up)."""

    async def read_clock_witnesses(self) -> dict[str, bytes]:
        """The latest clock witness of every host (a boot of one machine), by host: a new
        process carries on from its own host's, and checks the store's clock is not behind
        what any of them read."""

    async def write_clock_witness(self, host: str, witness: bytes) -> None:
        """Replace `host`'s clock witness (`gateway.engine.graces`); one small row a host."""

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        """Bind the key to the request and lease it, or report the operation holding it.

        A fresh key (or one whose tombstone is forgotten) is inserted
        `in_flight`; a `released` key with the same fingerprint starts a new
        attempt (attempts and token grow). An `in_flight` record whose lease
        has expired becomes `unknown` on the way.
        """

    async def complete(
        self,
        operation_id: str,
        token: int,
        response: StoredResponse,
        *,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        resolution: Resolution,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        """Record the receipt; `None` if the caller's token is stale.

        Every write verb appends its `events` to the operation's history in the
        same transaction, after the change (`gateway.engine.history`)."""

    async def complete_late(
        self,
        operation_id: str,
        attempt: int,
        response: StoredResponse,
        *,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        """Record attempt `attempt`'s answer after its token went stale, where it is still
        the truth: an operation released since (no newer attempt: the release was wrong,
        the effect happened) becomes completed by the upstream; an operator's `applied`
        without a receipt gets this one attached. Anything else: `None` (the caller
        keeps it as evidence). The token grows."""

    async def attach_receipt(
        self,
        operation_id: str,
        response: StoredResponse,
        *,
        expected_version: int | None,
        body_retained: bool,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        """Attach the receipt an operator's `applied` went without (`ATTACHABLE`): once,
        since the row then has one; at `expected_version` when given. The resolution
        stays; the receipt and the tombstone expire counted from now. `None`: the
        operation is not (or no longer) one to attach to, or not at that version."""

    async def append_request_lines(self, batches: Sequence[RequestBatch]) -> None:
        """Add each operation's lines of one interval to its request log, numbered on from
        its last (`seq`; lines the batch coalesced take their numbers too), add its counts,
        and keep its first `FIRST` and last `LAST` lines only. Lines of an operation the
        store no longer holds are dropped."""

    async def request_log(self, operation_id: str, *, lines: bool = True) -> RequestLog:
        """An operation's request log as kept: its lines by `seq` (none read unless
        `lines`), and the counts of all."""

    async def mark_unknown(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        """The effect may have happened; hold the key for reconciliation."""

    async def release(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        *,
        tombstone_seconds: float,
        retention_seconds: float = 0.0,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        """The request provably did not take effect; the key may be used again. Its
        recorded request is dropped `retention_seconds` from now."""

    async def renew(self, leases: dict[str, int], *, owner: str, lease_seconds: float) -> Renewal:
        """Extend the leases (operation id to token) this owner still holds; never to an
        earlier expiry than the record has (a clock stepped back for a moment must not
        shorten the window a release waits for).

        A lease that ran out is never renewed silently: someone may already have
        seen it expire and acted on that. If its record is still `in_flight`, it
        turns `unknown` here with a `lease-expired` event saying the holder found
        it lapsed (`Renewal.lapsed`); the holder's answer is still recorded under
        its token, as any stale holder's."""

    async def add_evidence(
        self, operation_id: str, evidence: Evidence, events: Sequence[NewEvent] = ()
    ) -> None:
        """Keep what a late writer or a probe learned; no new version (the ETag an
        operator read stays valid). Past `EVIDENCE_CAP` events they are not recorded."""

    async def history(
        self, operation_id: str, *, after: int = 0, limit: int | None = None
    ) -> HistoryPage:
        """The operation's events after `seq` `after`, oldest first."""

    def history_seal(self) -> HistorySeal | None:
        """The history key this store chains with, once open (None: no key; the chains
        are plain SHA-256)."""

    async def chain_evidence(self, operation_id: str) -> ChainEvidence | None:
        """The operation, all its events, its keyed-since record and its checkpoint, read
        in one snapshot; None when there is no such operation."""

    async def write_checkpoint(self) -> int:
        """With a history key: write, signed and chained to the one before, the heads of
        the chains this store extended since its last checkpoint (a head never goes back
        in it); the number written. Without a key: nothing, 0."""

    async def checkpoint_log(self) -> list[CheckpointEntry]:
        """Every checkpoint written, oldest first (`verify` checks their chain)."""

    async def get(self, scope: str, key: str) -> Operation | None:
        """The operation for the key in the scope, `None` when never used or forgotten."""

    async def get_by_id(self, operation_id: str) -> Operation | None: ...

    def peek_receipt(self, scope: str, key: str) -> ReplayableReceipt | None:
        """The key's receipt if it can be replayed and the store can read it without waiting.

        Not a verb of the state machine but a shortcut for retries: a completed
        record is final, so a committed read of its receipt answers a retry
        exactly as a claim would. `None` means "ask `claim`": the key is new,
        in another state, forgotten, its receipt is gone (expired, not kept,
        erased), or the store cannot read without a round trip or a lock wait
        (PostgreSQL always says `None`).
        """

    async def resolve(
        self,
        operation_id: str,
        *,
        token: int,
        expected_version: int | None,
        state: State,
        response: StoredResponse | None,
        resolution: Resolution,
        retention_seconds: float,
        tombstone_seconds: float,
        events: Sequence[NewEvent] = (),
        calibrated: tuple[str, str] | None = None,
    ) -> Operation | None:
        """Settle an `unknown` operation's attempt `token` (the token grows by one).

        `None` if it is not unknown, not at that token (a newer attempt or an
        earlier resolution superseded the one judged), or not at `expected_version`;
        or, with `calibrated` (route, kind), unless that kind's calibration row admits a
        probe's release as the transaction reads it (`gateway.engine.calibration.decide`):
        every worker and replica obeys the same verdict.
        """

    async def calibration_samples(
        self,
        *,
        route: str,
        kind: str,
        scope: str | None,
        completed_since: float | None,
        limit: int,
    ) -> tuple[Operation, ...]:
        """The latest operations of a request kind the upstream itself completed with a 2xx
        receipt (in `scope` and completed at `completed_since` or later, when given),
        newest first, at most `limit`."""

    async def calibrations(self, route: str) -> tuple[Calibration, ...]:
        """The route's probe calibration rows, by kind."""

    async def save_calibration(self, change: CalibrationChange) -> Calibration | None:
        """Write a calibration's outcome at the store's clock; None when the route already
        has `MAX_KINDS` other kinds."""

    async def route_kinds(self, route: str, *, limit: int) -> tuple[str, ...]:
        """The distinct request kinds of the route's operations (at most `limit`)."""

    async def latest_of_request(
        self, *, scope: str, route: str, fingerprints: tuple[str, ...]
    ) -> Operation | None:
        """The latest operation of a request in a scope, whatever its key or state, by its
        fingerprint in any of the forms given; None when none is remembered."""

    async def list_operations(
        self, where: OperationFilter, *, limit: int, cursor: str | None
    ) -> Page:
        """Every scope's operations that `where` keeps, in creation order, a page at a time."""

    async def expire_orphans(self, *, owner: str | None) -> int:
        """Turn `in_flight` records into `unknown`: expired leases, or all of a dead owner's.

        With `owner=None`, every `in_flight` record whose lease expired. SQLite
        also calls it at start for every record of the previous process.
        """

    async def sweep(self, *, batch: int) -> SweepReport:
        """Drop expired receipt bodies and forgotten tombstones, one bounded batch.

        A dropped body leaves the record saying so (it reads as no response),
        so a replay after any clock step can never be an empty body."""

    async def count_by_state(self) -> dict[State, int]: ...

    async def count_for_scope(self, scope: str) -> int:
        """Records one scope keeps, for the `max_operations` quota: its operations (of any
        state) and the bindings its `similar-operation` refusals left on keys."""

    async def unbind_past(self, scope: str, key: str, limit: int) -> bool:
        """Drop the binding a `similar-operation` refusal left on (`scope`, `key`) when the
        scope holds more than `limit` bindings; True when it was dropped."""

    async def redact(
        self,
        operation_id: str,
        evidence: Evidence,
        *,
        expected_version: int | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        """Erase the recorded request and any receipt's headers and body, in any state;
        keep the fact the key was used (a completed one stays completed, its receipt
        no longer retained).

        `None` when the operation is gone or, with `expected_version`, no longer at
        that version (an operator acts on the version they read).
        """
