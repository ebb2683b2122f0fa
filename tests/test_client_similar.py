"""A `Run` against the real gateway's similar-operation guard, with the counting upstream.

An agent lost the key of its first attempt (a crash before its journal was
written) and plans the same call again: the run derives a new key, which the
gateway refuses as the same request as the first attempt's operation (the
twin). The run never makes that a second effect: on an `unknown` twin it stops
naming the twin (and, once the twin is settled, takes its receipt); on an
`in_flight` twin it takes the twin's key over and gets the twin's answer.
`test_run_similar.py` covers the same rules on a scripted gateway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from harness import RunningGateway
from idempotency_gateway_client import (
    Backoff,
    FileJournal,
    GatewayClient,
    HttpTool,
    ReconciliationRequired,
    Run,
    RunEvent,
    SimilarOperation,
    StoredResponse,
    ToolCall,
    Turn,
    UpstreamConnectionLost,
    operation_path,
)
from upstream import CountingUpstream

ISSUES = "/tickets/v1/issues"
BODY = {"title": "printer on fire"}
LOST = "lost:0:c1"
"""The key of the first attempt, which the agent lost before its journal had it."""
MINE = "run-1:0:c1"
TIMEOUT = 30.0


@pytest_asyncio.fixture
async def gw(gateway: RunningGateway) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(gateway.url, backoff=Backoff(initial=0.05, maximum=0.2)) as client:
        yield client


def plan_once(history: tuple[Turn, ...]) -> list[ToolCall]:
    """The same call as the lost first attempt: the same tool, the same arguments."""
    return [] if history else [ToolCall(call_id="c1", name="ticket", arguments=BODY)]


def open_run(journal: Path, gw: GatewayClient, path: str, **options: Any) -> Run:
    tools = {"ticket": HttpTool("POST", path)}
    return Run(FileJournal(journal), client=gw, run_id="run-1", flow_version="v1", tools=tools,
               **options)  # fmt: skip


async def test_a_run_whose_call_meets_an_unknown_twin_stops_naming_it(
    gateway: RunningGateway, gw: GatewayClient, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """Stopped, nothing sent; once the twin is settled, the resumed run takes its receipt."""
    path = ISSUES + "?drop=after_effect"
    journal = tmp_path / "run.json"
    async with asyncio.timeout(TIMEOUT):
        with pytest.raises(UpstreamConnectionLost):
            await gw.request("POST", path, key=LOST, json=BODY, backoff=Backoff.none())
        async with open_run(journal, gw, path) as run:
            with pytest.raises(ReconciliationRequired) as stopped:
                await run.step(plan_once)
        error = stopped.value
        assert (error.key, error.call_id) == (MINE, "c1")
        assert error.similar_operation is not None
        assert (error.similar_operation.key, error.similar_operation.state) == (LOST, "unknown")
        assert isinstance(error.problem, SimilarOperation)
        assert error.problem.next_action == "reconcile"
        assert f"settle {LOST} (look it up at {gateway.url}{operation_path(LOST)})" in str(error)
        assert "distinct" not in str(error).lower()
        assert upstream.count == 1
        assert await gw.lookup(MINE) is None  # nothing was recorded under the run's key

        unknown = await gw.lookup(LOST)
        assert unknown is not None
        receipt = StoredResponse(status=201, headers={"content-type": "application/json"},
                                 body='{"id": "T-9"}')  # fmt: skip
        await gw.resolve(LOST, "applied", response=receipt, if_match=unknown.etag)
        async with open_run(journal, gw, path) as run:
            [result] = await run.resume()
            assert run.turns[0].calls[0].key == MINE
    assert (result.status, result.replayed, result.body_json()) == (201, True, {"id": "T-9"})
    assert upstream.count == 1


async def test_a_run_whose_call_meets_an_in_flight_twin_takes_it_over(
    gw: GatewayClient, upstream: CountingUpstream, tmp_path: Path
) -> None:
    """The call waits under the twin's key and gets the twin's answer: one effect."""
    path = ISSUES + "?hold=1"
    events: list[RunEvent] = []
    async with asyncio.timeout(TIMEOUT):
        first = asyncio.ensure_future(gw.request("POST", path, key=LOST, json=BODY))
        await upstream.wait_for_held(1)

        def release_on_takeover(event: RunEvent) -> None:
            """The first attempt completes a moment after the takeover is sent, which
            meanwhile waits on the in-flight twin (`Prefer: wait`)."""
            events.append(event)
            if event.kind == "took_over":
                asyncio.get_running_loop().call_later(0.5, upstream.release_held)

        async with open_run(tmp_path / "run.json", gw, path, on_event=release_on_takeover) as run:
            turn = await run.step(plan_once)
        original = await first
    assert turn is not None
    assert turn.calls[0].key == MINE
    result = turn.result("c1")
    assert (original.status, original.replayed) == (201, False)
    assert (result.status, result.replayed) == (201, True)
    assert result.body_bytes() == original.body
    [took_over] = [event for event in events if event.kind == "took_over"]
    assert (took_over.key, took_over.state) == (MINE, "in_flight")
    assert took_over.twin is not None
    assert took_over.twin.key == LOST
    assert upstream.count == 1
