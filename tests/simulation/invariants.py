"""What must hold after every step, checked against the database's history and the upstream's truth.

Each invariant reads ground truth (the memory database's committed writes,
the scripted upstream's effects, answers and probes), never what an engine
believed, and each is named so a failure says which promise broke:

- `duplicate-effect`: an operation never has more upstream effects than
  1 + the number of times an operator said `not_applied` about it;
- `receipt-provenance`: a completed receipt is byte for byte an answer the
  upstream gave for that operation, or the probe's or operator's response,
  as `resolution.by` says; a replay is byte for byte the receipt;
- `answer-state`: the state an answer claims (`Reply.state`, the error's
  `.state`, and the `Idempotency-Status` header either would carry) is the
  record's state, read without awaiting anything after the engine returned
  (excused: after an ambiguous commit, which the engine cannot know about,
  and `unknown` after a store call of that answer failed, or about the
  call's own unwritten attempt past its lease length: the conservative
  answer when the engine cannot tell);
- `unknown-exit`: an `unknown` record leaves `unknown` only through a
  resolution (an operator's, or a probe verdict about its current attempt)
  or through the holder of the current token recording its answer;
- `sent-released`: an attempt that reached the upstream is released only by
  an operator's `not_applied`, a probe's `not_applied` answered after the
  upstream's bound for that attempt about an attempt that made no effect (a
  probe blind to it says "not found" all the same), or an honest refusal (a
  release status);
- `key-binding`: a request whose fingerprint differs from its key's record is
  answered 422 and never forwarded; a forwarded request is, in either
  fingerprint form computed from the bytes sent, its record's request;
- `twin-effect`: no second effect for one request while its twin is unsettled,
  unless marked distinct: an attempt claimed while another key's operation of
  the same request (the agent's same intended call: same scope, route, path
  and JSON meaning, in whatever bytes) was `in_flight` or `unknown` (in the
  database's committed history at the moment the claim committed) and sent
  within the route's `similar_window` makes no upstream effect, unless the
  request that claimed it was marked distinct; nor does one claimed under a
  key a refusal bound to its twin, for the same request within the window,
  while that twin was there (whatever its state). And a `similar-operation`
  refusal is the store's: it names the twin the store refused the claim for,
  an operation of the same request under another key;
- `engine-crash`: an engine call raised something other than a `GatewayError`.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from gateway.engine.errors import GatewayError, KeyMismatch, SimilarOperation
from gateway.engine.fingerprint import fingerprints
from gateway.engine.headers import IDEMPOTENCY_STATUS, without
from gateway.engine.models import UNSETTLED, Operation, State, StoredResponse
from gateway.web.problems import problem_response
from tests.simulation.clock import EPOCH as _EPOCH
from tests.simulation.memory_store import MemoryDatabase
from tests.simulation.upstream import REDACTED

if TYPE_CHECKING:
    from gateway.config import RouteSettings
    from gateway.engine.exchange import Reply
    from tests.simulation.memory_store import Binding, Transition
    from tests.simulation.upstream import ProbeCall, ScriptedUpstream

__all__ = ["AnswerSeen", "Invariants", "Problem"]


@dataclass(frozen=True, slots=True)
class Problem:
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"[{self.invariant}] {self.detail}"


@dataclass(slots=True)
class AnswerSeen:
    """An engine answer and the record as it stood the instant the engine returned it."""

    label: str
    scope: str
    key: str
    fingerprint: str | None
    record: Operation | None
    """The key's row (forgotten or not) the instant the engine returned."""
    reply: Reply | None = None
    error: GatewayError | None = None
    operation: Operation | None = None
    """For lookups and resolves: the operation the engine returned."""
    ambiguous_commits: list[str] = field(default_factory=list)
    """Store writes of this call that applied, then reported failure (the engine cannot know)."""
    store_errors: list[str] = field(default_factory=list)
    """Store calls of this call that raised `StoreUnavailable`."""
    sent_operation: str | None = None
    """The operation id the upstream answer this call got was for (a fresh reply's)."""
    claimed_operation: str | None = None
    """The operation id of the attempt this call was granted, if any."""
    refused_by: str | None = None
    """The twin the store named when it refused this call's claim (`Similar`), if it did."""


