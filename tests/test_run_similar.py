"""`Run` meeting `similar-operation`, against a scripted gateway on loopback (no real gateway).

The gateway refuses a new key whose request is the same as another key's
operation (the twin): the key of a first attempt was lost. A `Run` must never
make that a second effect: it stops on a twin whose outcome is `unknown`
(naming the twin, the one to settle), and otherwise sends the same call under
the twin's key and takes the twin's answer as the call's result.
`test_client_similar.py` shows the same against the real gateway.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from idempotency_gateway_client import (
    Backoff,
    FileJournal,
    GatewayClient,
    HttpTool,
    McpTool,
    ReconciliationRequired,
    Run,
    RunEvent,
    SimilarOperation,
    SimilarTwin,
    ToolCall,
    Turn,
    mcp_result,
    operation_path,
)
from mcp.types import CallToolResult, RequestParamsMeta

ISSUES = "/tickets/v1/issues"
BASE = "https://idempotency-gateway.dev/problems/"
MINE = "run-1:0:c1"
"""The key the run derives for its call: new to the gateway, and refused."""
TWIN = "lost:0:c1"
"""The key of the first attempt of the same request, which the agent lost."""
TIMEOUT = 10.0
FAST = Backoff(initial=0.01, maximum=0.05)


IN_PROGRESS = {
    "type": BASE + "in-progress",
    "status": 409,
    "key": TWIN,
    "state": "in_flight",
    "safe_to_retry": True,
    "next_action": "wait",
}

OUTCOME_UNKNOWN = {
    "type": BASE + "outcome-unknown",
    "status": 409,
    "key": TWIN,
    "state": "unknown",
    "safe_to_retry": False,
    "next_action": "reconcile",
}


def similar_problem(state: str) -> dict[str, Any]:
    """The refusal as the gateway writes it: the caller's key, and the twin it names."""
    return {
        "type": BASE + "similar-operation",
        "title": "The same request is already in flight or unknown under another key",
        "status": 409,
        "detail": "the same request is another key's operation",
        "key": MINE,
        "operation": operation_path(MINE),
        "safe_to_retry": False,
        "next_action": "reconcile",
        "similar_operation": {
            "key": TWIN,
            "state": state,
            "operation": operation_path(TWIN),
            "operation_id": "op_01JDZ4W6Q8X3M2K7R5T9V0B1C2",
        },
    }


@dataclass
class Sent:
    method: str
    path: str
    key: str | None
    headers: dict[str, str]
    body: bytes


@dataclass
class ScriptedGateway:
    """Refuses `MINE` as similar to `TWIN` (in `twin_state`); answers `TWIN` with the twin's
    receipt after `in_progress` in-progress answers (or, `twin_ends_unknown`, with
    outcome-unknown); knows no operation by lookup."""

    twin_state: str
    in_progress: int = 0
    twin_ends_unknown: bool = False
    url: str = ""
    sent: list[Sent] = field(default_factory=list)

    def keys_sent(self, method: str = "POST") -> list[str | None]:
        return [request.key for request in self.sent if request.method == method]

    async def call(self, request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key")
        self.sent.append(
            Sent(request.method, request.path, key, dict(request.headers), await request.read())
        )
        if key == TWIN:
            if self.in_progress > 0:
                self.in_progress -= 1
                return problem_response(409, IN_PROGRESS)
            if self.twin_ends_unknown:
                return problem_response(409, OUTCOME_UNKNOWN)
            return web.json_response(
                {"id": "T-1", "title": "printer"},
                status=201,
                headers={"Idempotent-Replayed": "true", "Idempotency-Status": "completed"},
            )
        return problem_response(409, similar_problem(self.twin_state))

    async def lookup(self, request: web.Request) -> web.Response:
        self.sent.append(Sent("GET", request.path, request.match_info["key"], {}, b""))
        problem = {"type": BASE + "unknown-key", "status": 404, "safe_to_retry": False,
                   "next_action": "retry"}  # fmt: skip
        return problem_response(404, problem)


def problem_response(status: int, problem: dict[str, Any]) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(problem), content_type="application/problem+json"
    )


async def serve(gateway: ScriptedGateway) -> AsyncIterator[ScriptedGateway]:
    app = web.Application()
    app.router.add_post(ISSUES, gateway.call)
    app.router.add_get("/operations/{key}", gateway.lookup)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    gateway.url = f"http://{host}:{port}"
    try:
        yield gateway
    finally:
        await runner.cleanup()


@pytest_asyncio.fixture(params=["in_flight", "completed", "released"])
async def settled_or_running(request: pytest.FixtureRequest) -> AsyncIterator[ScriptedGateway]:
    """A twin whose key can be taken over (in flight: answered in-progress once first)."""
    state: str = request.param
    async for started in serve(ScriptedGateway(state, in_progress=int(state == "in_flight"))):
        yield started


