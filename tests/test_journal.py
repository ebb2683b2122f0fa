"""The run journal and `Run`, in process, against a real gateway and counting upstream.

Crashes are simulated here by an observer that raises at a step boundary (the
`Run` is then left like a dead worker's); `test_agent_recovery.py` does the
same with `kill -9`.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from conftest import GatewayFactory
from harness import RunningGateway
from idempotency_gateway_client import (
    FileJournal,
    GatewayClient,
    HttpTool,
    IncompatibleJournal,
    JournalCorrupt,
    JournalStore,
    ReconciliationRequired,
    Run,
    RunEvent,
    RunLeased,
    RunLeaseLost,
    SqliteJournal,
    StoredResponse,
    Tool,
    ToolCall,
    ToolRequest,
    ToolResult,
    Turn,
    Worker,
)
from upstream import CountingUpstream

ISSUES = "/tickets/v1/issues"
Stores = Callable[[], JournalStore]


class Crash(Exception):
    """Raised by an observer to stop a run dead at a step boundary."""


def crash_at(kind: str, call_id: str | None = None) -> Callable[[RunEvent], None]:
    def observe(event: RunEvent) -> None:
        if event.kind == kind and (call_id is None or event.call_id == call_id):
            raise Crash(f"{kind} {call_id}")

    return observe


def fixed_plan(*turns: list[ToolCall]) -> Callable[[tuple[Turn, ...]], list[ToolCall]]:
    """A planner that returns `turns` in order, then nothing; it records each call."""

    def plan(history: tuple[Turn, ...]) -> list[ToolCall]:
        plan.calls.append(len(history))  # type: ignore[attr-defined]
        return turns[len(history)] if len(history) < len(turns) else []

    plan.calls = []  # type: ignore[attr-defined]
    return plan


def ticket(call_id: str, title: str = "t") -> ToolCall:
    return ToolCall(call_id=call_id, name="ticket", arguments={"title": title})


def tools(path: str = ISSUES) -> dict[str, HttpTool]:
    return {"ticket": HttpTool("POST", path)}


@pytest.fixture(params=["file", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Stores:
    """A factory of stores on one journal location (each call: a new handle, like a new process)."""
    if request.param == "file":
        return lambda: FileJournal(tmp_path / "journal" / "run.json")
    return lambda: SqliteJournal(tmp_path / "journal.db")


@pytest_asyncio.fixture
async def gateway(gateway_factory: GatewayFactory, upstream: CountingUpstream) -> RunningGateway:
    """One agent in one scope, its keys forwarded as they came (`forward_key = "key"`,
    allowed for a single scope): the upstream then shows the keys the client derived."""
    return await gateway_factory(
        upstream.url,
        route={"forward_key": "key"},
        idempotency={"scope_headers": [], "shared_scope": True},
    )


@pytest_asyncio.fixture
async def gw(gateway: RunningGateway) -> AsyncIterator[GatewayClient]:
    async with GatewayClient(gateway.url) as client:
        yield client


def open_run(store: Stores, gw: GatewayClient, **options: Any) -> Run:
    options.setdefault("run_id", "run-1")
    options.setdefault("flow_version", "v1")
    options.setdefault("tools", tools())
    return Run(store(), client=gw, **options)


# -- the protocol ---------------------------------------------------------------------------


async def test_a_run_plans_executes_and_records_each_turn(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """Each turn is planned once, each call sent once with run_id:turn:call_id, results kept."""
    plan = fixed_plan([ticket("c1"), ticket("c2", "other")], [ticket("c3")])
    async with open_run(store, gw) as run:
        while not run.finished:
            await run.step(plan)
        assert plan.calls == [0, 1, 2]  # type: ignore[attr-defined]
        assert [len(turn.results) for turn in run.turns] == [2, 1]
        first = run.turns[0].result("c1")
        assert (first.status, first.source, first.state, first.replayed) == (
            201,
            "response",
            "completed",
            False,
        )
        assert first.body_json()["key"] == "run-1:0:c1"
    assert [effect.key for effect in upstream.effects] == ["run-1:0:c1", "run-1:0:c2", "run-1:1:c3"]
    stored = store().load("run-1")
    assert stored is not None
    assert stored.finished
    assert stored.turns[1].calls[0].request.path == ISSUES
    assert stored.lease is not None
    assert stored.lease.expires_at == 0.0  # released on exit


async def test_rerunning_a_finished_run_says_it_is_finished(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """A finished run started again did nothing and reported nothing, so its observer
    printed nothing: it now reports `finished` when it opens, and plans nothing."""
    async with open_run(store, gw) as run:
        while not run.finished:
            await run.step(fixed_plan([ticket("c1")]))
    seen: list[RunEvent] = []
    plan = fixed_plan([ticket("c9")])
    async with open_run(store, gw, on_event=seen.append) as again:
        assert again.finished
        assert await again.step(plan) is None
    assert [event.kind for event in seen] == ["finished"]
    assert plan.calls == []  # type: ignore[attr-defined]
    assert len(upstream.effects) == 1


async def test_the_plan_is_durable_before_any_call_runs(
    tmp_path: Path, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """When the first call is sent, the whole turn (calls, keys, requests) is already on disk."""
    path = tmp_path / "journal" / "run.json"
    seen: list[dict[str, Any]] = []

    def observe(event: RunEvent) -> None:
        if event.kind == "sending" and event.call_id == "c1":
            seen.append(json.loads(path.read_text()))

    async with Run(
        FileJournal(path), client=gw, run_id="r", flow_version="v1", tools=tools(), on_event=observe
    ) as run:
        await run.step(fixed_plan([ticket("c1"), ticket("c2")]))
    on_disk = seen[0]["turns"][0]
    assert [call["key"] for call in on_disk["calls"]] == ["r:0:c1", "r:0:c2"]
    assert on_disk["calls"][0]["request"] == {
        "method": "POST",
        "path": ISSUES,
        "json": {"title": "t"},
        "headers": {},
    }
    assert on_disk["results"] == {}
    # No temporary left; the lock's last generation stays, marked released, hidden.
    entries = sorted(os.listdir(path.parent))
    assert len(entries) == 3, entries
    generation = entries[0].removeprefix(".run.json.lock.")
    assert generation.isdigit(), entries
    assert entries[1:] == [f".run.json.lock.{generation}.released", "run.json"]


async def test_after_runs_their_directory_lists_only_the_journals(
    tmp_path: Path, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """The lock's files are hidden: `ls runs/` shows each run's journal and nothing else.

    What stays of each lock (its last generation, released) has a leading dot, as
    the lock's staging files and the journal's temporary files do.
    """
    runs = tmp_path / "runs"
    for run_id in ("run-1", "run-2"):
        async with Run(
            FileJournal(runs / f"{run_id}.json"),
            client=gw,
            run_id=run_id,
            flow_version="v1",
            tools=tools(),
        ) as run:
            while not run.finished:
                await run.step(fixed_plan([ticket("c1")]))
    visible = sorted(name for name in os.listdir(runs) if not name.startswith("."))
    assert visible == ["run-1.json", "run-2.json"]
    hidden = sorted(name for name in os.listdir(runs) if name.startswith("."))
    assert [re.sub(r"\.lock\.[0-9]+", ".lock.N", name) for name in hidden] == [
        ".run-1.json.lock.N",
        ".run-1.json.lock.N.released",
        ".run-2.json.lock.N",
        ".run-2.json.lock.N.released",
    ]


async def test_resume_takes_the_receipt_of_an_effect_whose_result_was_not_saved(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """Crash after the effect, before its result: the lookup finds the receipt; nothing resent."""
    plan = fixed_plan([ticket("c1"), ticket("c2")])
    with pytest.raises(Crash):
        async with open_run(store, gw, on_event=crash_at("response", "c1")) as run:
            await run.step(plan)
    assert upstream.count == 1
    events: list[RunEvent] = []
    async with open_run(store, gw, on_event=events.append) as run:
        results = await run.resume()
        assert [result.source for result in results] == ["receipt", "response"]
        await run.step(plan)
        assert run.finished
    assert plan.calls == [0, 1]  # type: ignore[attr-defined]
    assert [(e.kind, e.state) for e in events if e.kind == "lookup"] == [
        ("lookup", "completed"),
        ("lookup", "absent"),
    ]
    assert upstream.count_for("run-1:0:c1") == 1
    assert upstream.count == 2


async def test_a_call_still_in_flight_is_waited_for(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """A lookup that finds `in_flight` waits for the outcome and takes its receipt."""
    slow = ISSUES + "?delay=0.5"
    plan = fixed_plan([ticket("c1")])
    with pytest.raises(Crash):
        async with open_run(store, gw, tools=tools(slow), on_event=crash_at("sending")) as run:
            await run.step(plan)
    # The dead worker's request, still running at the gateway.
    earlier = asyncio.create_task(gw.request("POST", slow, key="run-1:0:c1", json={"title": "t"}))
    await upstream.wait_for_count(1)
    events: list[RunEvent] = []
    async with open_run(store, gw, tools=tools(slow), on_event=events.append) as run:
        (result,) = await run.resume()
    assert [e.state for e in events if e.kind == "lookup"] == ["in_flight", "completed"]
    assert result.source == "receipt"
    assert (await earlier).status == 201
    assert upstream.count == 1


async def test_unknown_stops_the_run_until_it_is_resolved(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """An unknown outcome raises ReconciliationRequired, is never resent, resumes once settled."""
    lost = ISSUES + "?drop=after_effect"
    plan = fixed_plan([ticket("c1")])
    async with open_run(store, gw, tools=tools(lost)) as run:
        with pytest.raises(ReconciliationRequired) as caught:
            await run.step(plan)
        assert caught.value.key == "run-1:0:c1"
        assert caught.value.problem is not None
        assert caught.value.problem.kind == "upstream-connection-lost"
        with pytest.raises(ReconciliationRequired) as again:
            await run.resume()
        assert again.value.operation is not None
        assert again.value.operation.state == "unknown"
        assert run.pending
    assert upstream.count == 1
    await gw.resolve(
        "run-1:0:c1", "applied", response=StoredResponse(status=201, body='{"id": "T-7"}')
    )
    async with open_run(store, gw, tools=tools(lost)) as run:
        (result,) = await run.resume()
        assert result.body_json() == {"id": "T-7"}
        await run.step(plan)
        assert run.finished
    assert plan.calls == [0, 1]  # type: ignore[attr-defined]
    assert upstream.count == 1


async def test_a_released_key_is_sent_again_after_a_crash(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """A refusal that released the key (429) is resent on resume, and its answer recorded."""
    refused = ISSUES + "?status=429"
    with pytest.raises(Crash):
        async with open_run(store, gw, tools=tools(refused), on_event=crash_at("response")) as run:
            await run.step(fixed_plan([ticket("c1")]))
    events: list[RunEvent] = []
    async with open_run(store, gw, tools=tools(refused), on_event=events.append) as run:
        (result,) = await run.resume()
    assert [e.state for e in events if e.kind == "lookup"] == ["released"]
    assert (result.status, result.state, result.source) == (429, "released", "response")
    assert upstream.count == 2


async def test_a_result_found_by_hand_can_be_recorded(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """After reconciliation outside the gateway, record_result settles the call as `manual`."""
    async with open_run(store, gw, tools=tools(ISSUES + "?drop=after_effect")) as run:
        with pytest.raises(ReconciliationRequired):
            await run.step(fixed_plan([ticket("c1")]))
        await run.record_result("c1", ToolResult(status=201, body='{"id": "T-1"}'))
        assert run.turns[0].result("c1").source == "manual"
        assert not run.pending
        with pytest.raises(ValueError, match="no call"):
            await run.record_result("c1", ToolResult(status=201))


async def test_a_plan_naming_an_unknown_tool_is_refused_before_it_is_saved(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """Unknown tools and duplicate call ids fail the step; nothing reaches the journal."""
    async with open_run(store, gw) as run:
        bad = ToolCall(call_id="c1", name="nope")
        with pytest.raises(ValueError, match="no tool 'nope'"):
            await run.step(fixed_plan([bad]))
        with pytest.raises(ValueError, match="appears twice"):
            await run.step(fixed_plan([ticket("c1"), ticket("c1")]))
        assert run.turns == ()
    assert upstream.count == 0


@dataclass(frozen=True)
class GetWithBody:
    """A tool of one's own that (wrongly) gives a GET a body."""

    def request(self, call: ToolCall) -> ToolRequest:
        return ToolRequest(method="get", path=ISSUES, json=dict(call.arguments))


