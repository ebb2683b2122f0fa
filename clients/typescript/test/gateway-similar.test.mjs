// A Run against the real gateway's similar-operation guard (the gateway from the project's .venv,
// in front of an upstream that holds requests until the test releases them). An agent lost the key
// of its first attempt and plans the same call again: the run's new key is refused as the same
// request as the first attempt's operation (the twin). The run never makes that a second effect:
// on an unknown twin it stops naming the twin (and, once the twin is settled, takes its receipt);
// on an in-flight twin it takes the twin's key over and gets the twin's answer. Nor does a run's
// call whose own key holds another request still in flight (`key-mismatch-unsettled`): it stops.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  Backoff,
  deriveKey,
  FileJournal,
  GatewayClient,
  HttpTool,
  KeyMismatch,
  KeyMismatchUnsettled,
  operationPath,
  ReconciliationRequired,
  Run,
  SimilarOperation,
  UpstreamTimeout,
} from "../dist/index.js";
import { startGateway, startHeldUpstream, temporaryDirectory } from "./support/servers.mjs";

let held;
let gateway;
let client;
const directory = temporaryDirectory("igw-similar-gateway-");

before(async () => {
  held = await startHeldUpstream();
  gateway = await startGateway({ upstream: held.url, heldUpstream: held.url });
  client = new GatewayClient(gateway.url, { backoff: new Backoff({ initial: 0.05, maximum: 0.2 }) });
});

after(async () => {
  await Promise.all([gateway?.stop(), held?.stop()]);
});

const unique = (name) => `${name}-${process.hrtime.bigint()}`;
const BODY = { title: "printer on fire" };

const journal = (runId) => new FileJournal(join(directory, `${runId}.json`));

/** A run whose one call is the lost first attempt's: the same tool, the same arguments. */
const options = (runId, path, extra = {}) => ({
  client,
  runId,
  flowVersion: "v1",
  tools: { ticket: new HttpTool("POST", path) },
  ...extra,
});

const planOnce = (turns) => (turns.length > 0 ? [] : [{ call_id: "c1", name: "ticket", arguments: BODY }]);

describe("a run's call that is the same request as another key's operation", () => {
  test("an unknown twin stops the run naming it; once settled, the resumed run takes its receipt", async () => {
    const lost = deriveKey(unique("lost"), 0, "c1");
    const runId = unique("similar-unknown");
    const path = `/slow/hold/${unique("never")}`; // never released: the 300 ms timeout fires
    const before = held.effects();
    await assert.rejects(client.post(path, { key: lost, json: BODY, backoff: Backoff.none() }), UpstreamTimeout);

    const stopped = await Run.open(journal(runId), options(runId, path));
    try {
      await assert.rejects(stopped.step(planOnce), (error) => {
        assert.ok(error instanceof ReconciliationRequired, String(error));
        assert.deepEqual([error.key, error.callId], [deriveKey(runId, 0, "c1"), "c1"]);
        assert.deepEqual([error.similarOperation.key, error.similarOperation.state], [lost, "unknown"]);
        assert.ok(error.problem instanceof SimilarOperation);
        assert.equal(error.problem.nextAction, "reconcile");
        assert.ok(error.message.includes(`settle ${lost} (look it up at ${gateway.url}${operationPath(lost)})`), error.message);
        assert.doesNotMatch(error.message, /distinct|force/i);
        return true;
      });
    } finally {
      await stopped.close();
    }
    assert.equal(held.effects(), before + 1, "the run's call was not sent");
    assert.equal(await client.lookup(deriveKey(runId, 0, "c1")), null);

    const unknown = await client.lookup(lost);
    const receipt = { status: 201, headers: { "content-type": "application/json" }, body: '{"id":"S-found"}' };
    await client.resolve(lost, "applied", { response: receipt, ifMatch: unknown.etag });
    const resumed = await Run.open(journal(runId), options(runId, path));
    try {
      const [result] = await resumed.resume();
      assert.deepEqual([result.status, result.replayed, JSON.parse(result.body)], [201, true, { id: "S-found" }]);
      assert.equal(resumed.turns[0].calls[0].key, deriveKey(runId, 0, "c1"));
    } finally {
      await resumed.close();
    }
    assert.equal(held.effects(), before + 1);
  });

  test("an in-flight twin is taken over: the call gets the twin's answer, one effect", async () => {
    const lost = deriveKey(unique("lost"), 0, "c1");
    const name = unique("in-flight");
    const path = `/held/hold/${name}`;
    const before = held.effects();
    const first = client.post(path, { key: lost, json: BODY });
    await held.arrived(name); // claimed and forwarded: the twin is in flight until released
    const events = [];
    const onEvent = (event) => {
      events.push(event);
      // The first attempt completes a moment after the takeover is sent (which waits on it).
      if (event.kind === "took_over") setTimeout(() => held.release(name), 300);
    };
    const runId = unique("similar-in-flight");
    const turn = await Run.with(journal(runId), options(runId, path, { onEvent }), (run) => run.step(planOnce));
    const original = await first;
    assert.equal(turn.calls[0].key, deriveKey(runId, 0, "c1"));
    const result = turn.results["c1"];
    assert.deepEqual([original.status, original.replayed], [201, false]);
    assert.deepEqual([result.status, result.replayed], [201, true]);
    assert.equal(result.body, original.text);
    const tookOver = events.filter((event) => event.kind === "took_over");
    assert.deepEqual(
      tookOver.map((event) => [event.key, event.state, event.twin.key]),
      [[deriveKey(runId, 0, "c1"), "in_flight", lost]],
    );
    assert.equal(held.effects(), before + 1);
  });
});

