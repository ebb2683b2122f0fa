"""One journal format for both clients: a run crashed in Python resumes in Node, and back.

The agents are real processes: `tests/agent_script.py` (Python) and its twin
`clients/typescript/test/support/agent.mjs` (Node), same plan and flags, killed
with kill -9 at a step boundary and resumed by the other language, through a
real gateway in front of the example ticket API. The plan holds a float and
non-ASCII text: whichever client sends a planned call, it must send the same
bytes (RFC 8785 canonical JSON), or a resend would be refused as `key-mismatch`.
One-call agents do the same for GET, HEAD, DELETE and POST steps (no body on a
GET or HEAD, in either client).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import GatewayFactory, ToolAPI
from harness import ROOT, RunningGateway, journal_agent_args, paused_agent, run_agent
from idempotency_gateway_client import FileJournal, GatewayClient
from upstream import CountingUpstream, Effect

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


async def run_node(node: str, script: str, *args: str) -> dict[str, object]:
    """Run an inline Node module against the built client; its one JSON line of output."""
    process = await asyncio.create_subprocess_exec(
        node,
        "--input-type=module",
        "-e",
        script % (TYPESCRIPT / "dist" / "index.js").as_uri(),
        *args,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        # Beyond the client's 30 s of retries: a refusal retried as a lost connection shows as such.
        stdout, stderr = await asyncio.wait_for(process.communicate(), 45)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, stderr.decode()
    answer: dict[str, object] = json.loads(stdout)
    return answer


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
    resent = await run_node(node, RESEND_PLANNED_C1, tickets.url, str(tmp_path / "run.json"))
    assert resent == {"status": 201, "replayed": True}
    assert len(tool_api.state.issues) == 1


ONE_CALL_AGENT = """
import asyncio, json, sys, time
from idempotency_gateway_client import FileJournal, GatewayClient, HttpTool, Run, ToolCall

gateway, journal, method, path, arguments, _, pause_at = sys.argv[1:]

def pause(event):
    here = f"{event.kind}:{event.call.call_id if event.call else event.turn}"
    if here == pause_at:
        print(f"PAUSED {here}", flush=True)
        time.sleep(60)  # the test kills the process here

def plan(turns):
    return [] if turns else [ToolCall(call_id="c1", name="call", arguments=json.loads(arguments))]

async def main():
    async with GatewayClient(gateway) as client, Run(
        FileJournal(journal), client=client, run_id="run-1", flow_version="v1",
        tools={"call": HttpTool(method, path)}, on_event=pause,
    ) as run:
        while not run.finished:
            await run.step(plan)

asyncio.run(main())
"""

RESUME_WITH_RUN = """
import { FileJournal, GatewayClient, HttpTool, Run } from "%s";
const [gateway, path, method, toolPath] = process.argv.slice(1);
const run = await Run.open(new FileJournal(path), {
  client: new GatewayClient(gateway), runId: "run-1", flowVersion: "v1",
  tools: { call: new HttpTool(method, toolPath) },
});
try {
  while (!run.finished) await run.step(() => []);
} finally {
  await run.close();
}
const result = (await new FileJournal(path).read()).turns[0].results.c1;
console.log(JSON.stringify({ status: result.status, source: result.source }));
"""

PROTECTED = ["GET", "HEAD", "DELETE", "POST"]
"""The methods the route protects here: each call is recorded, and a resend is replayed."""


@dataclass(frozen=True)
class MethodStep:
    """A planned call of one method, and what the upstream must see of it."""

    method: str
    path: str
    """The tool's path."""
    arguments: dict[str, object]
    """The model's arguments."""
    expected: tuple[str, bytes, str | None]
    """The target without the route prefix, the body, the Content-Type."""

    @property
    def status(self) -> int:
        return 201 if self.method == "POST" else 200


METHODS = [
    pytest.param(
        MethodStep("GET", "/tickets/v1/items?state=open", {}, ("/v1/items?state=open", b"", None)),
        id="GET",
    ),
    pytest.param(
        MethodStep("HEAD", "/tickets/v1/items/7", {}, ("/v1/items/7", b"", None)), id="HEAD"
    ),
    pytest.param(
        MethodStep(
            "DELETE",
            "/tickets/v1/items/7",
            {"reason": "café"},
            ("/v1/items/7", '{"reason":"café"}'.encode(), "application/json"),
        ),
        id="DELETE",
    ),
    pytest.param(
        MethodStep(
            "POST",
            "/tickets/v1/items",
            {"estimate": 1.0},
            ("/v1/items", b'{"estimate":1}', "application/json"),
        ),
        id="POST",
    ),
]


def seen(effect: Effect) -> tuple[str, bytes, str | None]:
    """What reached the upstream: the target, the body and the Content-Type."""
    target = effect.path + (f"?{effect.query}" if effect.query else "")
    return target, effect.body, effect.headers.get("content-type")


async def python_killed_at(
    pause_at: str, step: MethodStep, gateway: RunningGateway, tmp_path: Path
) -> str:
    """The journal of a Python agent that planned `step` as c1 and was killed at `pause_at`."""
    journal = str(tmp_path / "run.json")
    arguments = json.dumps(step.arguments)
    agent = ["-c", ONE_CALL_AGENT, gateway.url, journal, step.method, step.path, arguments]
    killed = await run_agent(*agent, pause_at=pause_at)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    return journal


@pytest.mark.parametrize("step", METHODS)
async def test_node_resends_the_bytes_python_sent_for_each_method(
    step: MethodStep,
    node: str,
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
) -> None:
    """Python sent c1 with the step's method; Node resending it from the journal is a replay.

    A replay, not `key-mismatch`: the gateway fingerprints the method, the target, the
    content type and the body, so Node sent what Python sent. A GET or HEAD carries no
    body in either client (Node's fetch cannot send one).
    """
    gateway = await gateway_factory(upstream.url, route={"methods": PROTECTED})
    journal = await python_killed_at("response:c1", step, gateway, tmp_path)
    resent = await run_node(node, RESEND_PLANNED_C1, gateway.url, journal)
    assert resent == {"status": step.status, "replayed": True}
    assert [(e.method, seen(e)) for e in upstream.effects] == [(step.method, step.expected)]


@pytest.mark.parametrize("step", METHODS)
async def test_node_resumes_a_call_python_planned_for_each_method(
    step: MethodStep,
    node: str,
    gateway_factory: GatewayFactory,
    upstream: CountingUpstream,
    tmp_path: Path,
) -> None:
    """Python saved the plan and died before sending; Node's Run sends the planned request."""
    gateway = await gateway_factory(upstream.url, route={"methods": PROTECTED})
    journal = await python_killed_at("planned:0", step, gateway, tmp_path)
    assert upstream.count == 0
    resumed = await run_node(node, RESUME_WITH_RUN, gateway.url, journal, step.method, step.path)
    assert resumed == {"status": step.status, "source": "response"}
    assert [(e.method, seen(e)) for e in upstream.effects] == [(step.method, step.expected)]
