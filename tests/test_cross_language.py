"""One journal format for both clients: a run crashed in Python resumes in Node, and back.

The agents are real processes: `tests/agent_script.py` (Python) and its twin
`clients/typescript/test/support/agent.mjs` (Node), same plan and flags, killed
with kill -9 at a step boundary and resumed by the other language, through a
real gateway in front of the example ticket API. The plan holds a float and
non-ASCII text: whichever client sends a planned call, it must send the same
bytes (RFC 8785 canonical JSON), or a resend would be refused as `key-mismatch`.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ToolAPI
from harness import ROOT, RunningGateway, journal_agent_args, paused_agent, run_agent
from idempotency_gateway_client import FileJournal, GatewayClient

pytestmark = pytest.mark.slow

PYTHON_AGENT = ROOT / "tests" / "agent_script.py"
TYPESCRIPT = ROOT / "clients" / "typescript"
NODE_AGENT = TYPESCRIPT / "test" / "support" / "agent.mjs"

BOUNDARIES = ["planned:0", "response:c1", "recorded:c2", "planned:1", "response:c3"]


@pytest.fixture(scope="session")
def node() -> str:
    """Node, with the TypeScript client built from its current sources (as `make test` does)."""
    program = shutil.which("node")
    assert program is not None, "node is not on PATH; the TypeScript client needs Node 20+"
    built = TYPESCRIPT / "dist" / "index.js"
    sources = list((TYPESCRIPT / "src").glob("*.ts"))
    if not built.exists() or max(p.stat().st_mtime for p in sources) > built.stat().st_mtime:
        if not (TYPESCRIPT / "node_modules").exists():
            subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=TYPESCRIPT, check=True)
        subprocess.run(["npm", "run", "--silent", "build"], cwd=TYPESCRIPT, check=True)
    return program


async def assert_each_effect_once(
    gateway: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    assert len(tool_api.state.issues) == 2
    assert len(tool_api.state.emails) == 1
    async with GatewayClient(gateway.url) as client:
        for key in ("run-1:0:c1", "run-1:0:c2", "run-1:1:c3"):
            operation = await client.lookup(key)
            assert operation is not None
            assert (operation.state, operation.attempts) == ("completed", 1)
    assert [issue.title for issue in tool_api.state.issues] == ["first — café", "second"]
    journal = FileJournal(tmp_path / "run.json").load("run-1")
    assert journal is not None
    assert journal.finished
    assert all(turn.done for turn in journal.turns)
    assert (tmp_path / "plans.log").read_text().split() == ["0", "1", "2"]


@pytest.mark.parametrize("boundary", BOUNDARIES)
async def test_python_crashes_and_node_resumes(
    boundary: str, node: str, tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    args = journal_agent_args(tickets.url, tmp_path)
    killed = await run_agent(str(PYTHON_AGENT), *args, pause_at=boundary)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = await run_agent(str(NODE_AGENT), *args, program=node)
    assert resumed.returncode == 0, resumed.stderr
    assert "DONE" in resumed.stdout
    await assert_each_effect_once(tickets, tool_api, tmp_path)


@pytest.mark.parametrize("boundary", BOUNDARIES)
async def test_node_crashes_and_python_resumes(
    boundary: str, node: str, tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    args = journal_agent_args(tickets.url, tmp_path)
    killed = await run_agent(str(NODE_AGENT), *args, pause_at=boundary, program=node)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    resumed = await run_agent(str(PYTHON_AGENT), *args)
    assert resumed.returncode == 0, resumed.stderr
    assert "DONE" in resumed.stdout
    await assert_each_effect_once(tickets, tool_api, tmp_path)


async def test_a_python_worker_is_refused_while_a_node_worker_holds_the_run(
    node: str, tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """The lease in the journal binds both languages: one worker per run, whichever it is."""
    args = journal_agent_args(tickets.url, tmp_path)
    worker_a = ["--worker", "node-a"]
    async with paused_agent(
        str(NODE_AGENT), *args, *worker_a, pause_at="recorded:c1", program=node
    ) as holder:
        second = await run_agent(str(PYTHON_AGENT), *args, "--worker", "python-b")
        assert second.returncode == 3
        assert "RunLeased: run 'run-1' is held by worker 'node-a'" in second.stderr
        assert f"pid {holder.pid}" in second.stderr
        assert len(tool_api.state.issues) == 1
    resumed = await run_agent(
        str(PYTHON_AGENT), *args, "--worker", "python-b", program=sys.executable
    )
    assert resumed.returncode == 0, resumed.stderr
    await assert_each_effect_once(tickets, tool_api, tmp_path)


RESEND_PLANNED_C1 = """
import { FileJournal, GatewayClient } from "%s";
const [gateway, path] = process.argv.slice(1);
const journal = await new FileJournal(path).read();
const planned = journal.turns[0].calls[0];
const client = new GatewayClient(gateway);
const answer = await client.request(planned.request.method, planned.request.path, {
  key: planned.key, json: planned.request.json, headers: planned.request.headers,
});
console.log(JSON.stringify({ status: answer.status, replayed: answer.replayed }));
"""


async def test_node_resends_the_bytes_python_sent_for_a_planned_call(
    node: str, tickets: RunningGateway, tool_api: ToolAPI, tmp_path: Path
) -> None:
    """Python sent c1 (`estimate: 1.0`, `café`); Node resending it from the journal is a replay."""
    args = journal_agent_args(tickets.url, tmp_path)
    killed = await run_agent(str(PYTHON_AGENT), *args, pause_at="response:c1")
    assert killed.returncode == -signal.SIGKILL
    script = RESEND_PLANNED_C1 % (TYPESCRIPT / "dist" / "index.js").as_uri()
    resent = await asyncio.create_subprocess_exec(
        node,
        "--input-type=module",
        "-e",
        script,
        tickets.url,
        str(tmp_path / "run.json"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(resent.communicate(), 20)
    assert resent.returncode == 0, stderr.decode()
    assert json.loads(stdout) == {"status": 201, "replayed": True}
    assert len(tool_api.state.issues) == 1
