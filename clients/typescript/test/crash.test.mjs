// Node agents killed with kill -9 at every step boundary resume with no effect twice and
// none lost; a second worker is refused while the first lives; another flow version refuses.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { FileJournal, GatewayClient, pendingCalls } from "../dist/index.js";
import { nodeAgent, NODE_AGENT } from "./support/agents.mjs";
import { startGateway, startToolApi, temporaryDirectory } from "./support/servers.mjs";
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

const BOUNDARIES = [
  "planned:0", // the plan is saved, nothing sent
  "response:c1", // an effect happened, its result is not saved
  "recorded:c1", // the result is saved
  "response:c2",
  "recorded:c2",
  "planned:1",
  "response:c3",
  "recorded:c3",
  "finished:-",
];

let tools;
let gateway;
let client;
const directory = temporaryDirectory("igw-crash-");

before(async () => {
  tools = await startToolApi();
  gateway = await startGateway({ upstream: tools.url });
  client = new GatewayClient(gateway.url);
});

after(async () => {
  await Promise.all([gateway?.stop(), tools?.stop()]);
});

function argsFor(runId) {
  return [
    "--gateway",
    gateway.url,
    "--journal",
    join(directory, `${runId}.json`),
    "--run-id",
    runId,
    "--plan-log",
    join(directory, `${runId}.plans`),
  ];
}

/** Each of the run's three effects happened exactly once, and the journal holds every result. */
async function assertEachEffectOnce(runId) {
  const operations = {};
  for (const key of [`${runId}:0:c1`, `${runId}:0:c2`, `${runId}:1:c3`]) {
    const operation = await client.lookup(key);
    assert.ok(operation, `${key} has a record`);
    assert.deepEqual([operation.state, operation.attempts], ["completed", 1], key);
    operations[key] = operation;
  }
  const issues = await tools.issues();
  const tickets = [`${runId}:0:c1`, `${runId}:0:c2`].map((key) => {
    const found = issues.filter((issue) => issue.idempotency_key === operations[key].id);
    assert.equal(found.length, 1, `one ticket for ${key}`);
    return found[0].id;
  });
  const emails = (await (await fetch(`${tools.url}/v1/emails`)).json()).items;
  assert.equal(emails.filter((email) => email.subject === `opened ${tickets.join(" and ")}`).length, 1);
  const journal = await new FileJournal(join(directory, `${runId}.json`)).load(runId);
  assert.ok(journal.finished);
  assert.ok(journal.turns.every((turn) => pendingCalls(turn).length === 0));
  return journal;
}

describe("kill -9 of a Node agent at every step boundary, then resume", () => {
  BOUNDARIES.forEach((boundary, index) => {
    test(boundary, async () => {
      const runId = `crash-${index}`;
      const killed = await nodeAgent(argsFor(runId), { pauseAt: boundary });
      assert.equal(killed.signal, "SIGKILL", killed.stderr);
      const resumed = await nodeAgent(argsFor(runId));
      assert.equal(resumed.code, 0, resumed.stderr);
      assert.match(resumed.stdout, /DONE/);

      const journal = await assertEachEffectOnce(runId);
      const plans = readFileSync(join(directory, `${runId}.plans`), "utf-8").split(/\s+/).filter(Boolean);
      assert.deepEqual(plans, ["0", "1", "2"], "the model was never asked twice for a saved turn");
      const [kind, call] = boundary.split(":");
      if (kind === "response") {
        const turn = journal.turns[call === "c3" ? 1 : 0];
        assert.equal(turn.results[call].source, "receipt", "the effect's result came from the gateway's receipt");
        assert.match(resumed.stdout, new RegExp(`EVENT lookup:${call}`));
      }
    });
  });
});

describe("one worker per run", () => {
  test("a second worker is refused naming the holder; after the holder dies, it resumes", async () => {
    const runId = "two-workers";
    const holder = spawn(process.execPath, [NODE_AGENT, ...argsFor(runId), "--worker", "worker-a", "--pause-at", "recorded:c1"], {
      stdio: ["ignore", "pipe", "inherit"],
    });
    const exited = new Promise((resolve) => holder.once("close", resolve));
    try {
      await new Promise((resolve, reject) => {
        const timer = setTimeout(() => reject(new Error("the holder never paused")), 180_000);
        createInterface({ input: holder.stdout }).on("line", (line) => {
          if (line.startsWith("PAUSED")) {
            clearTimeout(timer);
            resolve();
          }
        });
      });
      const second = await nodeAgent([...argsFor(runId), "--worker", "worker-b"]);
      assert.equal(second.code, 3);
      assert.match(second.stderr, /RunLeased: run 'two-workers' is held by worker 'worker-a'/);
      assert.match(second.stderr, new RegExp(`pid ${holder.pid}`));
      assert.doesNotMatch(second.stdout, /EVENT/, "it did nothing at all");
    } finally {
      holder.kill("SIGKILL");
      await exited;
    }
    const resumed = await nodeAgent([...argsFor(runId), "--worker", "worker-b"]);
    assert.equal(resumed.code, 0, resumed.stderr);
    const journal = await assertEachEffectOnce(runId);
    assert.deepEqual([journal.lease.holder, journal.lease.token], ["worker-b", 2]);
  });

  test("a journal written by flow v1 is not resumed by v2, and nothing is sent", async () => {
    const runId = "flow-version";
    const killed = await nodeAgent(argsFor(runId), { pauseAt: "planned:0" });
    assert.equal(killed.signal, "SIGKILL");
    const refused = await nodeAgent([...argsFor(runId), "--flow-version", "v2"]);
    assert.equal(refused.code, 3);
    assert.match(refused.stderr, /IncompatibleJournal: run 'flow-version' was written by flow version 'v1'/);
    assert.match(refused.stderr, /runs flow version 'v2'/);
    assert.equal(await client.lookup(`${runId}:0:c1`), null);
  });
});
