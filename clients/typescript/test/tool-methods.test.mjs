// A Run's GET, HEAD and DELETE steps against the real gateway (from the project's .venv), on a
// route that protects them, in front of an upstream that records what reached it. A GET or HEAD
// carries no body (fetch refuses one), so a bodiless planned call must be sent as one: no body,
// no Content-Type. A body on GET or HEAD is refused at once, never reported as a lost connection.
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Backoff, FileJournal, GatewayClient, GatewayConnectionError, HttpTool, Run } from "../dist/index.js";
import { startGateway, temporaryDirectory } from "./support/servers.mjs";

const ROUTE =
  '[[routes]]\nname = "items"\nprefix = "/items"\nupstream = "%s"\ntimeout = "60s"\n' +
  'methods = ["GET", "HEAD", "DELETE", "POST"]\n';

let upstream;
let gateway;
let client;
const directory = temporaryDirectory("igw-methods-");

/** An upstream that answers every request with 200 and records what arrived. */
async function startRecordingUpstream() {
  const received = [];
  const server = createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      received.push({
        method: request.method,
        target: request.url,
        body: Buffer.concat(chunks).toString("utf8"),
        contentType: request.headers["content-type"] ?? null,
      });
      response.writeHead(200, { "Content-Type": "application/json" });
      response.end(JSON.stringify({ seen: received.length }));
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    received,
    stop: () => new Promise((resolve) => server.close(resolve)),
  };
}

before(async () => {
  upstream = await startRecordingUpstream();
  gateway = await startGateway({ upstream: upstream.url, extraRoutes: [ROUTE.replace("%s", upstream.url)] });
  // Retries are not what these tests are about: a refusal retried as a lost connection fails fast.
  client = new GatewayClient(gateway.url, { backoff: new Backoff({ initial: 0.05, maximum: 0.2, total: 1 }) });
});

after(async () => {
  await Promise.all([gateway?.stop(), upstream?.stop()]);
});

const unique = (name) => `${name}-${process.hrtime.bigint()}`;

/** Run one turn of `calls` with `tools` to the end; the run's last journal document. */
async function runOnce(tools, calls) {
  const runId = unique("methods");
  const journal = new FileJournal(join(directory, `${runId}.json`));
  const run = await Run.open(journal, { client, runId, flowVersion: "v1", tools });
  try {
    while (!run.finished) {
      await run.step((turns) => (turns.length > 0 ? [] : calls));
    }
  } finally {
    await run.close();
  }
  return { runId, document: await journal.read() };
}

describe("a run's steps with methods that take no body", () => {
  test("GET, HEAD and DELETE steps are sent through the gateway, recorded, and look up completed", async () => {
    const path = `/items/v1/${unique("item")}`;
    const tools = {
      read: new HttpTool("GET", `${path}?state=open`),
      peek: new HttpTool("HEAD", path),
      remove: new HttpTool("DELETE", path),
    };
    const calls = [
      { call_id: "c1", name: "read", arguments: {} },
      { call_id: "c2", name: "peek", arguments: {} },
      { call_id: "c3", name: "remove", arguments: { reason: "duplicate" } },
    ];
    const before = upstream.received.length;
    const { runId, document } = await runOnce(tools, calls);
    const [turn] = document.turns;
    assert.deepEqual(
      turn.calls.map((planned) => [planned.request.method, planned.request.json]),
      [
        ["GET", null],
        ["HEAD", null],
        ["DELETE", { reason: "duplicate" }],
      ],
    );
    assert.deepEqual(
      ["c1", "c2", "c3"].map((id) => [turn.results[id].status, turn.results[id].state]),
      [
        [200, "completed"],
        [200, "completed"],
        [200, "completed"],
      ],
    );
    const target = `/v1/${path.split("/").at(-1)}`; // the route's prefix taken off
    assert.deepEqual(upstream.received.slice(before), [
      { method: "GET", target: `${target}?state=open`, body: "", contentType: null },
      { method: "HEAD", target, body: "", contentType: null },
      { method: "DELETE", target, body: '{"reason":"duplicate"}', contentType: "application/json" },
    ]);
    for (const id of ["c1", "c2", "c3"]) {
      const operation = await client.lookup(`${runId}:0:${id}`);
      assert.equal(operation?.state, "completed", id);
    }
  });

  test("a GET or HEAD with a body is refused when the plan is made: nothing is saved or sent", async () => {
    const tools = {
      read: new HttpTool("GET", "/items/v1/x"),
      peek: new HttpTool("HEAD", "/items/v1/x"),
      // A tool of one's own that (wrongly) gives a GET a body.
      own: { request: (call) => ({ method: "get", path: "/items/v1/x", json: call.arguments, headers: {} }) },
    };
    const runId = unique("refused");
    const journal = new FileJournal(join(directory, `${runId}.json`));
    const run = await Run.open(journal, { client, runId, flowVersion: "v1", tools });
    const before = upstream.received.length;
    try {
      for (const name of Object.keys(tools)) {
        await assert.rejects(run.step(() => [{ call_id: "c1", name, arguments: { q: "x" } }]), (error) => {
          assert.ok(error instanceof TypeError, String(error));
          assert.match(error.message, /(GET|HEAD) request has no body/);
          return true;
        });
      }
    } finally {
      await run.close();
    }
    assert.deepEqual((await journal.read()).turns, []);
    assert.equal(upstream.received.length, before);
  });
});

describe("GatewayClient.request with a body on a method that takes none", () => {
  for (const method of ["GET", "HEAD", "get"]) {
    for (const [what, options] of [
      ["json", { json: { q: "x" } }],
      ["an empty json object", { json: {} }],
      ["a body", { body: "q=x" }],
    ]) {
      test(`${method} with ${what}: a TypeError at once, never retried as a lost connection`, async () => {
        const patient = new GatewayClient(gateway.url); // the default backoff: 30 s of retries
        const before = upstream.received.length;
        const started = performance.now();
        await assert.rejects(patient.request(method, "/items/v1/x", { key: unique("k"), ...options }), (error) => {
          assert.ok(!(error instanceof GatewayConnectionError), String(error));
          assert.ok(error instanceof TypeError, String(error));
          assert.match(error.message, /GET|HEAD/);
          return true;
        });
        assert.ok(performance.now() - started < 2000, "refused without retries");
        assert.equal(upstream.received.length, before);
      });
    }
  }

  test("json null is no body: GET and POST send none and no Content-Type", async () => {
    const before = upstream.received.length;
    for (const method of ["GET", "POST"]) {
      const answer = await client.request(method, "/items/v1/null", { key: unique("k"), json: null });
      assert.equal(answer.status, 200, method);
    }
    assert.deepEqual(upstream.received.slice(before), [
      { method: "GET", target: "/v1/null", body: "", contentType: null },
      { method: "POST", target: "/v1/null", body: "", contentType: null },
    ]);
  });
});