@dataclass(frozen=True, slots=True)
class TwinClaim:
    """An attempt claimed while the same request was unsettled under another key."""

    transition: Transition
    twins: tuple[Operation, ...]
    """The unsettled twins as the database had them when the claim committed."""
    bound: Operation | None = None
    """The twin a refusal bound the claim's key to, when the binding held."""


def _stored(response: StoredResponse) -> tuple[int, tuple[tuple[str, str], ...], bytes]:
    return (response.status, tuple(response.headers), response.body)


class Invariants:
    """Incremental checker: call `observe` as answers come, `after_step` once per step."""

    def __init__(
        self,
        db: MemoryDatabase,
        upstream: ScriptedUpstream,
        route: RouteSettings,
        operator_responses: dict[str, list[StoredResponse]],
        *,
        tolerate: frozenset[str] = frozenset(),
    ) -> None:
        self._db = db
        self._upstream = upstream
        self._route = route
        self._operator_responses = operator_responses
        self._history_seen = 0
        self._sends_seen = 0
        self._upstream_problems_seen = 0
        self._holders: dict[tuple[str, int], str | None] = {}
        self.operator_not_applied: Counter[str] = Counter()
        self._tolerate = tolerate
        self.excused: Counter[str] = Counter()
        """Answer-state mismatches not failed: after an ambiguous commit (the engine cannot
        know) or of a class named in `tolerate` (a known bug, to hunt past it)."""
        self._problems: list[Problem] = []
        self._rows: dict[str, Operation] = {}
        self._forgotten: dict[str, Operation] = {}
        """Rows the store deleted (forgotten past their tombstone), as they last stood: a
        refusal answered after its twin was forgotten still named a real operation."""
        """Every operation as the committed history has it so far (a replay of it)."""
        self._same_request: dict[tuple[str, str, str], set[str]] = {}
        """(scope, route, request) -> the ids of `_rows` with that request (`_request`)."""
        self._intents: dict[str, str] = {}
        """Operation id -> the agent's intended call that first claimed it."""
        self._bindings: dict[tuple[str, str], tuple[Binding, str | None]] = {}
        """(scope, key) -> the binding a refusal left on the key (replayed history), and
        the intended call of the request it was refused for."""
        self._twin_claims: dict[tuple[str, int], TwinClaim] = {}
        """(operation id, attempt) of attempts that must make no effect (`twin-effect`)."""
        self._twin_effects_seen: set[int] = set()
        self.twins: Counter[str] = Counter()
        """What the guard met: refusals, binding writes, claims beside an unsettled twin."""
        assert route.probe is not None
        self._not_applied_statuses = frozenset(route.probe.not_applied_statuses)
        self._redact = frozenset(h.lower() for h in route.redact_response_headers) | REDACTED

    def _fail(self, invariant: str, detail: str) -> None:
        self._problems.append(Problem(invariant, detail))

    def crashed(self, label: str, error: BaseException) -> None:
        self._fail("engine-crash", f"{label} raised {type(error).__name__}: {error}")

    # -- per answer ---------------------------------------------------------------------

    def observe(self, seen: AnswerSeen) -> None:
        record = seen.record
        actual = record.state.value if record is not None else None
        claimed, header = self._claimed_state(seen)
        for what, value in (("state", claimed), ("Idempotency-Status", header)):
            if value is None or value == actual or (actual is None and value == "released"):
                continue
            if seen.ambiguous_commits:
                self.excused[f"{what}: after ambiguous {seen.ambiguous_commits[-1]}"] += 1
                continue
            if seen.store_errors and value == State.UNKNOWN.value:
                # A store call of this answer failed, so the engine cannot know the record
                # now; `unknown` is the answer that never invites a blind retry.
                self.excused[f"{what}: conservative unknown after a store error"] += 1
                continue
            if (
                value == State.UNKNOWN.value
                and record is not None
                and record.id in (seen.claimed_operation, seen.sent_operation)
                and (actual == State.IN_FLIGHT.value or _mismatch_class(seen, record) == "relay")
            ):
                # Its own attempt, still unwritten, past the lease length on the replica's
                # monotonic clock: another replica may have found it expired (and someone
                # settled it since), or not; the engine cannot tell without a read, and
                # `unknown` is the answer that never invites a blind retry.
                self.excused[f"{what}: conservative unknown past its own lease"] += 1
                continue
            tag = _mismatch_class(seen, record)
            if tag in self._tolerate:
                self.excused[f"{what}: {tag} (tolerated)"] += 1
                continue
            errors = (
                f", store errors on {', '.join(seen.store_errors)}" if seen.store_errors else ""
            )
            self._fail(
                "answer-state",
                f"{seen.label} answered {what} {value!r} but the record is "
                f"{actual or 'absent'} ({_brief(record)}) [{tag}{errors}]",
            )
        if isinstance(seen.error, SimilarOperation):
            self._check_refusal(seen, seen.error)
        stale = _mismatch_class(seen, record) == "other-operation"
        if seen.fingerprint is not None and not (stale and "other-operation" in self._tolerate):
            self._check_binding(seen, record)
        if seen.reply is not None and seen.reply.replayed:
            self._check_replay(seen, record)
        elif seen.reply is not None and seen.reply.stream is None:
            about = seen.sent_operation or (record.id if record is not None else "?")
            got = (seen.reply.status, without(seen.reply.headers, self._redact), seen.reply.body)
            if got not in self._upstream.answers.get(about, []):
                self._fail(
                    "receipt-provenance",
                    f"{seen.label} relayed {got[0]} {got[2][:60]!r}, which the upstream never "
                    f"answered for {about}",
                )

    @staticmethod
    def _claimed_state(seen: AnswerSeen) -> tuple[str | None, str | None]:
        if seen.reply is not None:
            state = seen.reply.state.value if seen.reply.state is not None else None
            header = state if seen.reply.key is not None else None
            return state, header
        if seen.error is not None:
            rendered = problem_response(seen.error).headers.get(IDEMPOTENCY_STATUS)
            return seen.error.state, rendered
        if seen.operation is not None:
            return seen.operation.state.value, None
        return None, None

    def _check_binding(self, seen: AnswerSeen, record: Operation | None) -> None:
        mismatch = record is not None and record.fingerprint != seen.fingerprint
        refused = isinstance(seen.error, KeyMismatch)
        stale = _mismatch_class(seen, record) == "other-operation"
        why = " [other-operation: answered about a record the key no longer has]" if stale else ""
        if mismatch and not refused and seen.error is None:
            self._fail(
                "key-binding",
                f"{seen.label} was answered {seen.reply and seen.reply.status} although its key "
                f"is bound to another request ({_brief(record)}){why}",
            )
        if refused and not mismatch:
            self._fail(
                "key-binding",
                f"{seen.label} got 422 but the record matches its request ({_brief(record)}){why}",
            )

    def _check_refusal(self, seen: AnswerSeen, error: SimilarOperation) -> None:
        """A `similar-operation` answer is legitimate when the store refused this very
        call's claim naming that twin, an operation of the same request under another
        key, and the call sent nothing. (It has no state: nothing was recorded for the
        key, so `answer-state` has nothing to compare.)"""
        self.twins["refused similar-operation"] += 1
        named = error.extensions.get("similar_operation")
        twin_id = named.get("operation_id") if isinstance(named, dict) else None
        where = f"{seen.label} was refused similar-operation naming {twin_id!r}"
        if seen.refused_by is None or twin_id != seen.refused_by:
            self._fail("twin-effect", f"{where}, but the store refused it for {seen.refused_by!r}")
            return
        twin = self._db.rows.get(twin_id) or self._rows.get(twin_id) or self._forgotten.get(twin_id)
        if twin is None:
            self._fail("twin-effect", f"{where}, which the database never held")
        elif (twin.scope, twin.fingerprint) != (seen.scope, seen.fingerprint) or (
            twin.key == seen.key
        ):
            self._fail("twin-effect", f"{where}, which is not its request ({_brief(twin)})")
        if seen.sent_operation is not None:
            self._fail("twin-effect", f"{where} after sending {seen.sent_operation}")

    def _check_replay(self, seen: AnswerSeen, record: Operation | None) -> None:
        reply = seen.reply
        assert reply is not None
        got = (reply.status, tuple(reply.headers), reply.body)
        if record is None or record.state is not State.COMPLETED or record.response is None:
            self._fail(
                "receipt-provenance",
                f"{seen.label} replayed {got[0]} {got[2][:60]!r} but the record has no receipt "
                f"({_brief(record)})",
            )
        elif got != _stored(record.response) or not record.body_retained:
            self._fail(
                "receipt-provenance",
                f"{seen.label} replayed {got[0]} {got[2][:60]!r}, not the receipt "
                f"{record.response.status} {record.response.body[:60]!r}",
            )
        elif got not in self._given(record.id):
            self._fail(
                "receipt-provenance",
                f"{seen.label} replayed {got[0]} {got[2][:60]!r}, which neither the upstream, "
                f"a probe nor an operator ever gave for {record.id}",
            )

    def _given(self, op_id: str) -> list[tuple[int, tuple[tuple[str, str], ...], bytes]]:
        """Every response anyone gave for this operation: what a receipt may be."""
        return [
            *self._upstream.answers.get(op_id, []),
            *self._upstream.probe_answers.get(op_id, []),
            *(_stored(r) for r in self._operator_responses.get(op_id, [])),
        ]

    # -- per step --------------------------------------------------------------------------

    def after_step(self) -> list[Problem]:
        """Everything that broke since the last call (and forget it)."""
        self._upstream.follow_leases()
        history = self._db.history
        for transition in history[self._history_seen :]:
            self._check_transition(transition)
        self._history_seen = len(history)
        self._check_sends()
        self._check_effects()
        self._check_twin_effects()
        fresh = self._upstream.violations[self._upstream_problems_seen :]
        self._upstream_problems_seen = len(self._upstream.violations)
        for detail in fresh:
            self._fail("sent-released", detail)
        problems, self._problems = self._problems, []
        return problems

    def _check_effects(self) -> None:
        for op_id, effects in self._upstream.effects.items():
            allowed = 1 + self.operator_not_applied[op_id]
            if len(effects) > allowed:
                listing = ", ".join(f"E{e.number}(attempt {e.attempt}, S{e.send})" for e in effects)
                self._fail(
                    "duplicate-effect",
                    f"{op_id} has {len(effects)} effects ({listing}) but operators said "
                    f"not_applied {allowed - 1} times",
                )
                self.operator_not_applied[op_id] = len(effects)  # report each excess once

    def _check_twin_effects(self) -> None:
        for (op_id, attempt), claim in self._twin_claims.items():
            for effect in self._upstream.effects.get(op_id, ()):
                if effect.attempt != attempt or effect.number in self._twin_effects_seen:
                    continue
                self._twin_effects_seen.add(effect.number)
                t = claim.transition
                assert t.after is not None
                why = []
                if claim.twins:
                    twins = ", ".join(self._twin(twin) for twin in claim.twins)
                    why.append(f"the same request was unsettled under another key: {twins}")
                if claim.bound is not None:
                    why.append(f"its key was bound to {self._twin(claim.bound)} by a refusal")
                self._fail(
                    "twin-effect",
                    f"E{effect.number} (S{effect.send}) is an effect of attempt {attempt} of "
                    f"{op_id} (key {t.after.key}, {self._intents.get(op_id, '?')}), claimed at "
                    f"history #{t.number} by {t.notes.get('label')} without the distinct "
                    f"marker while {'; and '.join(why)}",
                )

    def _twin(self, twin: Operation) -> str:
        intent = self._intents.get(twin.id)
        return (
            f"{twin.id} (key {twin.key}, {twin.state.value} attempt {twin.attempts}"
            f"{', ' + intent if intent else ''})"
        )

    def _request(self, operation: Operation, intent: str | None = None) -> str:
        """Which request an operation is, by the truth rather than by the gateway's
        fingerprint: the agent's intended call that first claimed it (one name across
        every key and every re-serialisation of the call), else its fingerprint.

        Changed with fingerprint version 2: the same request sent in other bytes is the
        same request, so a gateway that compared bytes would see no twin where there is
        one, and an invariant keyed by the gateway's own fingerprint would agree with it.
        Where the gateway is right (version 2), both keys name the same operations."""
        intent = self._intents.get(operation.id, intent)
        return f"call {intent}" if intent else f"fingerprint {operation.fingerprint}"

    def _twin_claim(self, t: Transition, after: Operation) -> None:
        """At a claim's commit (the replayed history up to it): the same request's
        unsettled operations under other keys, within the route's window."""
        window = self._route.similar_window
        request = self._request(after, t.notes.get("intent"))
        same = self._same_request.get((after.scope, after.route, request), ())
        twins = tuple(
            twin
            for twin in (self._rows[op_id] for op_id in sorted(same))
            if twin.key != after.key
            and twin.state in UNSETTLED
            and (twin.sent_at is None or t.at - twin.sent_at < window)
        )
        bound = None
        binding, refused = self._bindings.get((after.scope, after.key), (None, None))
        same_request = binding is not None and (
            f"call {refused}" == request if refused else binding.fingerprint == after.fingerprint
        )
        if binding is not None and same_request and t.at - binding.refused_at < window:
            bound = self._rows.get(binding.twin_id)
            if bound is not None and MemoryDatabase.forgotten(bound, t.at):
                bound = None
        if not twins and bound is None:
            return
        if t.notes.get("distinct"):
            if twins:
                self.twins["claimed distinct beside an unsettled twin"] += 1
            return
        if twins:
            self.twins["claimed beside an unsettled twin"] += 1
        if bound is not None:
            self.twins["claimed under a key bound to its twin"] += 1
        self._twin_claims[(after.id, after.attempts)] = TwinClaim(t, twins, bound)

    def _replay(self, t: Transition) -> None:
        """Apply a committed write to `_rows` (after it was checked against the rows
        as they stood before it)."""
        if t.binding is not None:
            self.twins[f"{t.verb} (binding write)"] += 1
            if t.bound is None:
                self._bindings.pop(t.binding, None)
            else:
                self._bindings[t.binding] = (t.bound, t.notes.get("intent"))
            return
        if t.after is not None:
            self._rows[t.after.id] = t.after
            if t.verb == "claim" and t.after.id not in self._intents:
                intent = t.notes.get("intent")
                if intent is not None:
                    self._intents[t.after.id] = intent
            where = (t.after.scope, t.after.route, self._request(t.after))
            self._same_request.setdefault(where, set()).add(t.after.id)
        elif t.before is not None:
            self._rows.pop(t.before.id, None)
            self._forgotten[t.before.id] = t.before
            where = (t.before.scope, t.before.route, self._request(t.before))
            self._same_request.get(where, set()).discard(t.before.id)

    def _check_sends(self) -> None:
        """Each forwarded request is its record's request: the record's fingerprint is one
        of the two forms (version 2, or the bytes of version 1) computed by the production
        functions from what reached the upstream (path, query, media type and body)."""
        sends = self._upstream.sends
        for send in sends[self._sends_seen :]:
            expected = fingerprints(
                "POST", self._route.name, send.raw_path, send.query, send.content_type, send.body
            )
            if send.fingerprint is not None and send.fingerprint not in expected:
                self._fail(
                    "key-binding",
                    f"{send.label} forwarded a body that is not the request {send.operation_id} "
                    "is bound to",
                )
        self._sends_seen = len(sends)

    def _check_transition(self, t: Transition) -> None:
        try:
            self._check_write(t)
        finally:
            self._replay(t)

    def _check_write(self, t: Transition) -> None:
        before, after = t.before, t.after
        if t.verb == "claim" and after is not None and after.state is State.IN_FLIGHT:
            self._holders[(after.id, after.token)] = t.notes.get("replica")
            self._twin_claim(t, after)
        if (
            t.verb == "resolve"
            and after is not None
            and after.state is State.RELEASED
            and after.resolution is not None
            and after.resolution.by in ("owner", "admin")
        ):
            self.operator_not_applied[after.id] += 1
        if (
            after is not None
            and after.state is State.COMPLETED
            and (before is None or before.state is not State.COMPLETED)
        ):
            self._check_receipt(t, after)
        elif t.verb == "complete_late" and after is not None:
            self._check_late_receipt(t, after)
        if (
            before is not None
            and before.state is State.UNKNOWN
            and (after is None or after.state is not State.UNKNOWN)
        ):
            self._check_unknown_exit(t, before, after)
        if (
            before is not None
            and after is not None
            and after.state is State.RELEASED
            and before.state is not State.RELEASED
        ):
            self._check_release(t, before, after)

    def _check_receipt(self, t: Transition, after: Operation) -> None:
        by = after.resolution.by if after.resolution is not None else None
        response = after.response
        where = f"history #{t.number} ({t.verb} by {t.notes.get('label')})"
        if by == "upstream":
            answers = self._upstream.answers.get(after.id, [])
            if response is None:
                self._fail("receipt-provenance", f"{where}: completed by upstream with no response")
            elif after.body_retained and _stored(response) not in answers:
                self._fail(
                    "receipt-provenance",
                    f"{where}: receipt {response.status} {response.body[:60]!r} is not an answer "
                    f"the upstream gave for {after.id} ({len(answers)} answers)",
                )
            elif not after.body_retained and response.status not in {a[0] for a in answers}:
                self._fail("receipt-provenance", f"{where}: status {response.status} never given")
        elif by == "probe":
            probes = self._upstream.probe_answers.get(after.id, [])
            if response is not None and _stored(response) not in probes:
                self._fail(
                    "receipt-provenance",
                    f"{where}: probe receipt {response.body[:60]!r} is not a probe answer",
                )
        elif by in ("owner", "admin"):
            given = [_stored(r) for r in self._operator_responses.get(after.id, [])]
            if response is not None and _stored(response) not in given:
                self._fail("receipt-provenance", f"{where}: not the operator's response")
        else:
            self._fail("receipt-provenance", f"{where}: completed with resolution {by!r}")

    def _check_late_receipt(self, t: Transition, after: Operation) -> None:
        """A late answer attached to an operator's `applied` that had no receipt (new with
        `Store.complete_late`): the receipt, whoever resolved, is an upstream answer."""
        response = after.response
        answers = self._upstream.answers.get(after.id, [])
        where = f"history #{t.number} (complete_late by {t.notes.get('label')})"
        if response is None:
            self._fail("receipt-provenance", f"{where}: a late answer with no response")
        elif after.body_retained and _stored(response) not in answers:
            self._fail(
                "receipt-provenance",
                f"{where}: receipt {response.status} {response.body[:60]!r} is not an answer "
                f"the upstream gave for {after.id}",
            )
        elif not after.body_retained and response.status not in {a[0] for a in answers}:
            self._fail("receipt-provenance", f"{where}: status {response.status} never given")

    def _check_unknown_exit(
        self, t: Transition, before: Operation, after: Operation | None
    ) -> None:
        where = f"history #{t.number}: {t.verb} by {t.notes.get('label')} on {before.id}"
        if t.verb == "resolve":
            by = after.resolution.by if after is not None and after.resolution else None
            if by in ("owner", "admin"):
                return
            probe = _probe_about(t, before.id)
            if by == "probe" and probe is not None:
                if probe.token == before.token:
                    return
                self._fail(
                    "unknown-exit",
                    f"{where}: a probe verdict about token {probe.token} (attempt "
                    f"{probe.attempt}) settled token {before.token} (attempt {before.attempts})",
                )
                return
            self._fail("unknown-exit", f"{where}: resolved by {by!r} without a probe answer")
            return
        if t.verb in ("complete", "release"):
            holder = self._holders.get((before.id, before.token))
            if t.token == before.token and holder == t.notes.get("replica"):
                return
            self._fail(
                "unknown-exit",
                f"{where} with token {t.token} from {t.notes.get('replica')}; the current token "
                f"{before.token} is held by {holder}",
            )
            return
        self._fail("unknown-exit", f"{where}: {before.state.value} -> {_brief(after)}")

    def _check_release(self, t: Transition, before: Operation, after: Operation) -> None:
        sent = self._upstream.received.get((before.id, before.attempts))
        if sent is None:
            return  # never reached the upstream: releasing it is always safe
        where = (
            f"history #{t.number}: {t.verb} by {t.notes.get('label')} released attempt "
            f"{before.attempts} of {before.id}, which reached the upstream as {sent.label}"
        )
        by = after.resolution.by if t.verb == "resolve" and after.resolution else None
        if by in ("owner", "admin"):
            return
        if by == "probe":
            probe = _probe_about(t, before.id)
            bound = self._upstream.bound(before.id, before.attempts)
            made = [
                e for e in self._upstream.effects.get(before.id, ()) if e.attempt == before.attempts
            ]
            if probe is None or probe.answered_at is None:
                self._fail("sent-released", f"{where}: no probe answer behind the verdict")
            elif probe.status not in self._not_applied_statuses:
                self._fail("sent-released", f"{where}: on a probe answer of {probe.status}")
            elif probe.answered_at < bound:
                self._fail(
                    "sent-released",
                    f"{where}: on {probe.label}'s {probe.status} answered at "
                    f"+{probe.answered_at - _EPOCH:.2f}, before the upstream's bound "
                    f"+{bound - _EPOCH:.2f} for that attempt",
                )
            elif made:
                # A probe blind to the request (`gateway.engine.calibrator`) says "not
                # found" about an effect that exists: the release is a second effect waiting.
                self._fail(
                    "sent-released",
                    f"{where}: on {probe.label}'s {probe.status}, but that attempt made "
                    f"E{made[0].number} on {made[0].path}: the probe cannot see it",
                )
            return
        if (
            t.verb == "release"
            and sent.status in self._route.release_statuses
            and sent.effect == "never"
        ):
            return  # an honest refusal: the upstream said it did not and will not apply it
        self._fail("sent-released", f"{where}: {sent.label} effect={sent.effect}")


