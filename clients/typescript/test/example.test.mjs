// examples/agent_recovery.mjs, the README's Node walk-through: crash after the first effect,
// resume from the receipt, then nothing left to do; the tool API ends with one of each.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, test } from "node:test";

import { runAgent } from "./support/agents.mjs";
import { ROOT, startGateway, startToolApi, temporaryDirectory } from "./support/servers.mjs";

const EXAMPLE = join(ROOT, "examples", "agent_recovery.mjs");
let tools;
let gateway;

before(async () => {
  tools = await startToolApi();
  gateway = await startGateway({ upstream: tools.url });
});

after(async () => {
  await Promise.all([gateway?.stop(), tools?.stop()]);
});

test("the example crashes after the first effect, resumes from the receipt, then has nothing left", async () => {
  const journal = join(temporaryDirectory("igw-example-"), "agent-run-node.json");
  const args = [EXAMPLE, "--gateway", gateway.url, "--tool-api", tools.url, "--journal", journal];
  const env = (crash) => ({ ...process.env, CRASH_AFTER_EFFECT: crash ? "1" : "0" });

  const crashed = await runAgent(process.execPath, args, { env: env(true) });
  assert.equal(crashed.signal, "SIGKILL", crashed.stderr);
  assert.match(crashed.stdout, /^run demo-[0-9a-f]{6}: new run, journal /m);
  assert.match(crashed.stdout, /create_ticket c1: POST \/tickets\/v1\/issues {2}\(key demo-[0-9a-f]{6}:0:c1\)/);
  assert.match(crashed.stdout, /kill -9 before its result is saved/);
  assert.deepEqual(await tools.stats(), { issues: 1, emails: 0 });

  const second = await runAgent(process.execPath, args, { env: env(false) });
  assert.equal(second.code, 0, second.stderr);
  assert.match(second.stdout, /resuming from .* \(1 turn\(s\) saved\)/);
  assert.match(second.stdout, /GET \/operations\/demo-[0-9a-f]{6}%3A0%3Ac1 -> completed/);
  assert.match(second.stdout, /create_ticket c1: receipt found, not sent again: 201 T-1/);
  assert.equal(second.stdout.match(/POST \/tickets\/v1\/emails/g)?.length, 1);
  assert.doesNotMatch(second.stdout, /POST \/tickets\/v1\/issues/);
  assert.match(second.stdout, /journal: turn 0 create_ticket c1: 201 T-1 \(receipt\)/);
  assert.match(second.stdout, /journal: turn 1 send_email c2: 202 E-1 \(response\)/);
  assert.match(second.stdout, /tool API: 1 ticket\(s\), 1 email\(s\)/);

  const third = await runAgent(process.execPath, args, { env: env(false) });
  assert.equal(third.code, 0, third.stderr);
  assert.match(third.stdout, /finished in an earlier process/);
  assert.doesNotMatch(third.stdout, /POST/);
  assert.deepEqual(await tools.stats(), { issues: 1, emails: 1 });
});
