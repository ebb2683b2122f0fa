// GatewayClient's own rules, with a scripted fetch: which answers are retried (and with
// what), which are thrown at once, and what is sent.
import assert from "node:assert/strict";
import { describe, test } from "node:test";

import {
  Backoff,
  GatewayClient,
  GatewayConnectionError,
  InProgress,
  KeyFormatError,
  KeyMismatch,
  StoreUnavailable,
} from "../dist/index.js";

const BASE = "https://idempotency-gateway.dev/problems/";

function problem(status, kind, { safe, retryAfter } = {}) {
  const headers = { "Content-Type": "application/problem+json" };
  if (retryAfter !== undefined) headers["Retry-After"] = String(retryAfter);
  const body = { type: BASE + kind, status, title: kind, key: "k-1", safe_to_retry: safe ?? false };
  return () => new Response(JSON.stringify(body), { status, headers });
}

const ok = () => new Response('{"id":"T-1"}', { status: 201, headers: { "Content-Type": "application/json" } });
const lost = () => {
  throw new TypeError("fetch failed", { cause: new Error("ECONNRESET") });
};

/** A fetch that answers from `script` in order and records what it was sent. */
function scripted(...script) {
  const sent = [];
  const fetch = async (url, init) => {
    sent.push({ url, ...init, headers: new Headers(init.headers) });
    const next = script.shift();
    assert.ok(next, "more requests than the script has answers");
    return next();
  };
  return { fetch, sent };
}

const fast = new Backoff({ initial: 0.001, maximum: 0.01 });

describe("GatewayClient.request", () => {
  test("a safe-to-retry problem is resent with the same key and body until the tool answers", async () => {
    const { fetch, sent } = scripted(problem(503, "store-unavailable", { safe: true, retryAfter: 0 }), problem(409, "in-progress", { safe: true, retryAfter: 0 }), ok);
    const client = new GatewayClient("http://gw.test", { fetch, backoff: fast });
    const response = await client.post("/tickets/v1/issues", { key: "k-1", json: { b: 1, a: 1.0 } });
    assert.equal(response.status, 201);
    assert.equal(sent.length, 3);
    for (const request of sent) {
      assert.equal(request.headers.get("idempotency-key"), "k-1");
      assert.equal(request.body, '{"a":1,"b":1}');
      assert.equal(request.headers.get("content-type"), "application/json");
    }
  });

  test("a request fetch refuses before sending (a method it cannot send) is its TypeError, not retried", async () => {
    const { fetch, sent } = scripted(ok);
    const client = new GatewayClient("http://gw.test", { fetch, backoff: fast });
    await assert.rejects(client.request("CONNECT", "/x", { key: "k-1" }), (error) => {
      assert.ok(!(error instanceof GatewayConnectionError), String(error));
      return error instanceof TypeError;
    });
    assert.equal(sent.length, 0);
  });

  test("a problem that is not safe to retry is thrown at once", async () => {
    const { fetch, sent } = scripted(problem(422, "key-mismatch"));
    const client = new GatewayClient("http://gw.test", { fetch, backoff: fast });
    await assert.rejects(client.post("/x", { key: "k-1", json: {} }), KeyMismatch);
    assert.equal(sent.length, 1);
  });

  test("past the backoff's attempts, the last problem is thrown", async () => {
    const { fetch, sent } = scripted(...Array.from({ length: 3 }, () => problem(409, "in-progress", { safe: true })));
    const client = new GatewayClient("http://gw.test", { fetch, backoff: new Backoff({ attempts: 3, initial: 0.001 }) });
    await assert.rejects(client.post("/x", { key: "k-1", json: {} }), InProgress);
    assert.equal(sent.length, 3);
  });

  test("Retry-After past the backoff's total gives up at once rather than wait", async () => {
    const { fetch, sent } = scripted(problem(503, "store-unavailable", { safe: true, retryAfter: 60 }));
    const client = new GatewayClient("http://gw.test", { fetch, backoff: new Backoff({ total: 5 }) });
    const started = performance.now();
    await assert.rejects(client.post("/x", { key: "k-1", json: {} }), (error) => error instanceof StoreUnavailable && error.retryAfter === 60);
    assert.ok(performance.now() - started < 1000);
    assert.equal(sent.length, 1);
  });

  test("a lost connection is retried only when the request has a key", async () => {
    const keyed = scripted(lost, ok);
    const response = await new GatewayClient("http://gw.test", { fetch: keyed.fetch, backoff: fast }).post("/x", { key: "k-1", json: {} });
    assert.equal(response.status, 201);
    const unkeyed = scripted(lost);
    await assert.rejects(
      new GatewayClient("http://gw.test", { fetch: unkeyed.fetch, backoff: fast }).request("POST", "/x", { key: null, json: {} }),
      (error) => error instanceof GatewayConnectionError && error.safeToRetry === false && error.cause instanceof TypeError,
    );
    assert.equal(unkeyed.sent.length, 1);
  });

  test("headers: one value per name whatever its case; the key only as the key", async () => {
    const { fetch, sent } = scripted(ok);
    const client = new GatewayClient("http://gw.test/", { fetch, headers: { Authorization: "Bearer old" } });
    await client.post("/x", { key: '"quoted', json: [], headers: { authorization: "Bearer new" }, wait: 5 });
    assert.equal(sent[0].url, "http://gw.test/x");
    assert.equal(sent[0].headers.get("authorization"), "Bearer new");
    assert.equal(sent[0].headers.get("idempotency-key"), '"\\"quoted"');
    // A key with a space at either end is one the gateway refuses: never sent.
    await assert.rejects(client.post("/x", { key: " padded", json: [] }), KeyFormatError);
    assert.equal(sent.length, 1);
    assert.equal(sent[0].headers.get("prefer"), "wait=5");
    assert.equal(sent[0].headers.get("accept-encoding"), "identity");
    await assert.rejects(client.post("/x", { key: "k", json: {}, headers: { "idempotency-key": "k" } }), TypeError);
    await assert.rejects(client.post("/x", { key: "k", json: {}, body: "{}" }), TypeError);
  });

  test("an upstream's own problem+json is the tool's answer, not an error", async () => {
    const upstream = () =>
      new Response(JSON.stringify({ type: "https://tickets.example/duplicate", status: 409 }), {
        status: 409,
        headers: { "Content-Type": "application/problem+json" },
      });
    const { fetch } = scripted(upstream);
    const response = await new GatewayClient("http://gw.test", { fetch }).post("/x", { key: "k", json: {} });
    assert.equal(response.status, 409);
  });

  test("a base URL that is not http(s) is refused", () => {
    assert.throws(() => new GatewayClient("ftp://gw.test"), TypeError);
    assert.throws(() => new GatewayClient("not a url"), TypeError);
  });
});
