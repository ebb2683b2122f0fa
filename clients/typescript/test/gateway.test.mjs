// GatewayClient against the real gateway (from the project's .venv) in front of the
// example ticket API and an upstream that holds requests until the test releases them:
// replay, mismatch, unknown, lookup, resolve (too early, then accepted), in-progress with
// Retry-After and Prefer: wait, and transport failures.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import {
  Backoff,
  GatewayClient,
  GatewayConnectionError,
  KeyConflict,
  KeyMismatch,
  NotResolvable,
  OutcomeUnknown,
  PreconditionFailed,
  TooEarly,
  UpstreamTimeout,
  bodyJson,
  deriveKey,
} from "../dist/index.js";
import { startGateway, startHeldUpstream, startToolApi } from "./support/servers.mjs";

let tools;
let held;
let gateway;
let client;
let quick;
let quickClient;

// A not_applied resolve is accepted once the tool can no longer be applying the last send:
// after the lease, the route's timeout and its not_applied_after. On /quick, about a second.
const QUICK_ROUTE = '[[routes]]\nname = "quick"\nprefix = "/quick"\nupstream = "%s"\ntimeout = "300ms"\nnot_applied_after = "0s"\n';

before(async () => {
  [tools, held] = await Promise.all([startToolApi(), startHeldUpstream()]);
  [gateway, quick] = await Promise.all([
    startGateway({ upstream: tools.url, heldUpstream: held.url }),
    startGateway({ upstream: tools.url, lease: "1s", extraRoutes: [QUICK_ROUTE.replace("%s", held.url)] }),
  ]);
  client = new GatewayClient(gateway.url);
  quickClient = new GatewayClient(quick.url);
});

after(async () => {
  await Promise.all([gateway?.stop(), quick?.stop(), tools?.stop(), held?.stop()]);
});

const sleep = (seconds) => new Promise((resolve) => setTimeout(resolve, seconds * 1000));

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
    const slowPath = `/slow/hold/${unique("never")}`; // never released: the 300 ms timeout fires
    const before = held.effects();
    await assert.rejects(client.post(slowPath, { key, json: { amount: 5 } }), (error) => {
      assert.ok(error instanceof UpstreamTimeout && error instanceof OutcomeUnknown);
      assert.deepEqual([error.status, error.state, error.safeToRetry], [504, "unknown", false]);
      return true;
    });
    await assert.rejects(client.post(slowPath, { key, json: { amount: 5 } }), (error) => {
      assert.ok(error instanceof OutcomeUnknown);
      assert.deepEqual([error.status, error.kind, error.state], [409, "outcome-unknown", "unknown"]);
      return true;
    });
    assert.equal(held.effects(), before + 1, "the retry was never forwarded");

    const unknown = await client.lookup(key);
    assert.deepEqual([unknown.state, unknown.safe_to_retry, unknown.response], ["unknown", false, null]);

    const receipt = { status: 201, headers: { "content-type": "application/json" }, body: '{"id":"S-found"}' };
    await assert.rejects(
      client.resolve(key, "applied", { response: receipt, note: "seen in the ledger", ifMatch: '"stale"' }),
      PreconditionFailed,
    );
    const resolved = await client.resolve(key, "applied", { response: receipt, note: "seen in the ledger", ifMatch: unknown.etag });
    assert.deepEqual([resolved.state, resolved.resolution.by, resolved.resolution.note], ["completed", "owner", "seen in the ledger"]);

    const replay = await client.post(slowPath, { key, json: { amount: 5 } });
    assert.deepEqual([replay.status, replay.replayed, replay.json()], [201, true, { id: "S-found" }]);
    assert.equal(held.effects(), before + 1);
    await assert.rejects(client.resolve(key, "not_applied"), NotResolvable);
  });

  test("resolving not_applied while the tool may still apply the send is TooEarly; the key stays unknown", async () => {
    const key = deriveKey(unique("too-early"), 0, "c1");
    const slowPath = `/slow/hold/${unique("never")}`; // never released: the 300 ms timeout fires
    await assert.rejects(client.post(slowPath, { key, json: {} }), OutcomeUnknown);
    const unknown = await client.lookup(key);
    await assert.rejects(client.resolve(key, "not_applied", { note: "no such payment yet" }), (error) => {
      assert.ok(error instanceof TooEarly && error instanceof KeyConflict);
      assert.deepEqual(
        [error.status, error.kind, error.key, error.state, error.safeToRetry],
        [409, "too-early", key, "unknown", true], // the same resolve, after Retry-After
      );
      assert.equal(error.allowedAt, unknown.not_applied_allowed_at);
      assert.ok(error.lastSendAge >= 0 && error.lastSendAge < 60, `lastSendAge ${error.lastSendAge}`);
      assert.ok(error.retryAfter >= 1, `retryAfter ${error.retryAfter}`);
      assert.doesNotMatch(error.detail, /force/);
      return true;
    });
    const after = await client.lookup(key);
    assert.deepEqual([after.state, after.etag], ["unknown", unknown.etag]);
  });

  test("resolved not_applied once allowed releases the key: the same request with the same key is sent again", async () => {
    const key = deriveKey(unique("not-applied"), 0, "c1");
    const quickPath = `/quick/hold/${unique("never")}`; // never released: the 300 ms timeout fires
    await assert.rejects(quickClient.post(quickPath, { key, json: {} }), OutcomeUnknown);
    const sentBefore = held.effects();
    const early = await quickClient.resolve(key, "not_applied").then(
      () => assert.fail("a release before the lease ran out was accepted"),
      (error) => error,
    );
    assert.ok(early instanceof TooEarly, String(early));
    await sleep(early.retryAfter); // the instant `allowedAt` names
    const released = await quickClient.resolve(key, "not_applied", { note: "no such payment" });
    assert.deepEqual([released.state, released.resolution.by], ["released", "owner"]);
    await assert.rejects(quickClient.post(quickPath, { key, json: {} }), UpstreamTimeout);
    assert.equal(held.effects(), sentBefore + 1, "a released key is forwarded again");
  });
});