@pytest_asyncio.fixture
async def unknown_twin() -> AsyncIterator[ScriptedGateway]:
    async for started in serve(ScriptedGateway("unknown")):
        yield started


@pytest_asyncio.fixture
async def http_side() -> AsyncIterator[ScriptedGateway]:
    """The gateway's HTTP side for an MCP run, which looks keys up there (none is expected)."""
    async for started in serve(ScriptedGateway("unknown")):
        yield started


def plan_once(history: tuple[Turn, ...]) -> list[ToolCall]:
    if history:
        return []
    return [ToolCall(call_id="c1", name="ticket", arguments={"title": "printer"})]


def open_run(journal: Path, gw: GatewayClient, **options: Any) -> Run:
    options.setdefault("tools", {"ticket": HttpTool("POST", ISSUES)})
    return Run(FileJournal(journal), client=gw, run_id="run-1", flow_version="v1", **options)


def assert_names_the_twin_to_settle(error: ReconciliationRequired, url: str) -> None:
    message = str(error)
    assert f"settle {TWIN} (look it up at {url}{operation_path(TWIN)})" in message, message
    assert "then resume; this call will not be sent" in message
    assert "distinct" not in message.lower()
    assert "force" not in message.lower()


async def test_a_call_whose_twin_is_unknown_stops_naming_the_twin(
    unknown_twin: ScriptedGateway, tmp_path: Path
) -> None:
    """Nothing is sent under either key: the twin's outcome must be settled first."""
    async with (
        asyncio.timeout(TIMEOUT),
        GatewayClient(unknown_twin.url, backoff=FAST) as gw,
        open_run(tmp_path / "run.json", gw) as run,
    ):
        with pytest.raises(ReconciliationRequired) as stopped:
            await run.step(plan_once)
        assert [planned.key for planned in run.pending] == [MINE]
    error = stopped.value
    assert (error.key, error.call_id) == (MINE, "c1")
    assert error.similar_operation == SimilarTwin(
        TWIN, "unknown", operation_path(TWIN), "op_01JDZ4W6Q8X3M2K7R5T9V0B1C2"
    )
    assert isinstance(error.problem, SimilarOperation)
    assert error.problem.next_action == "reconcile"
    assert_names_the_twin_to_settle(error, unknown_twin.url)
    assert unknown_twin.keys_sent() == [MINE]
    assert all("Idempotency-Distinct" not in sent.headers for sent in unknown_twin.sent)


async def test_a_call_whose_twin_can_be_taken_over_gets_the_twins_answer(
    settled_or_running: ScriptedGateway, tmp_path: Path
) -> None:
    """The same request under the twin's key (waiting while it is in flight): its answer is
    the call's result, and the journal keeps the call's own key."""
    gateway = settled_or_running
    events: list[RunEvent] = []
    async with (
        asyncio.timeout(TIMEOUT),
        GatewayClient(gateway.url, backoff=FAST) as gw,
        open_run(tmp_path / "run.json", gw, settle_timeout=5, on_event=events.append) as run,
    ):
        turn = await run.step(plan_once)
    assert turn is not None
    assert turn.calls[0].key == MINE
    result = turn.result("c1")
    assert (result.status, result.replayed, result.body_json()["id"]) == (201, True, "T-1")
    took_over = [event for event in events if event.kind == "took_over"]
    assert len(took_over) == 1
    assert (took_over[0].key, took_over[0].state) == (MINE, gateway.twin_state)
    assert took_over[0].twin is not None
    assert took_over[0].twin.key == TWIN
    assert [event.kind for event in events] == [
        "planned", "sending", "took_over", "response", "recorded",
    ]  # fmt: skip
    in_progress = int(gateway.twin_state == "in_flight")
    assert gateway.keys_sent() == [MINE] + [TWIN] * (1 + in_progress)
    mine, *as_twin = gateway.sent
    for sent in as_twin:
        assert sent.body == mine.body == b'{"title":"printer"}'
        assert sent.headers.get("Prefer") == "wait=5"
    assert all("Idempotency-Distinct" not in sent.headers for sent in gateway.sent)


