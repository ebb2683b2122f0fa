"""The engine calls the simulator starts, and how each answer is observed.

Every call runs in its own task on one replica (`Replica.start`). The moment
the engine returns (an answer or a `GatewayError`), the record is read from
the memory database without awaiting anything, and both go to the
invariants: that is what makes "the answer's state is the record's state"
checkable at all. What the call's context collected on the way (store
faults that hit it, the attempt it was granted, the upstream answer it got)
goes along, so a mismatch can be classified.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gateway.engine.errors import GatewayError
from gateway.engine.models import Operation, State, StoredResponse
from tests.simulation.context import CALL, CallContext, OperatorVerdict
from tests.simulation.invariants import AnswerSeen

if TYPE_CHECKING:
    from gateway.engine.exchange import ProxyRequest
    from gateway.engine.models import ResolvedBy
    from tests.simulation.clock import WorldClock
    from tests.simulation.invariants import Invariants
    from tests.simulation.memory_store import MemoryDatabase
    from tests.simulation.replica import Replica
    from tests.simulation.upstream import ScriptedUpstream

__all__ = ["EngineCalls", "Intent"]

Note = Callable[[str], None]


@dataclass(frozen=True, slots=True)
class Intent:
    """The agent's intended call a request is, and the key it goes under this time.

    `name` stays the same across every key the agent uses for the call (a lost key's
    fresh one too), which is how the `twin-effect` invariant tells which operations
    are one request."""

    name: str
    key: str
    distinct: bool = False
    """The agent marked this key's requests distinct (`Idempotency-Distinct: ?1`)."""
    fresh: bool = False
    """This request is the first under a fresh key (the agent lost the earlier ones)."""


