"""A small agent for the kill -9 tests: two turns, three effects, a planner that logs each call.

Its Node twin, `clients/typescript/test/support/agent.mjs`, has the same plan, flags and
output, so a run crashed in one language is resumed in the other (tests/test_cross_language.py).

Turn 0 creates two tickets (c1, c2); turn 1 emails about both (c3); turn 2
plans nothing, which finishes the run. `--pause-at KIND:WHICH` (a step
boundary, e.g. `response:c1`, `planned:0`, `finished:-`) prints
`PAUSED <boundary>` and sleeps there so the test can `kill -9` it at exactly
that point. Each planner call appends the turn number to `--plan-log`.

Exit status: 0 done, 3 refused by the journal (the message is on stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from idempotency_gateway_client import (
    FileJournal,
    GatewayClient,
    HttpTool,
    JournalError,
    JournalStore,
    Planner,
    Run,
    RunEvent,
    RunObserver,
    SqliteJournal,
    ToolCall,
    Turn,
)


def make_planner(log: Path) -> Planner:
    def plan(turns: tuple[Turn, ...]) -> list[ToolCall]:
        with log.open("a") as handle:
            handle.write(f"{len(turns)}\n")
        if not turns:
            return [
                # A float and non-ASCII text: the bytes both clients send for them must agree.
                ToolCall(
                    call_id="c1",
                    name="create_ticket",
                    arguments={"title": "first — café", "estimate": 1.0},
                ),
                ToolCall(call_id="c2", name="create_ticket", arguments={"title": "second"}),
            ]
        if len(turns) == 1:
            ids = [turns[0].result(c).body_json()["id"] for c in ("c1", "c2")]
            subject = "opened " + " and ".join(ids)
            email = {"to": "oncall@example.com", "subject": subject}
            return [ToolCall(call_id="c3", name="send_email", arguments=email)]
        return []

    return plan


def pauser(boundary: str | None) -> RunObserver:
    def on_event(event: RunEvent) -> None:
        which = event.call.call_id if event.call else event.turn
        here = f"{event.kind}:{'-' if which is None else which}"
        print(f"EVENT {here}", flush=True)
        if here == boundary:
            print(f"PAUSED {here}", flush=True)
            time.sleep(60)  # the test kills the process here

    return on_event


async def main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--journal", type=Path, required=True)
    parser.add_argument("--store", choices=("file", "sqlite"), default="file")
    parser.add_argument("--run-id", default="run-1")
    parser.add_argument("--flow-version", default="v1")
    parser.add_argument("--worker")
    parser.add_argument("--pause-at")
    parser.add_argument("--plan-log", type=Path, required=True)
    args = parser.parse_args(argv)
    journal: JournalStore = (
        FileJournal(args.journal) if args.store == "file" else SqliteJournal(args.journal)
    )
    tools = {
        "create_ticket": HttpTool("POST", "/tickets/v1/issues"),
        "send_email": HttpTool("POST", "/tickets/v1/emails"),
    }
    try:
        async with (
            GatewayClient(args.gateway) as gateway,
            Run(
                journal,
                client=gateway,
                run_id=args.run_id,
                flow_version=args.flow_version,
                tools=tools,
                worker=args.worker,
                on_event=pauser(args.pause_at),
            ) as run,
        ):
            plan = make_planner(args.plan_log)
            while not run.finished:
                await run.step(plan)
    except JournalError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        return 3
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