describe("waiting for an attempt in flight", () => {
  test("in-progress is waited out with Retry-After, then the receipt replays", async () => {
    const key = deriveKey(unique("in-progress"), 0, "c1");
    const name = unique("in-progress");
    const before = held.effects();
    const first = client.post(`/held/hold/${name}`, { key, json: { n: 1 } });
    await held.arrived(name); // claimed and forwarded: the key is in flight until released
    let sawInProgress;
    const inProgress = new Promise((resolve) => (sawInProgress = resolve));
    const watching = new GatewayClient(gateway.url, {
      fetch: async (...args) => {
        const answer = await fetch(...args);
        if (answer.status === 409) {
          sawInProgress(answer.headers.get("retry-after"));
        }
        return answer;
      },
    });
    const second = watching.post(`/held/hold/${name}`, { key, json: { n: 1 } });
    assert.match(await inProgress, /^\d+$/, "the 409 in-progress carried Retry-After");
    held.release(name);
    assert.equal((await first).replayed, false);
    assert.equal((await second).replayed, true);
    assert.equal(held.effects(), before + 1);
  });

  test("Prefer: wait holds the answer at the gateway until the first attempt completes", async () => {
    const key = deriveKey(unique("prefer-wait"), 0, "c1");
    const name = unique("prefer-wait");
    const first = client.post(`/held/hold/${name}`, { key, json: { n: 2 } });
    await held.arrived(name); // claimed and forwarded: the key is in flight until released
    let sent;
    const sending = new Promise((resolve) => (sent = resolve));
    const waiting = new GatewayClient(gateway.url, {
      fetch: (...args) => {
        sent();
        return fetch(...args);
      },
    });
    // Without a retry of its own (Backoff.none()), the second call can only end in the replay
    // if the gateway held its answer: a 409 in-progress would be thrown.
    const second = waiting.post(`/held/hold/${name}`, { key, json: { n: 2 }, wait: 30, backoff: Backoff.none() });
    await sending;
    // Released once the second request is on its way. The gateway shows no sign of a held
    // answer to wait for; if load delays the second past the release, it is answered from the
    // receipt and still passes: no delay can make this test fail.
    await new Promise((resolve) => setTimeout(resolve, 200));
    held.release(name);
    assert.equal((await second).replayed, true);
    assert.equal((await first).replayed, false);
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
