"""Agents killed with kill -9 at every step boundary resume with no effect twice and none lost.

The agents are real processes (`tests/agent_script.py`, `examples/agent_recovery.py`)
talking to a real gateway in front of the example ticket API, all on loopback.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from conftest import ToolAPI
from harness import ROOT, RunningGateway, paused_agent, run_agent
from idempotency_gateway_client import FileJournal, GatewayClient, SqliteJournal

pytestmark = pytest.mark.slow

AGENT = ROOT / "tests" / "agent_script.py"
SECONDS = 20.0
"""Upper bound for one agent process; each takes well under a second."""

BOUNDARIES = [
    "planned:0",  # the plan is saved, nothing sent
    "response:c1",  # an effect happened, its result is not saved
    "recorded:c1",  # the result is saved
    "response:c2",
    "recorded:c2",
    "planned:1",
    "response:c3",
    "recorded:c3",
    "finished:-",
]


def agent_args(gateway: RunningGateway, tmp_path: Path, store: str = "file") -> list[str]:
    journal = tmp_path / ("run.json" if store == "file" else "runs.db")
    return [
        str(AGENT),
        "--gateway",
        gateway.url,
        "--journal",
        str(journal),
        "--store",
        store,
        "--plan-log",
        str(tmp_path / "plans.log"),
    ]


async def assert_each_effect_once(gateway: RunningGateway, tool_api: ToolAPI) -> None:
    assert len(tool_api.state.issues) == 2
    assert len(tool_api.state.emails) == 1
    operation_ids: dict[str, str] = {}
    async with GatewayClient(gateway.url) as client:
        for key in ("run-1:0:c1", "run-1:0:c2", "run-1:1:c3"):
            operation = await client.lookup(key)
            assert operation is not None
            assert (operation.state, operation.attempts) == ("completed", 1)
            operation_ids[key] = operation.id
    # The ticket API saw each ticket's forwarded key: its operation's id.
    assert sorted(issue.idempotency_key or "" for issue in tool_api.state.issues) == sorted(
        [operation_ids["run-1:0:c1"], operation_ids["run-1:0:c2"]]
    )


@pytest.mark.parametrize("boundary", BOUNDARIES)
async def test_kill_9_at_a_step_boundary_then_resume(
    boundary: str, tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """Killed at a boundary, then resumed: each effect once, no call lost, no turn re-planned."""
    args = agent_args(tickets, tmp_path)
    killed = await run_agent(*args, pause_at=boundary)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = await run_agent(*args)
    assert resumed.returncode == 0, resumed.stderr
    assert "DONE" in resumed.stdout

    await assert_each_effect_once(tickets, tool_api)
    plans = (tmp_path / "plans.log").read_text().split()
    assert plans == ["0", "1", "2"]  # the model was never asked twice for a saved turn
    journal = FileJournal(tmp_path / "run.json").load("run-1")
    assert journal is not None
    assert journal.finished
    assert all(turn.done for turn in journal.turns)
    kind, _, call = boundary.partition(":")
    if kind == "response":  # the effect's result came from the gateway's receipt
        turn = journal.turns[1 if call == "c3" else 0]
        assert turn.result(call).source == "receipt"
        assert f"EVENT lookup:{call}" in resumed.stdout


async def test_kill_9_with_the_sqlite_journal(
    tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """The SQLite journal survives kill -9 between an effect and its result the same way."""
    args = agent_args(tickets, tmp_path, store="sqlite")
    killed = await run_agent(*args, pause_at="response:c2")
    assert killed.returncode == -signal.SIGKILL
    resumed = await run_agent(*args)
    assert resumed.returncode == 0, resumed.stderr
    await assert_each_effect_once(tickets, tool_api)
    journal = SqliteJournal(tmp_path / "runs.db").load("run-1")
    assert journal is not None
    assert journal.finished
    assert journal.turns[0].result("c2").source == "receipt"


async def test_two_workers_on_one_run_only_one_advances(
    tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """A second worker is refused with the holder's name; after the holder dies, it resumes."""
    args = agent_args(tickets, tmp_path)
    async with paused_agent(*args, "--worker", "worker-a", pause_at="recorded:c1") as holder:
        second = await run_agent(*args, "--worker", "worker-b")
        assert second.returncode == 3
        assert "RunLeased: run 'run-1' is held by worker 'worker-a'" in second.stderr
        assert f"pid {holder.pid}" in second.stderr
        assert "EVENT" not in second.stdout  # it did nothing at all
        assert len(tool_api.state.issues) == 1
    resumed = await run_agent(*args, "--worker", "worker-b")
    assert resumed.returncode == 0, resumed.stderr
    await assert_each_effect_once(tickets, tool_api)
    journal = FileJournal(tmp_path / "run.json").load("run-1")
    assert journal is not None
    assert journal.lease is not None
    assert (journal.lease.holder, journal.lease.token) == ("worker-b", 2)


async def test_another_flow_version_refuses_to_resume(
    tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """A journal written by flow v1 is not resumed by v2: a clear error, and nothing is sent."""
    args = agent_args(tickets, tmp_path)
    killed = await run_agent(*args, pause_at="planned:0")
    assert killed.returncode == -signal.SIGKILL
    refused = await run_agent(*args, "--flow-version", "v2")
    assert refused.returncode == 3
    assert "IncompatibleJournal" in refused.stderr
    assert "written by flow version 'v1'" in refused.stderr
    assert "runs flow version 'v2'" in refused.stderr
    assert tool_api.state.issues == []


async def test_the_example_crashes_after_the_first_effect_and_resumes(
    tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """examples/agent_recovery.py: crash, resume from the receipt, then nothing left to do."""
    args = [
        "-m",
        "examples.agent_recovery",
        "--gateway",
        tickets.url,
        "--tool-api",
        tool_api.url,
        "--journal",
        str(tmp_path / "agent-run.json"),
    ]
    crashed = await run_agent(*args, env={"CRASH_AFTER_EFFECT": "1"})
    assert crashed.returncode == -signal.SIGKILL
    assert "kill -9 before its result is saved" in crashed.stdout
    assert (len(tool_api.state.issues), len(tool_api.state.emails)) == (1, 0)

    second = await run_agent(*args)
    assert second.returncode == 0, second.stderr
    assert "-> completed" in second.stdout
    assert "receipt found, not sent again" in second.stdout
    assert second.stdout.count("POST /tickets/v1/emails") == 1
    assert "POST /tickets/v1/issues" not in second.stdout
    assert "tool API: 1 ticket(s), 1 email(s)" in second.stdout

    third = await run_agent(*args)
    assert third.returncode == 0, third.stderr
    assert "finished in an earlier process" in third.stdout
    assert "POST" not in third.stdout
    assert "tool API: 1 ticket(s), 1 email(s)" in third.stdout
    assert (len(tool_api.state.issues), len(tool_api.state.emails)) == (1, 1)
    document = json.loads((tmp_path / "agent-run.json").read_text())
    assert [turn["calls"][0]["call"]["name"] for turn in document["turns"]] == [
        "create_ticket",
        "send_email",
    ]