def _probe_about(t: Transition, operation_id: str) -> ProbeCall | None:
    """The last probe answer the writing call got about this operation (not a calibration's
    probe about a sample or an unused key, asked after it)."""
    probes = t.notes.get("probes") or {}
    found = probes.get(operation_id)
    return found if found is not None and found.operation_id == operation_id else None


def _mismatch_class(seen: AnswerSeen, row: Operation | None) -> str:
    """Which known kind of answer-state mismatch this is (for `--tolerate`)."""
    about = seen.error.operation_id if seen.error is not None else None
    if seen.operation is not None:
        about = seen.operation.id
    if seen.reply is not None and not seen.reply.replayed:
        about = seen.sent_operation
    if about is None and (seen.error is not None or seen.reply is not None):
        about = seen.claimed_operation  # an answer about this call's own attempt
    if about is not None and (row is None or row.id != about):
        return "other-operation"  # answered from a record the key no longer has
    if seen.reply is not None and seen.reply.stream is not None:
        return "relay"  # the status line of an answer too large to keep, before its body
    if seen.store_errors:
        return "after-store-error"
    return "plain"


def _brief(operation: Operation | None) -> str:
    if operation is None:
        return "no record"
    return (
        f"{operation.id[-6:]} {operation.state.value} attempt {operation.attempts} "
        f"token {operation.token} v{operation.version}"
    )