class EngineCalls:
    """The coroutines behind the simulator's request, lookup, operator and background steps."""

    def __init__(
        self,
        *,
        db: MemoryDatabase,
        world: WorldClock,
        upstream: ScriptedUpstream,
        invariants: Invariants,
        operator_responses: dict[str, list[StoredResponse]],
        note: Note,
    ) -> None:
        self._db = db
        self._world = world
        self._upstream = upstream
        self._invariants = invariants
        self._operator_responses = operator_responses
        self._note = note

    def _row(self, scope: str, key: str) -> Operation | None:
        """The key's record right now, forgotten or not (never awaits)."""
        op_id = self._db.by_key.get((scope, key))
        return None if op_id is None else self._db.rows[op_id]

    def _observe(self, seen: AnswerSeen, call: CallContext) -> None:
        seen.ambiguous_commits = list(call.ambiguous_commits)
        seen.store_errors = list(call.store_errors)
        seen.sent_operation = call.send.operation_id if call.send is not None else None
        seen.claimed_operation = call.claimed
        seen.refused_by = call.refused_by
        self._invariants.observe(seen)

    async def request(
        self,
        replica: Replica,
        label: str,
        request: ProxyRequest,
        via_receipt: bool,
        *,
        intent: Intent | None = None,
    ) -> None:
        """A protected request, first through `answer_from_receipt` when the HTTP layer would."""
        call = _current()
        if intent is not None:
            call.intent, call.distinct = intent.name, intent.distinct
        seen = AnswerSeen(label, request.scope, request.key, request.fingerprint, record=None)
        reply = None
        try:
            if via_receipt:
                reply = replica.engine.answer_from_receipt(request)
            if reply is None:
                reply = await replica.engine.execute(request)
        except GatewayError as error:
            seen.record, seen.error = self._row(request.scope, request.key), error
        else:
            seen.record, seen.reply = self._row(request.scope, request.key), reply
        self._observe(seen, call)
        self._note(f"  -> {label}: {outcome(seen)}")
        if reply is not None and reply.stream is not None:
            # An answer too large to keep: the caller reads it to its end, which ends
            # the attempt (and records it), as `gateway.proxy.view.write_reply` does.
            try:
                async for _ in reply.stream:
                    pass
            except GatewayError as error:
                self._note(f"  -> {label}: relay cut: {type(error).__name__}")
            finally:
                if reply.close is not None:
                    reply.close()

    async def lookup(self, replica: Replica, label: str, scope: str, key: str) -> None:
        """`GET /operations/{key}`: brings the record up to date, may probe."""
        call = _current()
        seen = AnswerSeen(label, scope, key, None, record=None)
        try:
            operation = await replica.engine.lookup(scope, key)
        except GatewayError as error:
            seen.record, seen.error = self._row(scope, key), error
        else:
            seen.record, seen.operation = self._row(scope, key), operation
        self._observe(seen, call)
        self._note(f"  -> {label}: {outcome(seen)}")

    async def operator(
        self,
        replica: Replica,
        label: str,
        scope: str,
        key: str,
        by: ResolvedBy,
        *,
        with_version: bool,
        with_response: bool,
        insist: bool,
    ) -> None:
        """An operator looks the key up, checks the upstream, and says what it sees there.

        Truthful at the moment it decides: `applied` when the upstream holds an
        effect for the operation, else `not_applied` (an effect may still land
        later; the duplicate-effect invariant allows one per such verdict).
        `insist` resolves even what is not unknown (the engine must refuse).
        """
        call = _current()
        try:
            operation = await replica.engine.lookup(scope, key)
        except GatewayError as error:
            self._note(f"  -> {label}: lookup failed: {type(error).__name__}")
            return
        if operation is None or (operation.state is not State.UNKNOWN and not insist):
            state = operation.state.value if operation else "no record"
            self._note(f"  -> {label}: nothing to resolve ({state})")
            return
        effects = self._upstream.effect_count(operation.id)
        call.operator = OperatorVerdict(operation.id, effects > 0, effects, self._world.now)
        response = None
        if effects and with_response:
            body = f'{{"operator":"{by}","effects":{effects}}}'.encode()
            response = StoredResponse(200, (("content-type", "application/json"),), body)
            self._operator_responses.setdefault(operation.id, []).append(response)
        verdict = "applied" if effects else "not_applied"
        seen = AnswerSeen(label, scope, key, None, record=None)
        try:
            resolved = await replica.engine.resolve(
                operation,
                outcome=verdict,
                by=by,
                response=response,
                note="simulated operator",
                expected_version=operation.version if with_version else None,
            )
        except GatewayError as error:
            seen.record, seen.error = self._row(scope, key), error
        else:
            seen.record, seen.operation = self._row(scope, key), resolved
        self._observe(seen, call)
        self._note(f"  -> {label}: said {verdict} ({effects} effects): {outcome(seen)}")

    async def quietly(self, label: str, work: Callable[[], Awaitable[Any]]) -> None:
        """A background call: a store outage is an expected answer, anything else a crash."""
        try:
            result = await work()
        except GatewayError as error:
            self._note(f"  -> {label}: {type(error).__name__}")
        else:
            if result is not None and not isinstance(result, int | float):
                result = type(result).__name__
            self._note(f"  -> {label}: done{'' if result is None else f' ({result})'}")


def _current() -> CallContext:
    call = CALL.get()
    assert call is not None, "engine calls run in a task started by Replica.start"
    return call


def outcome(seen: AnswerSeen) -> str:
    """One trace line's worth of an answer and the record it met."""
    record = seen.record
    where = (
        f"[record {record.state.value} a{record.attempts} t{record.token}]"
        if record is not None
        else "[no record]"
    )
    if seen.error is not None:
        return f"{type(seen.error).__name__} state={seen.error.state} {where}"
    if seen.reply is not None:
        reply = seen.reply
        kind = "replay" if reply.replayed else ("relay" if reply.stream is not None else "fresh")
        state = reply.state.value if reply.state else None
        return f"{reply.status} {kind} state={state} {where}"
    if seen.operation is not None:
        return f"operation {seen.operation.state.value} {where}"
    return f"nothing {where}"
