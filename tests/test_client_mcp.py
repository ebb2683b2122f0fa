"""The client's `McpTool`: a `Run` whose tools are behind the gateway's MCP route.

Real software end to end, on loopback: the official MCP SDK's client (in the
test, or in an agent process, `tests/mcp_agent_script.py`), the gateway in
process with an MCP route, and the official SDK's server counting effects
(`tests/mcp_upstream.py`). Each effect must happen once, whatever the agent
suffers: a `kill -9` between an effect and its saved result, an answer lost on
the way, a client that stops waiting.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import ROOT, Finished, RunningGateway, journal_agent_args, run_agent
from idempotency_gateway_client import (
    Backoff,
    CallUnconfirmed,
    FileJournal,
    GatewayClient,
    GatewayClientError,
    KeyMismatch,
    McpSession,
    McpTool,
    OutcomeUnknown,
    PlannedCall,
    ReconciliationRequired,
    RouteSaturated,
    Run,
    RunEvent,
    ToolCall,
    ToolResult,
    Turn,
    UpstreamConnectionLost,
    mcp_result,
    mcp_tool_result,
)
from idempotency_gateway_client._mcp import mcp_receipt
from mcp.shared.exceptions import MCPError
from mcp.types import CallToolResult, RequestParamsMeta
from mcp_upstream import LEGACY, MODERN, CountingMcpServer, mcp_client
from mcp_upstream import example_mcp_server as started_example_server

PREFIX = "/tools"
TIMEOUT = 120.0
"""Bounds a hang only, of one test or one agent process. An agent takes about 2.5 s on a
quiet machine and took more than 20 s (the bound before) beside a loaded `make test`."""
AGENT = ROOT / "tests" / "mcp_agent_script.py"
TOOL_NAMES = ("create_ticket", "send_email", "lose_connection", "slow_ticket")


@pytest_asyncio.fixture
async def server() -> AsyncIterator[CountingMcpServer]:
    async with CountingMcpServer() as started:
        yield started


@pytest_asyncio.fixture
async def gateway(gateway_factory: GatewayFactory, server: CountingMcpServer) -> RunningGateway:
    """The gateway with route /tools (kind mcp) in front of the counting MCP server."""
    route = {"name": "tools", "prefix": PREFIX, "upstream": server.url, "kind": "mcp"}
    return await gateway_factory(server.url, route=route)


def fixed_plan(*turns: list[ToolCall]) -> Callable[[tuple[Turn, ...]], list[ToolCall]]:
    """A planner that returns `turns` in order, then nothing."""

    def plan(history: tuple[Turn, ...]) -> list[ToolCall]:
        return turns[len(history)] if len(history) < len(turns) else []

    return plan


def ticket(call_id: str, title: str, tool: str = "create_ticket") -> ToolCall:
    return ToolCall(call_id=call_id, name=tool, arguments={"title": title})


def structured(result: ToolResult) -> Any:
    return mcp_result(result).structured_content


async def run_to_the_end(
    gateway: RunningGateway,
    journal: Path,
    plan: Callable[[tuple[Turn, ...]], list[ToolCall]],
    *,
    tool: Callable[[McpSession], McpTool] = McpTool,
    events: list[RunEvent] | None = None,
    mode: str = LEGACY,
) -> Run:
    """One worker: a fresh gateway client, MCP session and `Run`, stepped until finished.

    What the run raises is caught inside the SDK client's block (which would wrap it in an
    ExceptionGroup) and raised again outside it, as itself.
    """
    failure: GatewayClientError | None = None
    async with (
        GatewayClient(gateway.url) as client,
        mcp_client(gateway.url + PREFIX, mode=mode) as session,
    ):
        try:
            async with Run(
                FileJournal(journal),
                client=client,
                run_id="run-1",
                flow_version="mcp-v1",
                tools={name: tool(session) for name in TOOL_NAMES},
                on_event=events.append if events is not None else None,
            ) as run:
                while not run.finished:
                    await run.step(plan)
        except GatewayClientError as exc:
            failure = exc
    if failure is not None:
        raise failure
    return run


def saved(journal: Path) -> tuple[Turn, ...]:
    document = FileJournal(journal).load("run-1")
    assert document is not None
    return document.turns


async def test_a_run_of_two_mcp_calls_runs_each_once_and_records_both(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    """Two turns, one MCP call each: both applied once, under the keys `run_id:turn:call_id`,
    both results in the journal, the second turn planned from the first's result."""

    def plan(turns: tuple[Turn, ...]) -> list[ToolCall]:
        if not turns:
            return [ticket("c1", "Printer on fire")]
        if len(turns) == 1:
            subject = "opened " + structured(turns[0].result("c1"))["id"]
            email = {"to": "oncall@example.com", "subject": subject}
            return [ToolCall(call_id="c2", name="send_email", arguments=email)]
        return []

    journal = tmp_path / "run.json"
    async with asyncio.timeout(TIMEOUT):
        await run_to_the_end(gateway, journal, plan)

        assert (server.count, len(server.calls_seen)) == (2, 2)
        assert server.tickets == [{"id": "T-1", "title": "Printer on fire"}]
        assert server.emails == [{"id": "E-1", "to": "oncall@example.com", "subject": "opened T-1"}]
        turns = saved(journal)
        assert [(p.key, p.request.method, p.request.path) for t in turns for p in t.calls] == [
            ("run-1:0:c1", "tools/call", "create_ticket"),
            ("run-1:1:c2", "tools/call", "send_email"),
        ]
        first, second = turns[0].result("c1"), turns[1].result("c2")
        assert (first.source, first.replayed, first.state) == ("response", False, "completed")
        assert structured(first) == {"id": "T-1", "title": "Printer on fire"}
        assert structured(second)["id"] == "E-1"
        assert mcp_result(first).is_error is False

        async with GatewayClient(gateway.url) as client:
            for effect, (key, tool, result) in zip(
                server.effects,
                [("run-1:0:c1", "create_ticket", first), ("run-1:1:c2", "send_email", second)],
                strict=True,
            ):
                operation = await client.lookup(key)
                assert operation is not None
                assert (operation.state, operation.attempts) == ("completed", 1)
                assert (operation.method, operation.path) == ("tools/call", tool)
                assert operation.has_receipt
                # The server got the call with the gateway's forwarded key (the operation id).
                assert (effect.tool, effect.key) == (tool, operation.id)
                # A result read back from the receipt is the same bytes as the one returned.
                receipt = mcp_receipt(operation)
                assert receipt is not None
                assert receipt.body == result.body


