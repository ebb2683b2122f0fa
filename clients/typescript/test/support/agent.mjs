// A small Node agent for the kill -9 tests, the twin of tests/agent_script.py (same plan, same
// flags, same output), so a run can be crashed in one language and resumed in the other.
//
// Turn 0 creates two tickets (c1, c2); turn 1 emails about both (c3); turn 2 plans nothing,
// which finishes the run. `--pause-at KIND:WHICH` (a step boundary, e.g. `response:c1`,
// `planned:0`, `finished:-`) prints `PAUSED <boundary>` and blocks there so the test can
// kill -9 it at exactly that point. Each planner call appends the turn number to --plan-log.
//
// Exit status: 0 done, 3 refused by the journal (the message is on stderr).
import { appendFileSync } from "node:fs";
import { parseArgs } from "node:util";

import { bodyJson, FileJournal, GatewayClient, HttpTool, JournalError, resultOf, Run } from "../../dist/index.js";

const { values: args } = parseArgs({
  options: {
    gateway: { type: "string" },
    journal: { type: "string" },
    "run-id": { type: "string", default: "run-1" },
    "flow-version": { type: "string", default: "v1" },
    worker: { type: "string" },
    "pause-at": { type: "string" },
    "plan-log": { type: "string" },
  },
});

function plan(turns) {
  appendFileSync(args["plan-log"], `${turns.length}\n`);
  if (turns.length === 0) {
    return [
      // A float and non-ASCII text: the bytes both clients send for them must agree (RFC 8785).
      { call_id: "c1", name: "create_ticket", arguments: { title: "first — café", estimate: 1.0 } },
      { call_id: "c2", name: "create_ticket", arguments: { title: "second" } },
    ];
  }
  if (turns.length === 1) {
    const ids = ["c1", "c2"].map((callId) => bodyJson(resultOf(turns[0], callId)).id);
    return [
      { call_id: "c3", name: "send_email", arguments: { to: "oncall@example.com", subject: `opened ${ids.join(" and ")}` } },
    ];
  }
  return [];
}

function pauser(boundary) {
  return (event) => {
    const which = event.callId ?? event.turn;
    const here = `${event.kind}:${which === null ? "-" : which}`;
    console.log(`EVENT ${here}`);
    if (here === boundary) {
      console.log(`PAUSED ${here}`);
      Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 60_000); // the test kills us here
    }
  };
}

const tools = {
  create_ticket: new HttpTool("POST", "/tickets/v1/issues"),
  send_email: new HttpTool("POST", "/tickets/v1/emails"),
};

try {
  await Run.with(
    new FileJournal(args.journal),
    {
      client: new GatewayClient(args.gateway),
      runId: args["run-id"],
      flowVersion: args["flow-version"],
      tools,
      worker: args.worker,
      onEvent: pauser(args["pause-at"]),
    },
    async (run) => {
      while (!run.finished) {
        await run.step(plan);
      }
    },
  );
} catch (error) {
  if (error instanceof JournalError) {
    console.error(`${error.name}: ${error.message}`);
    process.exit(3);
  }
  throw error;
}
console.log("DONE");
