"""An in-memory `Store`: the protocol's semantics and nothing else, for the simulation.

Pure asyncio and deterministic: no threads, no I/O, no randomness, and no
await inside a verb, so each verb is one atomic step exactly like one
database transaction. Latency, outages and lost commits are not this
module's business: `tests.simulation.faults` wraps a store per replica.

Several `MemoryStore`s may share one `MemoryDatabase` (the replicas of a
simulation, or a store reopened in the conformance suite). The database keeps
the history of every committed write, which is what the simulation's
invariants are checked against: the truth as the database saw it, not as an
engine believed it. Probe calibration rows (`gateway.engine.calibration`) are
part of that state: one row per (route, kind), shared by every replica, each
write of one in the history too.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from gateway.engine.calibration import (
    MAX_KINDS,
    Calibration,
    CalibrationChange,
    decide,
    next_calibration,
)
from gateway.engine.errors import StoreUnavailable
from gateway.engine.history import EventRow, NewEvent, capped, chain, micros
from gateway.engine.lifecycle_events import (
    LEASE_EXPIRED,
    LEASE_LAPSED,
    claimed_event,
    distinct_twin_event,
    expired_event,
    lease_expired_event,
)
from gateway.engine.models import (
    ClaimRequest,
    ClaimResult,
    Evidence,
    Existing,
    NewAttempt,
    Operation,
    ReplayableReceipt,
    Resolution,
    Similar,
    SimilarGuard,
    State,
    StoredResponse,
)
from gateway.engine.twins import (
    BINDING_SWEEP_SLACK,
    is_twin,
    noted_twin,
    refusing_twin,
    twin_order,
)
from gateway.store.base import HistoryPage, OperationFilter, Page, Renewal, SweepReport
from gateway.store.history_rows import probe_merge
from gateway.store.rows import decode_cursor, encode_cursor, is_forgotten

__all__ = ["Binding", "MemoryDatabase", "MemoryStore", "Transition"]

_HAS_OBSERVED_AT = "observed_at" in Operation._fields
_SETTLED = (State.COMPLETED, State.RELEASED)
_OUTCOME_WRITABLE = (State.IN_FLIGHT, State.UNKNOWN)
_OPERATORS = ("owner", "admin")


class Binding(NamedTuple):
    """What a `similar-operation` refusal left on the refused key: the request it was
    refused for, the twin it named, and when (store clock). The sweep drops it
    `BINDING_SWEEP_SLACK` after `expires_at` (the refusal's window), as the SQL stores do."""

    fingerprint: str
    twin_id: str
    refused_at: float
    expires_at: float


@dataclass(frozen=True, slots=True)
class Transition:
    """One committed write: the record before and after, who wrote it, and with what.

    `token` is the fencing token the writer presented (None for verbs that
    take none); `notes` is whatever `MemoryDatabase.annotate` attached (the
    simulation records which replica wrote, and on which probe answer).
    A write of a key's binding (`bind`, `unbind`: a `similar-operation`
    refusal, the sweep) changes no operation row: `before` and `after` are
    None, `operation_id` is the twin's, `binding` names the key and `bound`
    is the binding written (None: dropped).
    """

    number: int
    at: float
    verb: str
    operation_id: str
    before: Operation | None
    after: Operation | None
    token: int | None = None
    notes: dict[str, Any] = field(default_factory=dict)
    binding: tuple[str, str] | None = None
    """(scope, key) of a `bind` or `unbind` write."""
    bound: Binding | None = None
    """What a `bind` wrote."""
    world_at: float | None = None
    """True (world) time of the commit; `at` is the store's clock, which a step may have
    set off (`tests.simulation.clock.StoreClock`): the times a write stored are off by
    `at - world_at`."""
    calibration: Calibration | None = None
    """What a `calibrate` write (a probe calibration row, no operation row) wrote;
    `operation_id` is then its sample's, or empty."""

    @property
    def offset(self) -> float:
        """How far the store's clock was off world time when this write committed."""
        return 0.0 if self.world_at is None else self.at - self.world_at


class MemoryDatabase:
    """The shared state: operations by id, the (scope, key) index, and the write history.

    `clock` is the database's clock (the simulation's store clock; wall time by
    default, as the conformance suite expects); `true_time` is the world's, when
    the store's may be off it (each write's history entry keeps both).
    `unsafe_skip_token_check` exists only to prove the simulation's invariants
    catch a store that lets a stale writer through; nothing else may set it.
    """

    def __init__(
        self,
        clock: Callable[[], float],
        *,
        true_time: Callable[[], float] | None = None,
        secret: bytes = b"",
        unsafe_skip_token_check: bool = False,
    ) -> None:
        self.clock = clock
        self.true_time = true_time or clock
        self.secret = secret or hashlib.sha256(b"memory-store-scope-secret").digest()
        self.unsafe_skip_token_check = unsafe_skip_token_check
        self.rows: dict[str, Operation] = {}
        self.by_key: dict[tuple[str, str], str] = {}
        self.seq: dict[str, int] = {}
        self.history: list[Transition] = []
        self.witnesses: dict[str, bytes] = {}
        self.events: dict[str, list[EventRow]] = {}
        self.bindings: dict[tuple[str, str], Binding] = {}
        """(scope, key) -> the binding a `similar-operation` refusal left on the key."""
        self.kinds: dict[str, str | None] = {}
        """Operation id -> its request kind, as its first claim gave it (the SQL stores'
        `request_kind` column: kept across attempts, never on `Operation`)."""
        self.statuses: dict[str, int] = {}
        """Operation id -> its receipt's status (the SQL stores' `response_status`
        column): kept when the sweep drops the body, which a read shows as no response."""
        self.calibrations: dict[tuple[str, str], Calibration] = {}
        """(route, kind) -> the probe's calibration row for that kind."""
        self.annotate: Callable[[], dict[str, Any]] | None = None
        self._next_seq = 0
        self._next_id = 0

    # -- reads the simulation makes without awaiting (never through a replica) ----

    def current(self, scope: str, key: str) -> Operation | None:
        """The key's record as `get` would return it now (None when forgotten)."""
        op_id = self.by_key.get((scope, key))
        if op_id is None:
            return None
        operation = self.rows[op_id]
        return None if self.forgotten(operation, self.clock()) else operation

    @staticmethod
    def forgotten(operation: Operation, now: float) -> bool:
        return (
            operation.state in _SETTLED
            and operation.forgotten_at is not None
            and operation.forgotten_at <= now
        )

    # -- bookkeeping ---------------------------------------------------------------

    def new_id(self) -> str:
        """Sortable, deterministic ids (the real ones are random past the timestamp)."""
        self._next_id += 1
        return f"op_{self._next_id:026d}"

    def put(
        self,
        verb: str,
        before: Operation | None,
        after: Operation | None,
        *,
        token: int | None = None,
        events: Sequence[NewEvent] = (),
        at: float | None = None,
    ) -> Operation | None:
        """Commit one write, with its events chained after it, and append it to the
        write history; the record as written."""
        now = self.clock()
        if after is not None and events:
            rows, head, count = chain(
                after.id,
                head=after.history_head,
                seq=after.history_seq,
                version=after.version,
                at_us=micros(after.updated_at if at is None else at),
                events=events,
                attempt=after.attempts,
            )
            self.events.setdefault(after.id, []).extend(rows)
            after = after._replace(history_head=head, history_seq=count)
        if after is not None:
            if after.id not in self.seq:
                self._next_seq += 1
                self.seq[after.id] = self._next_seq
            self.rows[after.id] = after
            self.by_key[(after.scope, after.key)] = after.id
            if after.response is not None:
                self.statuses[after.id] = after.response.status
            elif verb != "sweep_body":  # the sweep drops the body, not the status
                self.statuses.pop(after.id, None)
        elif before is not None:
            del self.rows[before.id]
            del self.seq[before.id]
            self.events.pop(before.id, None)
            self.kinds.pop(before.id, None)
            self.statuses.pop(before.id, None)
            if self.by_key.get((before.scope, before.key)) == before.id:
                del self.by_key[(before.scope, before.key)]
        op_id = (after or before).id if (after or before) is not None else "?"
        notes = self.annotate() if self.annotate is not None else {}
        self.history.append(
            Transition(
                len(self.history),
                now,
                verb,
                op_id,
                before,
                after,
                token,
                notes,
                world_at=self.true_time(),
            )
        )
        return after

    def calibrate(self, row: Calibration) -> None:
        """Commit a probe calibration row, a write of its own in the history."""
        self.calibrations[(row.route, row.kind)] = row
        notes = self.annotate() if self.annotate is not None else {}
        self.history.append(
            Transition(
                len(self.history),
                self.clock(),
                "calibrate",
                row.sample or "",
                None,
                None,
                notes=notes,
                world_at=self.true_time(),
                calibration=row,
            )
        )

    def bind(self, scope: str, key: str, binding: Binding | None) -> None:
        """Commit a key's binding (None: drop it), a write of its own in the history."""
        if binding is None:
            dropped = self.bindings.pop((scope, key), None)
            if dropped is None:
                return
            verb, op_id = "unbind", dropped.twin_id
        else:
            self.bindings[(scope, key)] = binding
            verb, op_id = "bind", binding.twin_id
        notes = self.annotate() if self.annotate is not None else {}
        self.history.append(
            Transition(
                len(self.history),
                self.clock(),
                verb,
                op_id,
                None,
                None,
                notes=notes,
                binding=(scope, key),
                bound=binding,
                world_at=self.true_time(),
            )
        )

    def token_ok(self, operation: Operation, token: int) -> bool:
        return self.unsafe_skip_token_check or operation.token == token


class MemoryStore:
    """`gateway.store.base.Store` over a `MemoryDatabase`.

    >>> # db = MemoryDatabase(world_clock); store = MemoryStore(db); await store.open()
    """

    def __init__(self, database: MemoryDatabase | None = None) -> None:
        if database is None:
            import time

            database = MemoryDatabase(time.time)
        self.db = database
        self._open = False

    # -- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        self._open = True

    async def close(self) -> None:
        self._open = False

    async def subscribe(self, on_settled: Callable[[str], None]) -> bool:
        return False

    async def watch(self, operation_id: str) -> None:
        return None

    async def ping(self) -> None:
        self._check_open()

    async def now(self) -> float:
        self._check_open()
        return self.db.clock()

    async def scope_secret(self) -> bytes:
        self._check_open()
        return self.db.secret

    async def read_clock_witnesses(self) -> dict[str, bytes]:
        self._check_open()
        return dict(self.db.witnesses)

    async def write_clock_witness(self, host: str, witness: bytes) -> None:
        self._check_open()
        self.db.witnesses[host] = witness

    def _check_open(self) -> None:
        if not self._open:
            raise StoreUnavailable("the memory store is not open")

    def _seen(self, operation: Operation, now: float) -> Operation:
        """The record as a reader gets it: stamped with the store's clock."""
        return operation._replace(observed_at=now) if _HAS_OBSERVED_AT else operation

    # -- the state machine's verbs ------------------------------------------------------

    async def claim(self, request: ClaimRequest) -> ClaimResult:
        self._check_open()
        db, now = self.db, self.db.clock()
        op_id = db.by_key.get((request.scope, request.key))
        current = db.rows[op_id] if op_id is not None else None
        if current is not None and db.forgotten(current, now):
            db.put("forget", current, None)
            current = None
        starts = current is None or (
            current.state is State.RELEASED and request.same_request(current.fingerprint)
        )
        if not starts:
            assert current is not None
            if self._lapsed(current, now):
                expired = self._expire(current, now, LEASE_EXPIRED)
                expired = db.put(
                    "claim_expire", current, expired, events=(lease_expired_event(LEASE_EXPIRED),)
                )
                assert expired is not None
                return Existing(self._seen(expired, now))
            return Existing(self._seen(current, now))
        # A new attempt would start: the same request under another key may refuse it
        # (`gateway.engine.twins` decides; this finds, in the same atomic step).
        guard = request.similar
        noted: Operation | None = None
        if guard is not None and not guard.derived:
            bound = None if guard.distinct else self._bound_twin(request, guard, now)
            twins = [
                op
                for op in db.rows.values()
                if op.scope == request.scope
                and op.route == request.route
                and op.fingerprint == request.fingerprint
                and op.key != request.key
                and is_twin(op, guard, now)
            ]
            twin = max(twins, key=lambda op: twin_order(op, guard), default=None)
            refusing = refusing_twin(guard, bound=bound, twin=twin)
            if refusing is not None:
                if bound is None:  # a fresh refusal leaves (or replaces) the key's binding
                    binding = Binding(request.fingerprint, refusing.id, now, now + guard.window)
                    db.bind(request.scope, request.key, binding)
                return Similar(self._seen(refusing, now))
            noted = noted_twin(guard, twin)
        distinct_from = (
            noted.id if noted is not None and guard is not None and guard.distinct else None
        )
        if current is None:
            fresh = Operation(
                id=db.new_id(),
                scope=request.scope,
                key=request.key,
                state=State.IN_FLIGHT,
                route=request.route,
                method=request.method,
                path=request.path,
                fingerprint=request.fingerprint,
                attempts=1,
                token=1,
                version=1,
                created_at=now,
                updated_at=now,
                lease_owner=request.owner,
                lease_expires_at=now + request.lease_seconds,
                sent_at=now,
            )
            event = claimed_event(request.claimed, 1, distinct_from=distinct_from)
            db.kinds[fresh.id] = request.kind  # set on insert only, as `request_kind` is
            claimed = db.put("claim", None, fresh, events=(event,))
        else:
            again = current._replace(
                state=State.IN_FLIGHT,
                attempts=current.attempts + 1,
                token=current.token + 1,
                version=current.version + 1,
                lease_owner=request.owner,
                lease_expires_at=now + request.lease_seconds,
                sent_at=now,
                forgotten_at=None,
                updated_at=now,
            )
            event = claimed_event(None, again.token, distinct_from=distinct_from)
            claimed = db.put("claim", current, again, events=(event,))
        assert claimed is not None
        if distinct_from is not None and noted is not None:
            # Both histories name the other; evidence only on the twin (no version change),
            # at the time it was learned. Not capped: one event per claim, as in SQLite.
            events = (distinct_twin_event(claimed.id),)
            noted = db.put("distinct_twin", noted, noted, events=events, at=now)
            assert noted is not None
        return NewAttempt(
            self._seen(claimed, now), twin=None if noted is None else self._seen(noted, now)
        )

    def _bound_twin(
        self, request: ClaimRequest, guard: SimilarGuard, now: float
    ) -> Operation | None:
        """The twin a refusal of this key named, while its binding holds: the same
        request, within the window, the twin still there and not forgotten."""
        binding = self.db.bindings.get((request.scope, request.key))
        if (
            binding is None
            or binding.fingerprint != request.fingerprint
            or not guard.within(binding.refused_at, now)
        ):
            return None
        twin = self.db.rows.get(binding.twin_id)
        if twin is None or self.db.forgotten(twin, now):
            return None
        return twin

    @staticmethod
    def _lapsed(operation: Operation, now: float) -> bool:
        return (
            operation.state is State.IN_FLIGHT
            and operation.lease_expires_at is not None
            and operation.lease_expires_at <= now
        )

    @staticmethod
    def _expire(operation: Operation, now: float, detail: str) -> Operation:
        """In flight to unknown: token and last lease expiry kept, the reason as evidence."""
        return operation._replace(
            state=State.UNKNOWN,
            lease_owner=None,
            version=operation.version + 1,
            updated_at=now,
            evidence=(*operation.evidence, Evidence(at=now, source="lease", detail=detail)),
        )

    def _writable(self, operation_id: str, token: int) -> Operation | None:
        current = self.db.rows.get(operation_id)
        if (
            current is None
            or current.state not in _OUTCOME_WRITABLE
            or not self.db.token_ok(current, token)
        ):
            return None
        return current

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
        self._check_open()
        now = self.db.clock()
        current = self._writable(operation_id, token)
        if current is None:
            return None
        done = current._replace(
            state=State.COMPLETED,
            response=response if body_retained else StoredResponse(response.status, (), b""),
            body_retained=body_retained,
            expires_at=now + retention_seconds,
            forgotten_at=now + max(tombstone_seconds, retention_seconds),
            resolution=resolution,
            lease_owner=None,
            updated_at=now,
            version=current.version + 1,
        )
        written = self.db.put("complete", current, done, token=token, events=events)
        assert written is not None
        return self._seen(written, now)

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
        """Attempt `attempt`'s answer after its token went stale, where it is still the
        truth (as SQLite's `_LATE_WRITABLE`): a release with no newer attempt since (the
        release was wrong: completed by the upstream), or an operator's `applied` with no
        receipt (it gains this one, its resolution kept). Not fenced by a token."""
        self._check_open()
        now = self.db.clock()
        current = self.db.rows.get(operation_id)
        if current is None or current.attempts != attempt or not self._late_writable(current):
            return None
        released = current.state is State.RELEASED
        done = current._replace(
            state=State.COMPLETED,
            response=response if body_retained else StoredResponse(response.status, (), b""),
            body_retained=body_retained,
            expires_at=now + retention_seconds,
            forgotten_at=now + max(tombstone_seconds, retention_seconds),
            resolution=Resolution("upstream", now) if released else current.resolution,
            lease_owner=None,
            token=current.token + 1,
            updated_at=now,
            version=current.version + 1,
        )
        written = self.db.put("complete_late", current, done, events=events)
        assert written is not None
        return self._seen(written, now)

    def _late_writable(self, operation: Operation) -> bool:
        if operation.state is State.RELEASED:
            return True
        return (
            operation.state is State.COMPLETED
            and self.db.statuses.get(operation.id) is None
            and operation.resolution is not None
            and operation.resolution.by in _OPERATORS
        )

    async def mark_unknown(
        self,
        operation_id: str,
        token: int,
        evidence: Evidence,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        self._check_open()
        now = self.db.clock()
        current = self._writable(operation_id, token)
        if current is None:
            return None
        marked = current._replace(
            state=State.UNKNOWN,
            lease_owner=None,
            updated_at=now,
            version=current.version + 1,
            evidence=(*current.evidence, evidence),
        )
        written = self.db.put("mark_unknown", current, marked, token=token, events=events)
        assert written is not None
        return self._seen(written, now)

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
        self._check_open()
        now = self.db.clock()
        current = self._writable(operation_id, token)
        if current is None:
            return None
        freed = current._replace(
            state=State.RELEASED,
            lease_owner=None,
            forgotten_at=now + max(tombstone_seconds, retention_seconds),
            expires_at=now + retention_seconds,
            updated_at=now,
            version=current.version + 1,
            evidence=(*current.evidence, evidence),
        )
        written = self.db.put("release", current, freed, token=token, events=events)
        assert written is not None
        return self._seen(written, now)

    async def renew(self, leases: dict[str, int], *, owner: str, lease_seconds: float) -> Renewal:
        self._check_open()
        now = self.db.clock()
        renewed: set[str] = set()
        lapsed: set[str] = set()
        for op_id, token in leases.items():
            current = self.db.rows.get(op_id)
            if (
                current is None
                or current.state is not State.IN_FLIGHT
                or current.token != token
                or current.lease_owner != owner
                or current.lease_expires_at is None
            ):
                continue
            if current.lease_expires_at <= now:
                # Never renewed silently: recorded lapsed, the holder goes on as a stale one.
                event = lease_expired_event(LEASE_LAPSED)
                expired = self._expire(current, now, LEASE_LAPSED)
                self.db.put("renew", current, expired, token=token, events=(event,))
                lapsed.add(op_id)
                continue
            longer = current._replace(
                # Never earlier than it was (as the production stores): see `Store.renew`.
                lease_expires_at=max(current.lease_expires_at, now + lease_seconds),
                version=current.version + 1,
            )
            self.db.put("renew", current, longer, token=token)
            renewed.add(op_id)
        return Renewal(frozenset(renewed), frozenset(lapsed), now)

    async def add_evidence(
        self, operation_id: str, evidence: Evidence, events: Sequence[NewEvent] = ()
    ) -> None:
        self._check_open()
        current = self.db.rows.get(operation_id)
        if current is None:
            return
        now = self.db.clock()
        latest = current.evidence[-1] if current.evidence else None
        kept = current.evidence if evidence.repeats(latest) else (*current.evidence, evidence)
        noted = current._replace(evidence=kept, observed_at=now)
        rows = self.db.events.get(operation_id, [])
        merged = probe_merge(noted, events, rows[-1] if rows else None, None)
        if merged is not None:
            rows[-1] = merged
            self.db.put("add_evidence", current, noted._replace(history_head=merged.hash))
            return
        self.db.put("add_evidence", current, noted, events=capped(current, events), at=now)

    def history_seal(self) -> None:
        return None

    async def history(
        self, operation_id: str, *, after: int = 0, limit: int | None = None
    ) -> HistoryPage:
        self._check_open()
        rows = [row for row in self.db.events.get(operation_id, []) if row.seq > after]
        rows = rows if limit is None else rows[:limit]
        return HistoryPage(tuple(rows), tuple(row.payload for row in rows))

    async def get(self, scope: str, key: str) -> Operation | None:
        self._check_open()
        found = self.db.current(scope, key)
        return None if found is None else self._seen(found, self.db.clock())

    async def get_by_id(self, operation_id: str) -> Operation | None:
        self._check_open()
        found = self.db.rows.get(operation_id)
        return None if found is None else self._seen(found, self.db.clock())

    def peek_receipt(self, scope: str, key: str) -> ReplayableReceipt | None:
        if not self._open:
            return None
        found = self.db.current(scope, key)
        if found is None or found.state is not State.COMPLETED:
            return None
        seen = self._seen(found, self.db.clock())
        if is_forgotten(seen) or not seen.receipt_available():
            return None
        assert seen.response is not None
        return ReplayableReceipt(seen.id, seen.attempts, seen.fingerprint, seen.response)

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
        self._check_open()
        now = self.db.clock()
        if calibrated is not None and not self._admits_release(*calibrated, now):
            return None  # the kind's row, as this transaction reads it, admits no release
        current = self.db.rows.get(operation_id)
        if (
            current is None
            or current.state is not State.UNKNOWN
            or not self.db.token_ok(current, token)
            or (expected_version is not None and current.version != expected_version)
        ):
            return None
        settled = current._replace(
            state=state,
            response=response if state is State.COMPLETED else None,
            body_retained=response is not None,
            expires_at=now + retention_seconds,
            forgotten_at=now + max(tombstone_seconds, retention_seconds),
            resolution=resolution,
            token=current.token + 1,
            updated_at=now,
            version=current.version + 1,
        )
        written = self.db.put("resolve", current, settled, token=token, events=events)
        assert written is not None
        return self._seen(written, now)

    def _admits_release(self, route: str, kind: str, now: float) -> bool:
        """The releasing transaction's own reading of the kind's calibration row."""
        return decide(self.db.calibrations.get((route, kind)), now=now) == "release"

    # -- probe calibration, and a call found by its request --------------------------------

    async def calibration_samples(
        self,
        *,
        route: str,
        kind: str,
        scope: str | None,
        completed_since: float | None,
        limit: int,
    ) -> tuple[Operation, ...]:
        """As SQLite's `samples`: completed by the upstream itself with a 2xx status (the
        status column, which outlives a swept body), not forgotten, newest first."""
        self._check_open()
        db, now = self.db, self.db.clock()

        def sample(op: Operation) -> bool:
            status = db.statuses.get(op.id)
            return (
                op.route == route
                and db.kinds.get(op.id) == kind
                and op.state is State.COMPLETED
                and op.resolution is not None
                and op.resolution.by == "upstream"
                and status is not None
                and 200 <= status <= 299
                and (op.forgotten_at is None or op.forgotten_at > now)
                and (scope is None or op.scope == scope)
                and (completed_since is None or op.updated_at >= completed_since)
            )

        found = sorted(
            (op for op in db.rows.values() if sample(op)),
            key=lambda op: (op.created_at, db.seq[op.id]),
            reverse=True,
        )
        return tuple(self._seen(op, now) for op in found[:limit])

    async def calibrations(self, route: str) -> tuple[Calibration, ...]:
        self._check_open()
        rows = self.db.calibrations
        return tuple(rows[key] for key in sorted(rows) if key[0] == route)

    async def save_calibration(self, change: CalibrationChange) -> Calibration | None:
        self._check_open()
        now = self.db.clock()
        previous = self.db.calibrations.get((change.route, change.kind))
        if previous is None:
            kinds = sum(1 for route, _ in self.db.calibrations if route == change.route)
            if kinds >= MAX_KINDS:
                return None
        row = next_calibration(previous, change, now=now)
        self.db.calibrate(row)
        return row

    async def route_kinds(self, route: str, *, limit: int) -> tuple[str, ...]:
        self._check_open()
        kinds = {
            kind
            for op_id, kind in self.db.kinds.items()
            if kind is not None and self.db.rows[op_id].route == route
        }
        return tuple(sorted(kinds)[:limit])

    async def latest_of_request(
        self, *, scope: str, route: str, fingerprints: tuple[str, ...]
    ) -> Operation | None:
        self._check_open()
        db, now = self.db, self.db.clock()
        found = [
            op
            for op in db.rows.values()
            if op.fingerprint in fingerprints
            and op.scope == scope
            and op.route == route
            and (op.forgotten_at is None or op.forgotten_at > now)
        ]
        if not found:
            return None
        latest = max(
            found, key=lambda op: (op.sent_at is not None, op.sent_at or 0.0, db.seq[op.id])
        )
        return self._seen(latest, now)

    async def list_operations(
        self, where: OperationFilter, *, limit: int, cursor: str | None
    ) -> Page:
        self._check_open()
        after = decode_cursor(cursor)
        now = self.db.clock()

        def wanted(op: Operation) -> bool:
            return (
                (where.state is None or op.state is where.state)
                and (where.route is None or op.route == where.route)
                and (where.key is None or op.key == where.key)
                and (where.older_than is None or op.created_at <= now - where.older_than)
                and (
                    where.prefix is None
                    or op.key.startswith(where.prefix)
                    or op.id.startswith(where.prefix)
                )
            )

        matching = sorted(
            (seq, op_id)
            for op_id, seq in self.db.seq.items()
            if seq > after and wanted(self.db.rows[op_id])
        )
        page = matching[: limit + 1]
        more = len(page) > limit
        page = page[:limit]
        items = tuple(self._seen(self.db.rows[op_id], now) for _, op_id in page)
        return Page(items=items, next_cursor=encode_cursor(page[-1][0]) if more and page else None)

    async def expire_orphans(self, *, owner: str | None) -> int:
        self._check_open()
        now = self.db.clock()
        if owner is None:
            detail = "the lease expired before an outcome was recorded"
            chosen = [op for op in self.db.rows.values() if self._lapsed(op, now)]
        else:
            detail = f"lease holder {owner} is gone"
            chosen = [
                op
                for op in self.db.rows.values()
                if op.state is State.IN_FLIGHT and op.lease_owner == owner
            ]
        event = lease_expired_event(detail)
        for operation in sorted(chosen, key=lambda op: self.db.seq[op.id]):
            self.db.put("expire", operation, self._expire(operation, now, detail), events=(event,))
        return len(chosen)

    async def sweep(self, *, batch: int) -> SweepReport:
        self._check_open()
        now = self.db.clock()
        in_order = sorted(self.db.rows.values(), key=lambda op: self.db.seq[op.id])
        bodies = [
            op
            for op in in_order
            if op.state is State.COMPLETED
            and op.response is not None
            and op.body_retained
            and op.expires_at is not None
            and op.expires_at <= now
        ][:batch]
        for operation in bodies:
            dropped = operation._replace(
                response=None, updated_at=now, version=operation.version + 1
            )
            self._erase_request(operation.id)
            self.db.put(
                "sweep_body", operation, dropped, events=(expired_event(["receipt", "request"]),)
            )
        gone = [op for op in in_order if self.db.forgotten(self.db.rows[op.id], now)][:batch]
        for operation in gone:
            self.db.put("forget", self.db.rows[operation.id], None)
        stale = [
            where
            for where, binding in self.db.bindings.items()
            if binding.expires_at <= now - BINDING_SWEEP_SLACK
        ][:batch]
        for scope, key in stale:
            self.db.bind(scope, key, None)
        return SweepReport(receipts_expired=len(bodies), forgotten=len(gone))

    async def count_by_state(self) -> dict[State, int]:
        self._check_open()
        counts = dict.fromkeys(State, 0)
        for operation in self.db.rows.values():
            counts[operation.state] += 1
        return counts

    async def count_for_scope(self, scope: str) -> int:
        self._check_open()
        operations = sum(1 for operation in self.db.rows.values() if operation.scope == scope)
        return operations + sum(1 for bound, _ in self.db.bindings if bound == scope)

    async def unbind_past(self, scope: str, key: str, limit: int) -> bool:
        self._check_open()
        if sum(1 for bound, _ in self.db.bindings if bound == scope) <= limit:
            return False
        if (scope, key) not in self.db.bindings:
            return False
        self.db.bind(scope, key, None)
        return True

    def _erase_request(self, operation_id: str) -> None:
        rows = self.db.events.get(operation_id, [])
        for index, row in enumerate(rows):
            if row.type == "claimed" and row.payload is not None:
                rows[index] = row._replace(payload=None)

    async def redact(
        self,
        operation_id: str,
        evidence: Evidence,
        *,
        expected_version: int | None = None,
        events: Sequence[NewEvent] = (),
    ) -> Operation | None:
        self._check_open()
        now = self.db.clock()
        current = self.db.rows.get(operation_id)
        if current is None:
            return None
        if expected_version is not None and current.version != expected_version:
            return None
        erased = current._replace(
            response=(
                None
                if current.response is None
                else StoredResponse(current.response.status, (), b"")
            ),
            body_retained=False if current.state is State.COMPLETED else current.body_retained,
            updated_at=now,
            version=current.version + 1,
            evidence=(*current.evidence, evidence),
        )
        self._erase_request(operation_id)
        written = self.db.put("redact", current, erased, events=events)
        assert written is not None
        return self._seen(written, now)
