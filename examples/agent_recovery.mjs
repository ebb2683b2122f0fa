// An agent that is killed mid-run and resumes without repeating or losing an effect, in Node:
// the twin of examples/agent_recovery.py, with the TypeScript client (clients/typescript).
//
// The "model" here is a fixed plan, so the demo needs no API key: turn 0 creates a ticket,
// turn 1 emails the on-call engineer about it, then the run is done. Every call goes through
// the gateway with the key `runId:turn:callId`; the journal (a JSON file, the same format as
// the Python client's) holds the plan and each result. With `make run` serving the gateway on
// :8080 in front of the example ticket API on :9000, and the client built (`make ts-build`):
//
//     CRASH_AFTER_EFFECT=1 node examples/agent_recovery.mjs   # killed after the ticket exists
//     node examples/agent_recovery.mjs                        # finds the receipt, sends the email
//     node examples/agent_recovery.mjs                        # everything is in the journal
//
// In your own project: `npm install idempotency-gateway-client` and import from it by name.
import { randomBytes } from "node:crypto";
import { parseArgs } from "node:util";

import {
  bodyJson,
  FileJournal,
  GatewayClient,
  GatewayConnectionError,
  HttpTool,
  JournalError,
  operationPath,
  ReconciliationRequired,
  resultOf,
  Run,
} from "../clients/typescript/dist/index.js";

const FLOW_VERSION = "ticket-triage-v1"; // pinned in the journal: only this flow resumes its runs

const { values: args } = parseArgs({
  options: {
    gateway: { type: "string", default: "http://127.0.0.1:8080" },
    journal: { type: "string", default: "data/agent-run-node.json" },
    "tool-api": { type: "string", default: "http://127.0.0.1:9000" },
    prefix: { type: "string", default: "/tickets" },
    "run-id": { type: "string" },
  },
});

/** The "model": what to do next, given every finished turn. */
function plan(turns) {
  if (turns.length === 0) {
    return [{ call_id: "c1", name: "create_ticket", arguments: { title: "Printer on fire" } }];
  }
  if (turns.length === 1) {
    const ticket = bodyJson(resultOf(turns[0], "c1"));
    const subject = `Ticket ${ticket.id} opened: ${ticket.title}`;
    return [{ call_id: "c2", name: "send_email", arguments: { to: "oncall@example.com", subject } }];
  }
  return []; // nothing left to do: the run is finished
}

const say = (line) => console.log(line);

function describe(result) {
  try {
    const body = bodyJson(result);
    if (body && typeof body === "object" && "id" in body) {
      return `${result.status} ${body.id}`;
    }
  } catch {
    // not JSON: show the start of the body
  }
  return `${result.status} ${result.body.slice(0, 80)}`;
}

/** Prints what the run does, and kills the process when asked to demonstrate a crash. */
function printer(crashAfterEffect) {
  return (event) => {
    const call = event.call;
    const name = call ? `${call.call.name} ${call.call.call_id}` : "";
    if (event.kind === "planned") {
      say(`turn ${event.turn}: plan saved to the journal before any call runs`);
    } else if (event.kind === "lookup") {
      say(`  ${name}: no result in the journal; asking the gateway first:`);
      say(`    GET ${operationPath(call.key)} -> ${event.state}`);
    } else if (event.kind === "sending") {
      say(`  ${name}: ${call.request.method} ${call.request.path}  (key ${call.key})`);
    } else if (event.kind === "response") {
      say(`  ${name}: ${describe(event.result)}`);
      if (crashAfterEffect) {
        say("CRASH_AFTER_EFFECT=1: the effect happened; kill -9 before its result is saved");
        process.kill(process.pid, "SIGKILL");
      }
    } else if (event.kind === "recorded") {
      if (event.result.source === "receipt") {
        say(`  ${name}: receipt found, not sent again: ${describe(event.result)}`);
      }
      say(`  ${name}: result saved to the journal`);
    } else if (event.kind === "finished") {
      say("run finished");
    }
  };
}

async function printStats() {
  try {
    const stats = await (await fetch(`${args["tool-api"].replace(/\/$/, "")}/v1/stats`)).json();
    say(`tool API: ${stats.issues} ticket(s), ${stats.emails} email(s)`);
  } catch (error) {
    say(`tool API at ${args["tool-api"]} not reachable for stats: ${error.message}`);
  }
}

async function main() {
  const journal = new FileJournal(args.journal);
  const existing = await journal.read();
  const runId = existing?.run_id ?? args["run-id"] ?? `demo-${randomBytes(3).toString("hex")}`;
  if (existing === null) {
    say(`run ${runId}: new run, journal ${args.journal}`);
  } else if (existing.finished) {
    say(`run ${runId}: finished in an earlier process; everything is in ${args.journal}`);
  } else {
    say(`run ${runId}: resuming from ${args.journal} (${existing.turns.length} turn(s) saved)`);
  }
  const tools = {
    create_ticket: new HttpTool("POST", `${args.prefix}/v1/issues`),
    send_email: new HttpTool("POST", `${args.prefix}/v1/emails`),
  };
  const options = {
    client: new GatewayClient(args.gateway),
    runId,
    flowVersion: FLOW_VERSION,
    tools,
    onEvent: printer(process.env.CRASH_AFTER_EFFECT === "1"),
  };
  await Run.with(journal, options, async (run) => {
    while (!run.finished) {
      await run.step(plan);
    }
    for (const turn of run.turns) {
      for (const planned of turn.calls) {
        const result = resultOf(turn, planned.call.call_id);
        say(`journal: turn ${turn.index} ${planned.call.name} ${planned.call.call_id}: ${describe(result)} (${result.source})`);
      }
    }
  });
  await printStats();
}

try {
  await main();
} catch (error) {
  if (error instanceof ReconciliationRequired) {
    console.error(`stopped for reconciliation: ${error.message}`);
    process.exit(4);
  }
  if (error instanceof JournalError) {
    console.error(`refused: ${error.message}`);
    process.exit(3);
  }
  if (error instanceof GatewayConnectionError) {
    console.log(`gateway not reachable at ${args.gateway} (is \`make run\` running?): ${error.message}`);
    process.exit(5);
  }
  throw error;
}