describe("a run's call whose key holds another request, still unsettled", () => {
  test("key-mismatch-unsettled stops the run with ReconciliationRequired, as an unknown outcome does, and nothing more is sent", async () => {
    const name = unique("mismatch");
    const path = `/held/hold/${name}`;
    const runId = unique("mismatch-unsettled");
    const key = deriveKey(runId, 0, "c1");
    const before = held.effects();
    const first = client.post(path, { key, json: { title: "fire" } });
    await held.arrived(name); // the key's first call: sent, held, in flight until released
    // The key's call again with other arguments (the plan made anew), then another call.
    const plan = (turns) =>
      turns.length > 0
        ? []
        : [
            { call_id: "c1", name: "ticket", arguments: { title: "printer on fire" } },
            { call_id: "c2", name: "ticket", arguments: { title: "and the fax" } },
          ];
    const events = [];
    const run = await Run.open(journal(runId), options(runId, path, { onEvent: (event) => events.push(event) }));
    try {
      await assert.rejects(run.step(plan), (error) => {
        assert.ok(error instanceof ReconciliationRequired, String(error));
        assert.deepEqual([error.key, error.callId], [key, "c1"]);
        const problem = error.problem;
        assert.ok(problem instanceof KeyMismatchUnsettled && problem instanceof KeyMismatch, String(problem));
        assert.deepEqual([problem.status, problem.kind], [422, "key-mismatch-unsettled"]);
        assert.deepEqual([problem.state, problem.safeToRetry, problem.nextAction], ["in_flight", false, "reconcile"]);
        assert.match(error.message, /may have taken effect/);
        assert.ok(error.message.includes(`look it up at ${gateway.url}${operationPath(key)}`), error.message);
        return true;
      });
      assert.deepEqual(
        run.pending.map((planned) => planned.call.call_id),
        ["c1", "c2"],
      );
    } finally {
      await run.close();
      held.release(name);
    }
    const original = await first;
    assert.deepEqual([original.status, original.replayed], [201, false]);
    assert.deepEqual(
      events.filter((event) => event.kind === "sending").map((event) => event.callId),
      ["c1"],
    );
    assert.equal(held.effects(), before + 1, "nothing more was sent");
    assert.equal(await client.lookup(deriveKey(runId, 0, "c2")), null);
  });
});