async def test_a_twin_that_ends_unknown_while_taken_over_stops_naming_it(tmp_path: Path) -> None:
    """Taken over in flight, the twin's attempt then goes unknown: the run stops as on an
    unknown twin, and nothing more is sent."""
    async for gateway in serve(ScriptedGateway("in_flight", twin_ends_unknown=True)):
        async with (
            asyncio.timeout(TIMEOUT),
            GatewayClient(gateway.url, backoff=FAST) as gw,
            open_run(tmp_path / "run.json", gw) as run,
        ):
            with pytest.raises(ReconciliationRequired) as stopped:
                await run.step(plan_once)
        message = str(stopped.value)
        assert f"settle {TWIN} (look it up at {gateway.url}{operation_path(TWIN)})" in message
        assert "(outcome-unknown under its key)" in message
        assert stopped.value.similar_operation is not None
        assert stopped.value.similar_operation.key == TWIN
        assert gateway.keys_sent() == [MINE, TWIN]


async def test_a_resume_meets_the_refusal_again_and_takes_over_again(
    settled_or_running: ScriptedGateway, tmp_path: Path
) -> None:
    """A worker that died right after the refusal leaves the call without a result: the next
    one looks its key up (unknown to the gateway), sends it, and takes over as the first did."""
    gateway = settled_or_running
    journal = tmp_path / "run.json"

    def crash(event: RunEvent) -> None:
        if event.kind == "took_over":
            raise RuntimeError("killed at the takeover")

    async with asyncio.timeout(TIMEOUT), GatewayClient(gateway.url, backoff=FAST) as gw:
        async with open_run(journal, gw, on_event=crash) as run:
            with pytest.raises(RuntimeError, match="killed"):
                await run.step(plan_once)
        gateway.sent.clear()
        async with open_run(journal, gw) as run:
            recorded = await run.resume()
            assert run.turns[0].calls[0].key == MINE
    assert [result.body_json()["id"] for result in recorded] == ["T-1"]
    assert [(sent.method, sent.key) for sent in gateway.sent][:3] == [
        ("GET", MINE),
        ("POST", MINE),
        ("POST", TWIN),
    ]


class McpGateway:
    """An MCP session through the gateway: the run's key is refused as similar to `TWIN`
    (in `state`); the twin's key is answered with the twin's receipt."""

    def __init__(self, state: str) -> None:
        self.state = state
        self.keys: list[str] = []

    async def call_tool(
        self,
        name: str,
        arguments: dict[str, Any] | None = None,
        read_timeout_seconds: float | None = None,
        *,
        meta: RequestParamsMeta | None = None,
    ) -> CallToolResult:
        key = str((meta or {}).get("idempotencyKey"))
        self.keys.append(key)
        if key == TWIN:
            return CallToolResult.model_validate(
                {
                    "content": [{"type": "text", "text": "T-1"}],
                    "structuredContent": {"id": "T-1"},
                    "_meta": {"idempotencyReplayed": True},
                }
            )
        problem = {**similar_problem(self.state), "type": "similar-operation"}
        del problem["status"]  # an MCP refusal is a tool result: no HTTP status
        return CallToolResult.model_validate(
            {
                "content": [{"type": "text", "text": "similar"}],
                "isError": True,
                "_meta": {"idempotency": problem},
            }
        )


def mcp_tools(session: McpGateway) -> dict[str, McpTool]:
    return {"ticket": McpTool(session, name="create_ticket", backoff=FAST)}


async def test_an_mcp_call_whose_twin_is_unknown_stops_alike(
    http_side: ScriptedGateway, tmp_path: Path
) -> None:
    """Over MCP the refusal is an isError tool result with `_meta.idempotency`."""
    session = McpGateway("unknown")
    async with (
        asyncio.timeout(TIMEOUT),
        GatewayClient(http_side.url, backoff=FAST) as gw,
        open_run(tmp_path / "run.json", gw, tools=mcp_tools(session)) as run,
    ):
        with pytest.raises(ReconciliationRequired) as stopped:
            await run.step(plan_once)
    error = stopped.value
    assert error.similar_operation is not None
    assert error.similar_operation.key == TWIN
    assert isinstance(error.problem, SimilarOperation)
    assert (error.problem.status, error.problem.next_action) == (409, "reconcile")
    assert_names_the_twin_to_settle(error, http_side.url)
    assert session.keys == [MINE]


async def test_an_mcp_call_whose_twin_is_in_flight_takes_it_over_alike(
    http_side: ScriptedGateway, tmp_path: Path
) -> None:
    session = McpGateway("in_flight")
    async with (
        asyncio.timeout(TIMEOUT),
        GatewayClient(http_side.url, backoff=FAST) as gw,
        open_run(tmp_path / "run.json", gw, tools=mcp_tools(session)) as run,
    ):
        turn = await run.step(plan_once)
    assert turn is not None
    assert turn.calls[0].key == MINE
    assert mcp_result(turn.result("c1")).structured_content == {"id": "T-1"}
    assert session.keys == [MINE, TWIN]
    assert http_side.sent == []  # nothing over HTTP: no lookup was needed
