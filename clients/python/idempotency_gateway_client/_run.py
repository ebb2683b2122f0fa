"""`Run`: an agent loop that survives `kill -9` without repeating or losing an effect.

The recovery protocol, in the order a step applies it:

1. Persist the model's decision (the turn's calls, and the exact request each
   becomes) before any tool runs, so a restart never asks the model again.
2. One stable key per effect, `run_id:turn:call_id`, sent on every attempt.
3. Persist each result before the next call.
4. After a restart, for each call without a result, ask the gateway first:
   `completed` -> take the receipt; `in_flight` -> wait; `released` or 404 ->
   send; `unknown` -> stop (`ReconciliationRequired`), never resend. MCP
   calls (`McpTool`) are looked up the same way: the gateway keeps their
   JSON-RPC answer as the receipt.
5. A call the gateway refuses as the same request as another key's operation
   (`similar-operation`: the key of an earlier attempt was lost) is never sent
   as a second effect: a twin whose outcome is `unknown` stops the run
   (`ReconciliationRequired`, naming the twin); any other twin's key is taken
   over, the call sent under it, and its answer (the twin's receipt, once it
   is done) is the call's result.
6. A call whose key the gateway holds for another request whose call is still
   `in_flight` or `unknown` (`key-mismatch-unsettled`) stops the run as an
   unknown outcome does (`ReconciliationRequired`): that earlier call may have
   happened, so nothing is sent, under this key or a new one. A `key-mismatch`
   (the first call settled) is raised as it is: the plan is wrong.
7. The journal is pinned to one flow version, and one worker holds the run's
   lease (with a fencing token) at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Self

from idempotency_gateway_client._client import BODILESS_METHODS
from idempotency_gateway_client._events import EventKind, RunEvent, RunObserver
from idempotency_gateway_client._exceptions import (
    CallUnconfirmed,
    GatewayProblem,
    JournalError,
    KeyMismatchUnsettled,
    OutcomeUnknown,
    ReceiptExpired,
    ReceiptNotRetained,
    ReconciliationRequired,
    RunLeaseLost,
    SimilarOperation,
)
from idempotency_gateway_client._journal import JournalStore, Worker
from idempotency_gateway_client._keys import derive_key, operation_path
from idempotency_gateway_client._mcp import MCP_METHOD, mcp_receipt
from idempotency_gateway_client._models import Operation, SimilarTwin
from idempotency_gateway_client._records import (
    JournalDocument,
    PlannedCall,
    ToolCall,
    ToolRequest,
    ToolResult,
    Turn,
)
from idempotency_gateway_client._tools import SendingTool

if TYPE_CHECKING:
    from types import TracebackType

    from idempotency_gateway_client._client import GatewayClient
    from idempotency_gateway_client._tools import Planner, Tool

__all__ = ["Run"]

MAX_TAKEOVERS = 3
"""Twins followed for one call: the twin's key may itself be refused in a third key's name."""


class Run:
    """One run of an agent, advanced one turn at a time through the gateway.

    Entering the context takes the run's lease (`RunLeased` if another live
    worker holds it; `IncompatibleJournal` if the journal was written for
    another `flow_version`) and keeps renewing it; leaving releases it.

    >>> async with Run(journal, client=gw, run_id="run-77", flow_version="triage-v1",
    ...                tools={"create_ticket": HttpTool("POST", "/tickets/v1/issues")}) as run:
    ...     while not run.finished:
    ...         await run.step(plan)  # plan(turns) -> the model's next tool calls
    """

    def __init__(
        self,
        journal: JournalStore,
        *,
        client: GatewayClient,
        run_id: str,
        flow_version: str,
        tools: Mapping[str, Tool],
        worker: str | None = None,
        lease_duration: float = 30.0,
        settle_timeout: float = 60.0,
        on_event: RunObserver | None = None,
    ) -> None:
        derive_key(run_id, 0, "check")  # refuse a run id that cannot make keys, now
        if not flow_version:
            raise ValueError("flow_version may not be empty")
        if lease_duration <= 0:
            raise ValueError(f"lease_duration must be > 0 seconds, got {lease_duration!r}")
        if settle_timeout < 0:
            raise ValueError(f"settle_timeout must be >= 0 seconds, got {settle_timeout!r}")
        self.journal = journal
        self.client = client
        self.run_id = run_id
        self.flow_version = flow_version
        self.tools = dict(tools)
        self.worker = Worker.current(worker)
        self.lease_duration = lease_duration
        self.settle_timeout = settle_timeout
        self._on_event = on_event
        self._document: JournalDocument | None = None
        self._write_lock = asyncio.Lock()
        self._keeper: asyncio.Task[None] | None = None
        self._closing = asyncio.Event()
        self._lost: RunLeaseLost | None = None

    def __repr__(self) -> str:
        turns = len(self._document.turns) if self._document else None
        return (
            f"<Run {self.run_id!r} flow={self.flow_version!r} turns={turns} "
            f"worker={self.worker.name!r}>"
        )

    async def __aenter__(self) -> Self:
        self._document = await asyncio.to_thread(
            self.journal.acquire,
            self.run_id,
            self.flow_version,
            self.worker,
            duration=self.lease_duration,
        )
        self._closing.clear()
        self._keeper = asyncio.create_task(self._keep_lease(), name=f"lease keeper {self.run_id}")
        if self._document.finished:
            # A rerun of a finished run does nothing: it says so, rather than nothing at all.
            self._emit("finished")
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._keeper is not None:
            # Not cancelled: a renewal in progress finishes before the release below.
            self._closing.set()
            await self._keeper
            self._keeper = None
        document, self._document = self._document, None
        if document is not None and self._lost is None:
            async with self._write_lock:
                with contextlib.suppress(RunLeaseLost):
                    await asyncio.to_thread(self.journal.release, document)

    @property
    def document(self) -> JournalDocument:
        """The journal as this worker last wrote it."""
        if self._document is None:
            raise RuntimeError("use the Run as `async with Run(...) as run:` first")
        return self._document

    @property
    def turns(self) -> tuple[Turn, ...]:
        return self.document.turns

    @property
    def finished(self) -> bool:
        return self.document.finished

    @property
    def pending(self) -> tuple[PlannedCall, ...]:
        """Calls of the current turn without a recorded result."""
        current = self.document.current
        return current.pending if current is not None else ()

    async def step(self, plan: Planner) -> Turn | None:
        """Advance one turn: settle what an earlier worker left, plan, execute, record.

        The planner is asked only when every saved call has its result; an
        empty plan finishes the run (and returns None).
        """
        if self.finished:
            return None
        await self.resume()
        decided = plan(self.turns)
        calls: Sequence[ToolCall] = await decided if inspect.isawaitable(decided) else decided
        if not calls:
            await self._save(self.document.model_copy(update={"finished": True}))
            self._emit("finished")
            return None
        turn = Turn(index=len(self.turns), calls=self._bind(len(self.turns), calls))
        await self._save(self.document.with_turn(turn))
        self._emit("planned", turn=turn.index)
        for planned in turn.calls:
            await self._send(turn.index, planned)
        return self.turns[turn.index]

    async def resume(self) -> tuple[ToolResult, ...]:
        """Settle every call of the current turn that has no result, asking the gateway first.

        Returns the results recorded now. Raises `ReconciliationRequired` for a
        call whose outcome nobody knows, leaving it (and the calls after it)
        without a result for the next resume.
        """
        current = self.document.current
        if current is None:
            return ()
        recorded: list[ToolResult] = []
        for planned in current.pending:
            receipt = await self._look_up(current.index, planned)
            if receipt is not None:
                recorded.append(await self._record(current.index, planned, receipt))
            else:
                recorded.append(await self._send(current.index, planned))
        return tuple(recorded)

    async def record_result(self, call_id: str, result: ToolResult) -> None:
        """Record a result found by hand (after reconciliation) for a call of the current turn."""
        current = self.document.current
        planned = next((c for c in self.pending if c.call_id == call_id), None)
        if current is None or planned is None:
            raise ValueError(f"no call {call_id!r} without a result in the current turn")
        await self._record(current.index, planned, result.model_copy(update={"source": "manual"}))

    def _bind(self, turn: int, calls: Sequence[ToolCall]) -> tuple[PlannedCall, ...]:
        seen: set[str] = set()
        planned = []
        for call in calls:
            if call.call_id in seen:
                raise ValueError(f"turn {turn}: call id {call.call_id!r} appears twice")
            seen.add(call.call_id)
            tool = self.tools.get(call.name)
            if tool is None:
                raise ValueError(f"turn {turn}: no tool {call.name!r}; tools: {sorted(self.tools)}")
            key = derive_key(self.run_id, turn, call.call_id)
            request = tool.request(call)
            _check_sendable(turn, call, request)
            planned.append(PlannedCall(call=call, key=key, request=request))
        return tuple(planned)

    async def _look_up(self, turn: int, planned: PlannedCall) -> ToolResult | None:
        """The receipt of a call an earlier attempt may have sent; None: send it."""
        operation = await self.client.lookup(planned.key)
        self._emit("lookup", turn=turn, call=planned, state=_state(operation))
        if operation is not None and operation.state == "in_flight":
            operation = await self.client.wait_settled(planned.key, seconds=self.settle_timeout)
            self._emit("lookup", turn=turn, call=planned, state=_state(operation))
        if operation is None or operation.state in ("released", "in_flight"):
            return None  # still in flight: sending waits on the gateway's `in-progress` answers
        _check_same_request(planned, operation)
        if operation.state == "unknown":
            raise ReconciliationRequired(
                f"{planned.key}: the gateway does not know whether {planned.call.name} took "
                "effect (state unknown); resolve it (probe, GatewayClient.resolve or an "
                "operator), then resume. It will not be resent",
                key=planned.key,
                call_id=planned.call_id,
                operation=operation,
            )
        receipt = _receipt(operation)
        if receipt is None:
            raise ReconciliationRequired(
                f"{planned.key}: {planned.call.name} took effect, but its receipt is gone "
                "(expired or too large to keep); read the result from the tool and record it "
                "with Run.record_result. It will not be resent",
                key=planned.key,
                call_id=planned.call_id,
                operation=operation,
            )
        return receipt

    async def _send(self, turn: int, planned: PlannedCall) -> ToolResult:
        self._emit("sending", turn=turn, call=planned)
        try:
            result = await self._deliver(planned)
        except SimilarOperation as refused:
            result = await self._take_over(turn, planned, refused)
        except KeyMismatchUnsettled as problem:
            # Not a request to fix under a new key: if both requests meant this effect,
            # a new key would make it twice. Settled first, as an unknown outcome is.
            raise ReconciliationRequired(
                f"{planned.key}: the key was first used with another request, whose call is "
                f"{problem.state or 'unsettled'}: it may have taken effect ({problem.kind}); "
                f"{planned.call.name} was not sent, and will not be under this key or a new "
                "one. Settle that earlier call (look it up at "
                f"{self.client.base_url}{operation_path(planned.key)}), then resume",
                key=planned.key,
                call_id=planned.call_id,
                problem=problem,
            ) from problem
        except (OutcomeUnknown, ReceiptExpired, ReceiptNotRetained) as problem:
            raise ReconciliationRequired(
                f"{planned.key}: {planned.call.name} may have taken effect and no receipt says "
                f"what it returned ({problem.kind}); it will not be resent. Reconcile, then resume",
                key=planned.key,
                call_id=planned.call_id,
                problem=problem,
            ) from problem
        except CallUnconfirmed as unconfirmed:
            # What came back may hide an answer the gateway recorded: ask it, as a resume would.
            receipt = await self._look_up(turn, planned)
            if receipt is None:
                raise unconfirmed from unconfirmed.__cause__
            return await self._record(turn, planned, receipt)
        self._emit("response", turn=turn, call=planned, result=result)
        return await self._record(turn, planned, result)

    async def _take_over(
        self, turn: int, planned: PlannedCall, refused: SimilarOperation, taken: int = 0
    ) -> ToolResult:
        """The call's result through the key of the twin the gateway named, never a second send.

        The gateway refused the planned key because the same request already is
        another key's operation (most likely an attempt whose key was lost). A
        twin whose outcome is `unknown` must be settled first; any other twin is
        this call's effect: the same request is sent under the twin's key, and
        the gateway answers with the twin's receipt (waiting while it is in
        flight), or sends it under that key if the twin was released. The
        journal keeps the planned key; a resume meets the refusal again and
        takes over again.
        """
        twin = refused.similar_operation
        if twin is None or twin.state == "unknown":
            raise self._settle_twin(planned, refused, twin, "whose outcome is unknown")
        if taken >= MAX_TAKEOVERS:
            why = f"after {taken} other keys of the same request in a row"
            raise self._settle_twin(planned, refused, twin, why)
        self._emit("took_over", turn=turn, call=planned, state=twin.state, twin=twin)
        as_twin = planned.model_copy(update={"key": twin.key})
        try:
            # The twin may be (or be again) in flight: wait for its answer as for a call
            # another worker left in flight.
            return await self._deliver(as_twin, wait=self.settle_timeout or None)
        except SimilarOperation as again:
            return await self._take_over(turn, planned, again, taken + 1)
        except (
            OutcomeUnknown,
            KeyMismatchUnsettled,
            ReceiptExpired,
            ReceiptNotRetained,
        ) as problem:
            why = f"of which no receipt says what it returned ({problem.kind} under its key)"
            raise self._settle_twin(planned, problem, twin, why) from problem
        except CallUnconfirmed as unconfirmed:
            receipt = await self._look_up(turn, as_twin)
            if receipt is None:
                raise unconfirmed from unconfirmed.__cause__
            return receipt

    def _settle_twin(
        self,
        planned: PlannedCall,
        problem: GatewayProblem,
        twin: SimilarTwin | None,
        why: str,
    ) -> ReconciliationRequired:
        """Stop: the call's effect is the twin's, and no receipt of the twin says what it was."""
        if twin is None:
            settle = (
                "another key's operation, which it did not name; find that operation, settle it"
            )
        else:
            settle = (
                f"{twin.key}, {why}; settle {twin.key} (look it up at "
                f"{self.client.base_url}{twin.operation})"
            )
        return ReconciliationRequired(
            f"{planned.key}: the gateway refused {planned.call.name} as the same request as "
            f"{settle}, then resume; this call will not be sent",
            key=planned.key,
            call_id=planned.call_id,
            problem=problem,
            similar_operation=twin,
        )

    async def _deliver(self, planned: PlannedCall, *, wait: float | None = None) -> ToolResult:
        """Send the planned request: by the tool itself (MCP), else through the HTTP client.

        `wait` asks the gateway to hold the answer of an attempt in flight (HTTP only;
        an MCP tool resends on `in-progress` under its backoff).
        """
        tool = self.tools.get(planned.call.name)
        if isinstance(tool, SendingTool):
            return await tool.send(planned)
        request = planned.request
        if request.method == MCP_METHOD:
            raise ValueError(
                f"{planned.key}: the plan holds an MCP call of {planned.call.name!r}, but "
                f"that tool is now {tool!r}; an MCP call is sent by an McpTool"
            )
        response = await self.client.request(
            request.method,
            request.path,
            key=planned.key,
            json=request.json_body,
            headers=request.headers,
            wait=wait,
        )
        headers: dict[str, str] = {}
        for name, value in response.headers.items():
            lower = name.lower()
            headers[lower] = f"{headers[lower]}, {value}" if lower in headers else value
        return ToolResult.from_bytes(
            response.status,
            headers,
            response.body,
            replayed=response.replayed,
            state=response.state,
            source="response",
        )

    async def _record(self, turn: int, planned: PlannedCall, result: ToolResult) -> ToolResult:
        current = self.turns[turn]
        results = {**current.results, planned.call_id: result}
        updated = current.model_copy(update={"results": results})
        await self._save(self.document.with_turn(updated))
        self._emit("recorded", turn=turn, call=planned, result=result)
        return result

    async def _save(self, document: JournalDocument) -> None:
        if self._lost is not None:
            raise self._lost
        async with self._write_lock:
            try:
                self._document = await asyncio.to_thread(
                    self.journal.write, document, duration=self.lease_duration
                )
            except RunLeaseLost as exc:
                self._lost = exc
                raise

    async def _keep_lease(self) -> None:
        """Renew the lease every third of its duration while the run is open."""
        while self._lost is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.lease_duration / 3):
                    await self._closing.wait()
                return
            # Under the lock, and re-reading the document there: a renewal must
            # never write back a document older than a save that just finished.
            async with self._write_lock:
                try:
                    self._document = await asyncio.to_thread(
                        self.journal.write, self.document, duration=self.lease_duration
                    )
                except RunLeaseLost as exc:
                    self._lost = exc  # raised by the next save
                except (JournalError, OSError):
                    pass  # disk full, lock busy: the next period tries again

    def _emit(
        self,
        kind: EventKind,
        *,
        turn: int | None = None,
        call: PlannedCall | None = None,
        state: str | None = None,
        result: ToolResult | None = None,
        twin: SimilarTwin | None = None,
    ) -> None:
        if self._on_event is not None:
            event = RunEvent(
                kind, self.run_id, turn=turn, call=call, state=state, result=result, twin=twin
            )
            self._on_event(event)


def _state(operation: Operation | None) -> str:
    return operation.state if operation is not None else "absent"


def _receipt(operation: Operation) -> ToolResult | None:
    """The result a completed operation's receipt stands for; None when it is gone."""
    if operation.method == MCP_METHOD:
        return mcp_receipt(operation)
    response = operation.response
    if response is None:
        return None
    return ToolResult(
        status=response.status,
        headers=response.headers,
        body=response.body,
        body_encoding=response.body_encoding,
        replayed=True,
        state="completed",
        source="receipt",
    )


def _check_sendable(turn: int, call: ToolCall, request: ToolRequest) -> None:
    """A tool's GET or HEAD with a body is refused before the plan is saved.

    No client would send it (`BODILESS_METHODS`): saved, it would stop this
    run at every attempt to send it.
    """
    method = request.method.upper()
    if method in BODILESS_METHODS and request.json_body is not None:
        raise ValueError(
            f"turn {turn}: tool {call.name!r} made a {method} request with a body; "
            f"a {method} request has no body (json None)"
        )


def _check_same_request(planned: PlannedCall, operation: Operation) -> None:
    """A receipt is taken only for the request the plan names (a reused run id would differ)."""
    path = planned.request.path.split("?", 1)[0]
    if operation.method != planned.request.method or operation.path != path:
        raise ReconciliationRequired(
            f"{planned.key}: the gateway recorded {operation.method} {operation.path} under this "
            f"key, but the plan sends {planned.request.method} {path}; was the run id reused?",
            key=planned.key,
            call_id=planned.call_id,
            operation=operation,
        )
