"""An MCP agent for the kill -9 tests: `agent_script.py`'s run, its tools behind an MCP route.

The tools are the counting MCP server's (`mcp_upstream.CountingMcpServer`),
reached through the gateway's MCP route at `<gateway>/tools` by the official
SDK's client, one `McpTool` each. Turn 0 creates two tickets (c1, c2), or with
`--first-tool lose_connection` makes c1 a call whose answer is lost; turn 1
emails about both tickets (c3), reading their ids from the journal's results;
turn 2 plans nothing, which finishes the run. `--pause-at KIND:WHICH` (a step
boundary, e.g. `response:c1`) prints `PAUSED <boundary>` and sleeps there so
the test can `kill -9` it at exactly that point. Each planner call appends
the turn number to `--plan-log`.

Exit status: 0 done, 3 refused by the journal, 4 stopped for reconciliation
(`RECONCILE <key> <problem type or state>` on stdout).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections.abc import Sequence
from pathlib import Path

from agent_script import pauser
from idempotency_gateway_client import (
    FileJournal,
    GatewayClient,
    JournalError,
    McpTool,
    Planner,
    ReconciliationRequired,
    Run,
    ToolCall,
    Turn,
    mcp_result,
)
from mcp_upstream import mcp_client

PREFIX = "/tools"
TOOLS = ("create_ticket", "lose_connection", "send_email")


def make_planner(log: Path, first_tool: str) -> Planner:
    def plan(turns: tuple[Turn, ...]) -> list[ToolCall]:
        with log.open("a") as handle:
            handle.write(f"{len(turns)}\n")
        if not turns:
            return [
                ToolCall(call_id="c1", name=first_tool, arguments={"title": "first"}),
                ToolCall(call_id="c2", name="create_ticket", arguments={"title": "second"}),
            ]
        if len(turns) == 1:
            ids = []
            for call_id in ("c1", "c2"):
                structured = mcp_result(turns[0].result(call_id)).structured_content
                ids.append(structured["id"] if isinstance(structured, dict) else "?")
            subject = "opened " + " and ".join(ids)
            email = {"to": "oncall@example.com", "subject": subject}
            return [ToolCall(call_id="c3", name="send_email", arguments=email)]
        return []

    return plan


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--run-id", default="run-1")
    parser.add_argument("--first-tool", default="create_ticket")
    parser.add_argument("--pause-at")
    parser.add_argument("--plan-log", type=Path, required=True)
    args = parser.parse_args(argv)
    async with GatewayClient(args.gateway) as gateway, mcp_client(args.gateway + PREFIX) as session:
        # Caught inside the SDK client's block: it wraps what escapes it in an ExceptionGroup.
        try:
            async with Run(
                FileJournal(args.journal),
                client=gateway,
                run_id=args.run_id,
                flow_version="mcp-v1",
                tools={name: McpTool(session) for name in TOOLS},
                on_event=pauser(args.pause_at),
            ) as run:
                plan = make_planner(args.plan_log, args.first_tool)
                while not run.finished:
                    await run.step(plan)
        except JournalError as exc:
            print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            return 3
        except ReconciliationRequired as exc:
            why = exc.problem.kind if exc.problem is not None else None
            why = why or (exc.operation.state if exc.operation is not None else "?")
            print(f"RECONCILE {exc.key} {why}", flush=True)
            return 4
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