async def run_mcp_agent(*args: str, pause_at: str | None = None) -> Finished:
    """Run the MCP agent; with `pause_at`, kill -9 it once it reports that boundary."""
    return await run_agent(str(AGENT), *args, pause_at=pause_at, seconds=TIMEOUT)


@pytest.mark.parametrize("boundary", ["response:c1", "response:c3"])
async def test_kill_9_after_an_mcp_effect_before_its_result_is_saved_then_resume(
    boundary: str, gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    """The agent process dies right after the tool ran, before the journal has its result.
    A new process looks the call up, takes the gateway's receipt, and sends nothing twice:
    each tool runs once per call, every call ends with a result, no turn is planned twice."""
    args = journal_agent_args(gateway.url, tmp_path)
    killed = await run_mcp_agent(*args, pause_at=boundary)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    _, _, call = boundary.partition(":")
    turn = 1 if call == "c3" else 0
    assert call not in saved(tmp_path / "run.json")[turn].results  # the effect, no result

    resumed = await run_mcp_agent(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "DONE" in resumed.stdout
    assert f"EVENT lookup:{call}" in resumed.stdout
    assert f"EVENT sending:{call}" not in resumed.stdout  # looked up, never resent

    assert (server.count, len(server.calls_seen)) == (3, 3)
    assert [t["title"] for t in server.tickets] == ["first", "second"]
    assert [e["subject"] for e in server.emails] == ["opened T-1 and T-2"]
    async with asyncio.timeout(TIMEOUT), GatewayClient(gateway.url) as client:
        for key in ("run-1:0:c1", "run-1:0:c2", "run-1:1:c3"):
            operation = await client.lookup(key)
            assert operation is not None
            assert (operation.state, operation.attempts) == ("completed", 1), key
            assert sum(effect.key == operation.id for effect in server.effects) == 1
    assert (tmp_path / "plans.log").read_text().split() == ["0", "1", "2"]
    document = FileJournal(tmp_path / "run.json").load("run-1")
    assert document is not None
    assert document.finished
    assert all(t.done for t in document.turns)
    result = document.turns[turn].result(call)
    assert (result.source, result.replayed) == ("receipt", True)
    expected = {"c1": "T-1", "c3": "E-1"}[call]
    assert structured(result)["id"] == expected


async def test_an_unknown_call_pauses_the_run_and_is_not_resent_until_resolved(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    """The tool runs and its answer is lost: the run stops with the typed outcome, and the
    call after it is not sent. A resume looks it up, finds it still unknown and stops again
    without resending. Resolved `applied` with the tool result, the next resume takes it."""
    plan = fixed_plan([ticket("c1", "x", tool="lose_connection"), ticket("c2", "y")])
    journal = tmp_path / "run.json"
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(ReconciliationRequired) as stopped:
            await run_to_the_end(gateway, journal, plan)
        assert stopped.value.key == "run-1:0:c1"
        problem = stopped.value.problem
        assert isinstance(problem, OutcomeUnknown)
        assert isinstance(problem, UpstreamConnectionLost)
        assert (problem.state, problem.safe_to_retry, problem.key) == (
            "unknown",
            False,
            "run-1:0:c1",
        )
        assert (server.count, len(server.calls_seen)) == (1, 1)
        assert saved(journal)[0].results == {}  # neither call has a result; c2 was not sent

        events: list[RunEvent] = []
        with pytest.raises(ReconciliationRequired) as again:
            await run_to_the_end(gateway, journal, plan, events=events)
        assert again.value.operation is not None
        assert again.value.operation.state == "unknown"
        assert [(e.kind, e.call_id, e.state) for e in events] == [("lookup", "c1", "unknown")]
        assert (server.count, len(server.calls_seen)) == (1, 1)  # not resent

        found = {
            "content": [{"type": "text", "text": "T-1 exists"}],
            "structuredContent": {"id": "T-1", "title": "x"},
            "isError": False,
        }
        async with GatewayClient(gateway.url) as client:
            operation = await client.lookup("run-1:0:c1")
            assert operation is not None
            resolved = await client.resolve(
                "run-1:0:c1", "applied", result=found, if_match=operation.etag
            )
        assert (resolved.state, resolved.result) == ("completed", found)

        await run_to_the_end(gateway, journal, plan)
    turn = saved(journal)[0]
    assert (turn.result("c1").source, structured(turn.result("c1"))) == (
        "receipt",
        {"id": "T-1", "title": "x"},
    )
    assert structured(turn.result("c2"))["title"] == "y"
    assert (server.count, len(server.calls_seen)) == (2, 2)  # lose_connection once, c2 once


async def test_an_unknown_call_stops_the_agent_and_a_new_process_does_not_resend_it(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    """The same as an agent process: it exits for reconciliation; so does the next one,
    after a lookup, without sending anything."""
    args = [*journal_agent_args(gateway.url, tmp_path), "--first-tool", "lose_connection"]
    first = await run_mcp_agent(*args)
    assert first.returncode == 4, first.stderr
    assert "RECONCILE run-1:0:c1 upstream-connection-lost" in first.stdout
    second = await run_mcp_agent(*args)
    assert second.returncode == 4, second.stderr
    assert "RECONCILE run-1:0:c1 unknown" in second.stdout
    assert "EVENT lookup:c1" in second.stdout
    assert "EVENT sending" not in second.stdout
    assert (server.count, len(server.calls_seen)) == (1, 1)
    assert (tmp_path / "plans.log").read_text().split() == ["0"]


async def test_a_call_the_client_stops_waiting_for_is_looked_up_not_resent(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    """The SDK times out after 1 s (an MCP error, which may hide an answer); the tool takes
    3 s. The run asks the gateway, waits for the call in flight, and records its receipt.

    The SDK's timeout leaves the gateway a whole second to record the claim: with 0.3 s, a
    loaded machine (the suite on every core) sometimes looked the key up before the claim
    landed, and the run rightly refused to guess (`CallUnconfirmed`)."""
    events: list[RunEvent] = []
    journal = tmp_path / "run.json"
    slow = ToolCall(call_id="c1", name="slow_ticket", arguments={"title": "s", "seconds": 3.0})
    async with asyncio.timeout(TIMEOUT):
        await run_to_the_end(
            gateway,
            journal,
            fixed_plan([slow]),
            tool=lambda session: McpTool(session, read_timeout=1.0),
            events=events,
        )
    result = saved(journal)[0].result("c1")
    assert (result.source, structured(result)) == ("receipt", {"id": "T-1", "title": "s"})
    assert [e.state for e in events if e.kind == "lookup"] == ["in_flight", "completed"]
    assert [e.kind for e in events].count("sending") == 1
    assert (server.count, len(server.calls_seen)) == (1, 1)


class LosesTheAnswer:
    """An MCP session whose call reaches the gateway (and the tool), and whose answer is
    then lost: the SDK's error for a dropped stream."""

    def __init__(self, session: McpSession) -> None:
        self.session = session

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        await self.session.call_tool(name, arguments, read_timeout_seconds, meta=meta)
        raise MCPError(-32000, "SSE stream ended without a response")


async def test_an_answer_lost_after_the_effect_is_taken_from_the_receipt(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    journal = tmp_path / "run.json"
    async with asyncio.timeout(TIMEOUT):
        await run_to_the_end(
            gateway,
            journal,
            fixed_plan([ticket("c1", "a")]),
            tool=lambda session: McpTool(LosesTheAnswer(session)),
        )
    result = saved(journal)[0].result("c1")
    assert (result.source, structured(result)) == ("receipt", {"id": "T-1", "title": "a"})
    assert server.count == 1


async def test_an_unconfirmed_call_the_gateway_never_saw_is_left_for_the_next_resume(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path
) -> None:
    """An MCP error before anything reached the gateway: no receipt to take, so the run stops
    with CallUnconfirmed (the SDK's error as its cause), and the next resume sends the call."""

    class NeverSends:
        async def call_tool(self, *args: Any, **kwargs: Any) -> CallToolResult:
            raise MCPError(-32000, "connection refused")

    journal = tmp_path / "run.json"
    plan = fixed_plan([ticket("c1", "a")])
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(CallUnconfirmed) as unconfirmed:
            await run_to_the_end(gateway, journal, plan, tool=lambda _: McpTool(NeverSends()))
        assert unconfirmed.value.key == "run-1:0:c1"
        assert isinstance(unconfirmed.value.__cause__, MCPError)
        assert server.count == 0
        await run_to_the_end(gateway, journal, plan)
    assert saved(journal)[0].result("c1").source == "response"
    assert server.count == 1


@pytest.mark.parametrize("mode", [LEGACY, MODERN])
async def test_a_refusal_becomes_its_typed_exception(
    gateway: RunningGateway, server: CountingMcpServer, tmp_path: Path, mode: str
) -> None:
    """A reused run id with other arguments: the gateway's key-mismatch, as `KeyMismatch`,
    in both protocol generations (not the SDK's validation error)."""
    async with asyncio.timeout(TIMEOUT):
        first = fixed_plan([ticket("c1", "a")])
        await run_to_the_end(gateway, tmp_path / "a.json", first, mode=mode)
        other = fixed_plan([ticket("c1", "b")])
        with pytest.raises(KeyMismatch) as refused:
            await run_to_the_end(gateway, tmp_path / "b.json", other, mode=mode)
    assert (refused.value.status, refused.value.key) == (422, "run-1:0:c1")
    assert refused.value.safe_to_retry is False
    assert server.count == 1


def test_mcp_results_convert_both_ways() -> None:
    """`mcp_tool_result` (for `Run.record_result`) and `mcp_result` are inverses; a recorded
    JSON-RPC error comes back as the SDK's `MCPError`; the tool validates what it is given."""
    answer = {
        "content": [{"type": "text", "text": "ok"}],
        "structuredContent": {"id": "T-9"},
        "isError": False,
        "_meta": {"idempotencyReplayed": True, "trace": "t"},
    }
    result = mcp_tool_result(answer)
    assert result.source == "manual"
    assert result.body_json()["result"]["_meta"] == {"trace": "t"}  # the gateway's own removed
    assert mcp_result(result).structured_content == {"id": "T-9"}
    assert mcp_tool_result(mcp_result(result)).body == result.body
    error = ToolResult(status=200, body='{"error":{"code":-32602,"message":"no","data":{"x":1}}}')
    with pytest.raises(MCPError) as raised:
        mcp_result(error)
    assert (raised.value.code, raised.value.data) == (-32602, {"x": 1})
    with pytest.raises(ValueError, match="not an MCP tool"):
        mcp_result(ToolResult(status=201, body='{"id": "T-1"}'))
    with pytest.raises(ValueError, match="read_timeout"):
        McpTool(LosesTheAnswer(NeverCalled()), read_timeout=0)
    tool = McpTool(NeverCalled(), name="create_ticket", backoff=Backoff.none())
    request = tool.request(ToolCall(call_id="c1", name="new_ticket", arguments={"title": "t"}))
    assert (request.method, request.path, request.json_body) == (
        "tools/call",
        "create_ticket",
        {"title": "t"},
    )


class Saturated:
    """A session whose first `refusals` calls get the gateway's route-saturated refusal."""

    def __init__(self, refusals: int) -> None:
        self.refusals = refusals
        self.metas: list[Any] = []

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        self.metas.append(meta)
        if len(self.metas) <= self.refusals:
            problem = {"type": "route-saturated", "state": None, "safe_to_retry": True}
            return CallToolResult.model_validate(
                {
                    "content": [{"type": "text", "text": "busy"}],
                    "isError": True,
                    "_meta": {"idempotency": problem},
                }
            )
        return CallToolResult.model_validate({"content": [], "structuredContent": {"id": "T-1"}})


async def test_a_refusal_that_is_safe_to_retry_is_resent_with_the_same_key() -> None:
    session = Saturated(2)
    tool = McpTool(session, backoff=Backoff(initial=0.01))
    call = ticket("c1", "a")
    planned = PlannedCall(call=call, key="run-1:0:c1", request=tool.request(call))
    async with asyncio.timeout(TIMEOUT):
        result = await tool.send(planned)
        assert structured(result) == {"id": "T-1"}
        assert session.metas == [{"idempotencyKey": "run-1:0:c1"}] * 3
        with pytest.raises(RouteSaturated) as refused:
            await McpTool(Saturated(1), backoff=Backoff.none()).send(planned)
    assert (refused.value.status, refused.value.safe_to_retry) == (503, True)


class NeverCalled:
    async def call_tool(self, *args: Any, **kwargs: Any) -> CallToolResult:
        raise AssertionError("not called")


@pytest_asyncio.fixture
async def example_mcp_server() -> AsyncIterator[str]:
    """examples/mcp_server.py as `make run` starts it, on a port the OS picks."""
    async with started_example_server(TIMEOUT) as url:
        yield url


async def test_the_example_agent_crashes_after_an_mcp_effect_and_resumes(
    gateway_factory: GatewayFactory, example_mcp_server: str, tmp_path: Path
) -> None:
    """`python -m examples.agent_recovery --mcp`, the README's MCP crash and resume."""
    route = {"name": "mcp-tools", "prefix": "/mcp", "upstream": example_mcp_server, "kind": "mcp"}
    gateway = await gateway_factory(example_mcp_server, route=route)
    journal = str(tmp_path / "agent-run-mcp.json")
    args = [
        "-m",
        "examples.agent_recovery",
        "--mcp",
        "--gateway",
        gateway.url,
        "--journal",
        journal,
    ]
    crashed = await run_agent(*args, env={"CRASH_AFTER_EFFECT": "1"}, seconds=TIMEOUT)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    assert "kill -9 before its result is saved" in crashed.stdout

    resumed = await run_agent(*args, seconds=TIMEOUT)
    assert resumed.returncode == 0, resumed.stderr
    assert "-> completed" in resumed.stdout
    assert "receipt found, not sent again" in resumed.stdout
    assert "tools/call create_ticket" not in resumed.stdout
    assert resumed.stdout.count("tools/call send_email") == 1
    assert "MCP server: 1 ticket(s)" in resumed.stdout