async def test_a_get_or_head_with_a_body_is_refused_before_it_is_saved(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """No client sends a body on GET or HEAD: a plan holding one would never complete."""
    refused: dict[str, Tool] = {
        "read": HttpTool("GET", ISSUES),
        "peek": HttpTool("HEAD", ISSUES),
        "own": GetWithBody(),
    }
    async with open_run(store, gw, tools=refused) as run:
        for name in refused:
            call = ToolCall(call_id="c1", name=name, arguments={"q": "x"})
            with pytest.raises(ValueError, match="no body"):
                await run.step(fixed_plan([call]))
        assert run.turns == ()
    assert upstream.count == 0


# -- versions, leases and fencing ---------------------------------------------------------------


async def test_a_journal_of_another_flow_version_refuses_to_resume(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """IncompatibleJournal names both versions; the journal and its lease are left untouched."""
    with pytest.raises(Crash):
        async with open_run(store, gw, on_event=crash_at("planned")) as run:
            await run.step(fixed_plan([ticket("c1")]))
    before = store().load("run-1")
    with pytest.raises(IncompatibleJournal, match=r"flow version 'v1'.*flow version 'v2'"):
        async with open_run(store, gw, flow_version="v2"):
            pass
    assert store().load("run-1") == before
    assert upstream.count == 0


def test_a_journal_of_another_format_or_garbage_is_refused(tmp_path: Path) -> None:
    """A foreign journal format is IncompatibleJournal; an unreadable file is JournalCorrupt."""
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"format": 99, "run_id": "r"}))
    with pytest.raises(IncompatibleJournal, match="format 99"):
        FileJournal(path).load("r")
    path.write_text("{not json")
    with pytest.raises(JournalCorrupt):
        FileJournal(path).acquire("r", "v1", Worker.current(), duration=5)
    path.write_text(json.dumps({"format": 1, "run_id": "other", "flow_version": "v1"}))
    with pytest.raises(IncompatibleJournal, match="holds run 'other'"):
        FileJournal(path).acquire("r", "v1", Worker.current(), duration=5)


