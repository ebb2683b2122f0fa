"""An agent that is killed mid-run and resumes without repeating or losing an effect.

The "model" here is a fixed plan, so the demo needs no API key: turn 0
creates a ticket, turn 1 emails the on-call engineer about it, then the run
is done. Every call goes through the gateway with the key
`run_id:turn:call_id`; the journal (a JSON file) holds the plan and each
result. With `make run` serving the gateway on :8080 in front of the example
ticket API on :9000:

    CRASH_AFTER_EFFECT=1 python -m examples.agent_recovery   # killed after the ticket exists
    python -m examples.agent_recovery                        # finds the receipt, sends the email
    python -m examples.agent_recovery                        # everything is in the journal

The ticket API ends with exactly one ticket and one email.

With `--mcp` the same run calls the same two tools on the example MCP server
(:9100) through the gateway's MCP route `/mcp`, with the official MCP client:
the key goes in `_meta.idempotencyKey`, and the crash and resume go the same
way (its journal is `data/agent-run-mcp.json`):

    CRASH_AFTER_EFFECT=1 python -m examples.agent_recovery --mcp
    python -m examples.agent_recovery --mcp
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
from idempotency_gateway_client import (
    FileJournal,
    GatewayClient,
    GatewayConnectionError,
    HttpTool,
    JournalError,
    McpTool,
    ReconciliationRequired,
    Run,
    RunEvent,
    ToolCall,
    ToolResult,
    Turn,
    mcp_result,
    operation_path,
)

JOURNAL = Path("data/agent-run.json")
MCP_JOURNAL = Path("data/agent-run-mcp.json")

FLOW_VERSION = "ticket-triage-v1"
"""Pinned in the journal: a run started by this flow is resumed only by this flow."""


def plan(turns: tuple[Turn, ...]) -> list[ToolCall]:
    """The "model": what to do next, given every finished turn."""
    if not turns:
        first = {"title": "Printer on fire"}
        return [ToolCall(call_id="c1", name="create_ticket", arguments=first)]
    if len(turns) == 1:
        ticket = fields(turns[0].result("c1"))
        subject = f"Ticket {ticket['id']} opened: {ticket['title']}"
        return [
            ToolCall(
                call_id="c2",
                name="send_email",
                arguments={"to": "oncall@example.com", "subject": subject},
            )
        ]
    return []  # nothing left to do: the run is finished


class Printer:
    """Prints what the run does, and kills the process when asked to demonstrate a crash."""

    def __init__(self, *, crash_after_effect: bool) -> None:
        self.crash_after_effect = crash_after_effect

    def __call__(self, event: RunEvent) -> None:
        call = event.call
        name = f"{call.call.name} {call.call_id}" if call else ""
        if event.kind == "planned":
            say(f"turn {event.turn}: plan saved to the journal before any call runs")
        elif event.kind == "lookup" and call is not None:
            say(f"  {name}: no result in the journal; asking the gateway first:")
            say(f"    GET {operation_path(call.key)} -> {event.state}")
        elif event.kind == "sending" and call is not None:
            say(f"  {name}: {call.request.method} {call.request.path}  (key {call.key})")
        elif event.kind == "response" and event.result is not None:
            say(f"  {name}: {describe(event.result)}")
            if self.crash_after_effect:
                say("CRASH_AFTER_EFFECT=1: the effect happened; kill -9 before its result is saved")
                os.kill(os.getpid(), signal.SIGKILL)
        elif event.kind == "recorded" and event.result is not None:
            if event.result.source == "receipt":
                say(f"  {name}: receipt found, not sent again: {describe(event.result)}")
            say(f"  {name}: result saved to the journal")
        elif event.kind == "finished":
            say("run finished")


def fields(result: ToolResult) -> dict[str, object]:
    """What the tool answered, over HTTP (the JSON body) or MCP (the structured content)."""
    try:
        body = result.body_json()
    except ValueError:
        return {}
    if isinstance(body, dict) and "result" in body:  # an MCP tool result
        structured = mcp_result(result).structured_content
        return dict(structured) if isinstance(structured, dict) else {}
    return body if isinstance(body, dict) else {}


def describe(result: ToolResult) -> str:
    """The status and the id the tool gave the new object (or the body, when it has no id)."""
    body = fields(result)
    if "id" in body:
        return f"{result.status} {body['id']}"
    return f"{result.status} {result.body[:80]}"


def say(line: str) -> None:
    # Flushed at once: a process killed with kill -9 loses whatever is buffered.
    print(line, flush=True)


async def run_agent(args: argparse.Namespace) -> int:
    journal = FileJournal(args.journal)
    existing = journal.read()
    run_id = existing.run_id if existing else args.run_id or f"demo-{secrets.token_hex(3)}"
    if existing is None:
        say(f"run {run_id}: new run, journal {args.journal}")
    elif existing.finished:
        say(f"run {run_id}: finished in an earlier process; everything is in {args.journal}")
    else:
        say(f"run {run_id}: resuming from {args.journal} ({len(existing.turns)} turn(s) saved)")
    printer = Printer(crash_after_effect=os.environ.get("CRASH_AFTER_EFFECT") == "1")
    if args.mcp:
        return await run_mcp_agent(args, journal, run_id, printer)
    tools = {
        "create_ticket": HttpTool("POST", f"{args.prefix}/v1/issues"),
        "send_email": HttpTool("POST", f"{args.prefix}/v1/emails"),
    }
    async with (
        GatewayClient(args.gateway) as gateway,
        Run(
            journal,
            client=gateway,
            run_id=run_id,
            flow_version=FLOW_VERSION,
            tools=tools,
            on_event=printer,
        ) as run,
    ):
        await finish(run)
    await print_stats(args.tool_api)
    return 0


async def finish(run: Run) -> None:
    """Step the run to its end, then show what the journal holds."""
    while not run.finished:
        await run.step(plan)
    for turn in run.turns:
        for planned in turn.calls:
            result = turn.result(planned.call_id)
            say(
                f"journal: turn {turn.index} {planned.call.name} {planned.call_id}: "
                f"{describe(result)} ({result.source})"
            )


async def run_mcp_agent(
    args: argparse.Namespace, journal: FileJournal, run_id: str, printer: Printer
) -> int:
    """The same run through the gateway's MCP route, with the official MCP client."""
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    endpoint = args.gateway.rstrip("/") + args.mcp_prefix
    async with (
        GatewayClient(args.gateway) as gateway,
        Client(streamable_http_client(endpoint)) as client,
    ):
        tools = {"create_ticket": McpTool(client), "send_email": McpTool(client)}
        async with Run(
            journal,
            client=gateway,
            run_id=run_id,
            flow_version=FLOW_VERSION,
            tools=tools,
            on_event=printer,
        ) as run:
            await finish(run)
        listed = await client.call_tool("list_tickets", {})
        items = (listed.structured_content or {}).get("items", [])
        say(f"MCP server: {len(items)} ticket(s)")
    return 0


