// GatewayClient against the real gateway (from the project's .venv) in front of the
// example ticket API and a slow upstream: replay, mismatch, unknown, lookup, resolve,
// in-progress with Retry-After and Prefer: wait, and transport failures.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Backoff,
  GatewayClient,
  GatewayConnectionError,
  KeyMismatch,
  NotResolvable,
  OutcomeUnknown,
  PreconditionFailed,
  UpstreamTimeout,
  bodyJson,
  deriveKey,
} from "../dist/index.js";
import { startGateway, startSlowUpstream, startToolApi } from "./support/servers.mjs";

let tools;
let slow;
let gateway;
let client;

before(async () => {
  [tools, slow] = await Promise.all([startToolApi(), startSlowUpstream()]);
  gateway = await startGateway({ upstream: tools.url, slowUpstream: slow.url });
  client = new GatewayClient(gateway.url);
});

after(async () => {
  await Promise.all([gateway?.stop(), tools?.stop(), slow?.stop()]);
});

const unique = (name) => `${name}-${process.hrtime.bigint()}`;

describe("a call through the gateway", () => {
  test("a retry with the same key replays the receipt; the tool applied one effect", async () => {
    const key = deriveKey(unique("replay"), 0, "c1");
    const before = (await tools.stats()).issues;
    const first = await client.request("POST", "/tickets/v1/issues", { key, json: { title: "Printer on fire" } });
    const second = await client.request("POST", "/tickets/v1/issues", { key, json: { title: "Printer on fire" } });
    assert.deepEqual([first.status, first.replayed, first.key, first.state], [201, false, key, "completed"]);
    assert.deepEqual([second.status, second.replayed], [201, true]);
    assert.deepEqual(second.body, first.body);
    assert.equal((await tools.stats()).issues, before + 1);
  });

  test("the same key with another request is KeyMismatch, never the other request's receipt", async () => {
    const key = deriveKey(unique("mismatch"), 0, "c1");
    await client.post("/tickets/v1/issues", { key, json: { title: "one" } });
    const before = (await tools.stats()).issues;
    await assert.rejects(client.post("/tickets/v1/issues", { key, json: { title: "another" } }), (error) => {
      assert.ok(error instanceof KeyMismatch);
      assert.deepEqual([error.status, error.kind, error.safeToRetry, error.key], [422, "key-mismatch", false, key]);
      assert.equal(error.operation, `/operations/${encodeURIComponent(key)}`);
      return true;
    });
    assert.equal((await tools.stats()).issues, before);
  });

  test("the same arguments in another member order are the same request (canonical JSON)", async () => {
    const key = deriveKey(unique("order"), 0, "c1");
    await client.post("/tickets/v1/issues", { key, json: { title: "same", tags: ["a"] } });
    const again = await client.post("/tickets/v1/issues", { key, json: { tags: ["a"], title: "same" } });
    assert.equal(again.replayed, true);
  });

  test("a key the gateway has never seen looks up as null", async () => {
    assert.equal(await client.lookup(deriveKey(unique("never"), 0, "c1")), null);
  });

  test("a completed call looks up with its receipt and an ETag", async () => {
    const key = deriveKey(unique("lookup"), 0, "c1");
    const sent = await client.post("/tickets/v1/issues", { key, json: { title: "look me up" } });
    const operation = await client.lookup(key);
    assert.ok(operation);
    assert.deepEqual(
      [operation.key, operation.state, operation.method, operation.path, operation.attempts, operation.safe_to_retry],
      [key, "completed", "POST", "/tickets/v1/issues", 1, true],
    );
    assert.equal(operation.response.status, 201);
    assert.deepEqual(bodyJson(operation.response), sent.json());
    assert.match(operation.etag, /^(W\/)?".+"$/);
  });
});