async def test_a_second_worker_is_refused_while_the_first_holds_the_run(
    store: Stores, gw: GatewayClient, upstream: CountingUpstream
) -> None:
    """RunLeased names the holder and its expiry; the lease is renewed while the run is open."""
    async with open_run(store, gw, worker="worker-a", lease_duration=3.0) as held:
        assert held.document.lease is not None
        granted = held.document.lease.expires_at
        # The keeper renews the lease every third of it: wait for a renewal (a 0.3 s lease
        # and a fixed sleep once lapsed here, on a loaded machine, before worker-b came).
        for _ in range(300):  # up to ~30 s: bounds a hang only
            lease = store().load("run-1").lease
            if lease is not None and lease.expires_at > granted:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the keeper never renewed the lease")
        with pytest.raises(RunLeased, match="held by worker 'worker-a'") as caught:
            async with open_run(store, gw, worker="worker-b"):
                pass
        assert caught.value.holder == "worker-a"
        assert caught.value.expires_at > time.time()
    async with open_run(store, gw, worker="worker-b") as run:
        assert run.document.lease is not None
        assert (run.document.lease.holder, run.document.lease.token) == ("worker-b", 2)


def test_a_worker_past_its_lease_is_fenced_out_by_the_next(store: Stores) -> None:
    """An expired holder's write fails with RunLeaseLost once a newer token took the run."""
    first = store().acquire("r", "v1", Worker.current("a"), duration=0.05)
    time.sleep(0.1)
    second = store().acquire("r", "v1", Worker.current("b"), duration=30)
    assert second.lease is not None
    assert second.lease.token == 2
    with pytest.raises(RunLeaseLost, match="taken over by worker 'b'") as caught:
        store().write(first.model_copy(update={"finished": True}), duration=30)
    assert (caught.value.holder, caught.value.token) == ("b", 2)
    with pytest.raises(RunLeaseLost):
        store().release(first)
    written = store().write(second.model_copy(update={"finished": True}), duration=30)
    assert written.finished
    loaded = store().load("r")
    assert loaded is not None
    assert loaded.finished