async def print_stats(tool_api: str) -> None:
    try:
        async with (
            aiohttp.ClientSession() as session,
            session.get(tool_api.rstrip("/") + "/v1/stats") as response,
        ):
            stats = await response.json()
    except aiohttp.ClientError as exc:
        say(f"tool API at {tool_api} not reachable for stats: {exc}")
        return
    say(f"tool API: {stats['issues']} ticket(s), {stats['emails']} email(s)")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m examples.agent_recovery", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--gateway", default="http://127.0.0.1:8080", help="gateway base URL")
    parser.add_argument("--journal", type=Path, default=JOURNAL)
    parser.add_argument("--tool-api", default="http://127.0.0.1:9000", help="for the stats line")
    parser.add_argument("--prefix", default="/tickets", help="the gateway route of the tool API")
    parser.add_argument("--run-id", help="for a new journal (default: a fresh id)")
    parser.add_argument(
        "--mcp", action="store_true", help="call the tools on the example MCP server instead"
    )
    parser.add_argument("--mcp-prefix", default="/mcp", help="the gateway's MCP route")
    args = parser.parse_args(argv)
    if args.mcp and args.journal == JOURNAL:
        args.journal = MCP_JOURNAL
    try:
        return asyncio.run(run_agent(args))
    except ReconciliationRequired as exc:
        print(f"stopped for reconciliation: {exc}", file=sys.stderr)
        return 4
    except JournalError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 3
    except GatewayConnectionError as exc:
        print(f"gateway not reachable at {args.gateway} (is `make run` running?): {exc}")
        return 5


if __name__ == "__main__":
    sys.exit(main())