describe("an effect whose outcome nobody knows", () => {
  test("a timeout is OutcomeUnknown; a retry is refused and sends nothing; resolve settles it", async () => {
    const key = deriveKey(unique("unknown"), 0, "c1");
    const before = slow.effects();
    await assert.rejects(client.post("/slow/wait-1500", { key, json: { amount: 5 } }), (error) => {
      assert.ok(error instanceof UpstreamTimeout && error instanceof OutcomeUnknown);
      assert.deepEqual([error.status, error.state, error.safeToRetry], [504, "unknown", false]);
      return true;
    });
    await assert.rejects(client.post("/slow/wait-1500", { key, json: { amount: 5 } }), (error) => {
      assert.ok(error instanceof OutcomeUnknown);
      assert.deepEqual([error.status, error.kind, error.state], [409, "outcome-unknown", "unknown"]);
      return true;
    });
    assert.equal(slow.effects(), before + 1, "the retry was never forwarded");

    const unknown = await client.lookup(key);
    assert.deepEqual([unknown.state, unknown.safe_to_retry, unknown.response], ["unknown", false, null]);

    const receipt = { status: 201, headers: { "content-type": "application/json" }, body: '{"id":"S-found"}' };
    await assert.rejects(
      client.resolve(key, "applied", { response: receipt, note: "seen in the ledger", ifMatch: '"stale"' }),
      PreconditionFailed,
    );
    const resolved = await client.resolve(key, "applied", { response: receipt, note: "seen in the ledger", ifMatch: unknown.etag });
    assert.deepEqual([resolved.state, resolved.resolution.by, resolved.resolution.note], ["completed", "owner", "seen in the ledger"]);

    const replay = await client.post("/slow/wait-1500", { key, json: { amount: 5 } });
    assert.deepEqual([replay.status, replay.replayed, replay.json()], [201, true, { id: "S-found" }]);
    assert.equal(slow.effects(), before + 1);
    await assert.rejects(client.resolve(key, "not_applied"), NotResolvable);
  });

  test("resolved not_applied releases the key: the same request with the same key is sent again", async () => {
    const key = deriveKey(unique("not-applied"), 0, "c1");
    await assert.rejects(client.post("/slow/wait-1500", { key, json: {} }), OutcomeUnknown);
    const sentBefore = slow.effects();
    const released = await client.resolve(key, "not_applied", { note: "no such payment" });
    assert.deepEqual([released.state, released.resolution.by], ["released", "owner"]);
    await assert.rejects(client.post("/slow/wait-1500", { key, json: {} }), UpstreamTimeout);
    assert.equal(slow.effects(), sentBefore + 1, "a released key is forwarded again");
  });
});

describe("waiting for an attempt in flight", () => {
  test("in-progress is waited out with Retry-After, then the receipt replays", async () => {
    const key = deriveKey(unique("in-progress"), 0, "c1");
    const before = slow.effects();
    const first = client.post("/slow/wait-250", { key, json: { n: 1 } });
    await new Promise((resolve) => setTimeout(resolve, 80));
    const second = await client.post("/slow/wait-250", { key, json: { n: 1 } });
    assert.equal((await first).replayed, false);
    assert.equal(second.replayed, true);
    assert.equal(slow.effects(), before + 1);
  });

  test("Prefer: wait holds the answer at the gateway until the first attempt completes", async () => {
    const key = deriveKey(unique("prefer-wait"), 0, "c1");
    const first = client.post("/slow/wait-250", { key, json: { n: 2 } });
    await new Promise((resolve) => setTimeout(resolve, 80));
    const started = performance.now();
    const second = await client.post("/slow/wait-250", { key, json: { n: 2 }, wait: 5, backoff: Backoff.none() });
    assert.equal(second.replayed, true);
    assert.ok(performance.now() - started < 900, "answered when the first completed, not after a Retry-After");
    await first;
  });
});

describe("transport failures", () => {
  test("an unreachable gateway is GatewayConnectionError, safe to retry with a key", async () => {
    const nowhere = new GatewayClient("http://127.0.0.1:9", { backoff: Backoff.none(), timeout: 2 });
    await assert.rejects(nowhere.post("/tickets/v1/issues", { key: "k-1", json: {} }), (error) => {
      assert.ok(error instanceof GatewayConnectionError);
      assert.deepEqual([error.key, error.safeToRetry], ["k-1", true]);
      return true;
    });
    await assert.rejects(nowhere.request("GET", "/tickets/v1/issues", { key: null }), (error) => {
      assert.equal(error.safeToRetry, false);
      return true;
    });
  });

  test("a key the gateway would refuse is refused before anything is sent", async () => {
    await assert.rejects(client.post("/tickets/v1/issues", { key: "caf\u00e9", json: {} }), { name: "KeyFormatError" });
  });
});