def test_a_zombie_workers_lease_is_taken_over_at_once(store: Stores) -> None:
    """A worker killed while its parent has not reaped it is a zombie: its pid answers
    `kill(pid, 0)`, and the check counted it alive, so a restart waited out the whole
    lease (`RunLeased`). It runs no code and holds nothing: it is dead here."""
    zombie = subprocess.Popen(["true"])  # exits at once; not waited for: a zombie
    try:
        stat = Path(f"/proc/{zombie.pid}/stat")
        deadline = time.monotonic() + 30
        while stat.read_bytes().rpartition(b")")[2].split()[0] != b"Z":
            assert time.monotonic() < deadline, "the child did not exit"
            time.sleep(0.01)
        ghost = Worker(name="ghost", host=Worker.current().host, pid=zombie.pid)
        store().acquire("r", "v1", ghost, duration=3600)
        taken = store().acquire("r", "v1", Worker.current("me"), duration=30)
        assert taken.lease is not None
        assert (taken.lease.holder, taken.lease.token) == ("me", 2)
    finally:
        zombie.wait()


def test_a_dead_workers_lease_is_taken_over_at_once(store: Stores) -> None:
    """A lease held by a process of this host that no longer exists does not block a restart."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    ghost = Worker(name="ghost", host=Worker.current().host, pid=dead.pid)
    store().acquire("r", "v1", ghost, duration=3600)
    taken = store().acquire("r", "v1", Worker.current("me"), duration=30)
    assert taken.lease is not None
    assert (taken.lease.holder, taken.lease.token) == ("me", 2)
