// The Node client against the shared vectors in clients/vectors/ (the Python client reads them too):
// keys, canonical JSON, the gateway's problem bodies, journal files at each step, the lease rules,
// the requests planned calls send.
import assert from "node:assert/strict";
import { readFileSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import {
  canonicalJson,
  deriveKey,
  FileJournal,
  GatewayClient,
  HttpTool,
  Run,
  fence,
  grant,
  keyHeader,
  operationPath,
  parseJournal,
  pendingCalls,
  problemFrom,
  serializeJournal,
  SimilarOperation,
  validateKey,
} from "../dist/index.js";
import { temporaryDirectory } from "./support/servers.mjs";

const VECTORS = new URL("../../vectors/", import.meta.url);
const load = (name) => JSON.parse(readFileSync(new URL(name, VECTORS), "utf-8"));
const KEYS = load("keys.json");
const CANONICAL = load("canonical-json.json");
const PROBLEMS = load("problems.json");
const JOURNALS = load("journals/index.json");
const LEASES = load("leases.json");
const REQUESTS = load("requests.json");

const errorName = (fn) => {
  try {
    fn();
  } catch (error) {
    return error;
  }
  assert.fail("expected an error");
};

describe("keys", () => {
  for (const vector of KEYS.derive) {
    test(`derive ${JSON.stringify(vector).slice(0, 60)}`, () => {
      if (vector.error) {
        assert.equal(errorName(() => deriveKey(vector.run_id, vector.turn, vector.call_id)).name, vector.error);
      } else {
        assert.equal(deriveKey(vector.run_id, vector.turn, vector.call_id), vector.key);
      }
    });
  }
  for (const vector of KEYS.validate) {
    test(`validate ${JSON.stringify(vector.key).slice(0, 40)}`, () => {
      if (vector.valid) {
        assert.equal(validateKey(vector.key), vector.key);
      } else {
        assert.equal(errorName(() => validateKey(vector.key)).name, "KeyFormatError");
      }
    });
  }
  for (const vector of KEYS.operation_path) {
    test(`operation path of ${vector.key}`, () => assert.equal(operationPath(vector.key), vector.path));
  }
  for (const vector of KEYS.header) {
    test(`header of ${JSON.stringify(vector.key)}`, () => assert.equal(keyHeader(vector.key), vector.header));
  }
});

describe("canonical JSON (RFC 8785)", () => {
  for (const vector of CANONICAL.canonical) {
    test(vector.canonical.slice(0, 50), () => assert.equal(canonicalJson(vector.value), vector.canonical));
  }
  for (const vector of CANONICAL.beyond_2_53.cases) {
    test(`beyond 2^53: ${vector.json} is the nearest double`, () => {
      assert.equal(canonicalJson(JSON.parse(vector.json)), vector.javascript);
    });
  }
});

describe("problem bodies", () => {
  for (const vector of PROBLEMS.cases) {
    test(vector.description, () => {
      const problem = problemFrom(vector.status, new Headers(vector.headers), new TextEncoder().encode(vector.body));
      const expect = vector.expect;
      if (!expect.problem) {
        assert.equal(problem, null);
        return;
      }
      assert.ok(problem);
      assert.equal(problem.name, expect.class);
      assert.equal(problem.kind, expect.kind);
      assert.equal(problem.status, vector.status);
      assert.equal(problem.safeToRetry, expect.safe_to_retry);
      assert.equal(problem.nextAction, expect.next_action);
      assert.equal(problem.state, expect.state);
      assert.equal(problem.key, expect.key);
      assert.equal(problem.operation, expect.operation);
      if (expect.retry_after === null) {
        assert.equal(problem.retryAfter, null);
      } else {
        assert.ok(Math.abs(problem.retryAfter - expect.retry_after) <= 1, `retryAfter ${problem.retryAfter}`);
      }
      if (expect.similar_operation !== undefined) {
        assert.ok(problem instanceof SimilarOperation);
        const twin = expect.similar_operation;
        assert.deepEqual(problem.similarOperation, {
          key: twin.key,
          state: twin.state,
          operation: twin.operation,
          operationId: twin.operation_id,
        });
      }
    });
  }
});

describe("journal files", () => {
  for (const vector of JOURNALS) {
    test(`${vector.file}: ${vector.description}`, () => {
      const raw = readFileSync(new URL(`journals/${vector.file}`, VECTORS));
      if (!vector.valid) {
        assert.equal(errorName(() => parseJournal(raw, vector.file)).name, vector.error);
        return;
      }
      const document = parseJournal(raw, vector.file);
      assert.equal(document.run_id, vector.run_id);
      assert.equal(document.flow_version, vector.flow_version);
      assert.equal(document.finished, vector.finished);
      assert.equal(document.turns.length, vector.turns);
      const current = document.turns.at(-1);
      assert.deepEqual(current ? pendingCalls(current).map((planned) => planned.key) : [], vector.pending);
      assert.deepEqual(document.lease && { holder: document.lease.holder, token: document.lease.token }, vector.lease);
      const results = {};
      for (const turn of document.turns) {
        for (const [callId, result] of Object.entries(turn.results)) {
          const bytes = result.body_encoding === "base64" ? Buffer.from(result.body, "base64") : Buffer.from(result.body, "utf-8");
          results[callId] = { status: result.status, source: result.source, body_base64: bytes.toString("base64") };
        }
      }
      assert.deepEqual(results, vector.results);
      // What this client writes back reads as the same journal (in either client).
      const rewritten = serializeJournal(document);
      assert.deepEqual(parseJournal(rewritten, "rewritten"), document);
      if (!vector.file.includes("defaults")) {
        assert.deepEqual(JSON.parse(rewritten), JSON.parse(raw.toString("utf-8")));
      }
    });
  }
});

describe("lease rules", () => {
  const worker = LEASES.worker;
  for (const vector of LEASES.grant) {
    test(`grant: ${vector.description}`, () => {
      const run = () =>
        grant(vector.existing, vector.run_id, vector.flow_version, worker, { now: LEASES.now, duration: LEASES.duration });
      if (vector.expect.error) {
        const error = errorName(run);
        assert.equal(error.name, vector.expect.error);
        if (vector.expect.holder) {
          assert.deepEqual([error.holder, error.token], [vector.expect.holder, vector.expect.token]);
        }
        return;
      }
      const granted = run();
      assert.deepEqual([granted.lease.holder, granted.lease.token], [worker.name, vector.expect.token]);
      assert.equal(granted.lease.expires_at, vector.expect.expires_at);
    });
  }
  for (const vector of LEASES.fence) {
    test(`fence: ${vector.description}`, () => {
      if (vector.expect.ok) {
        fence(vector.stored, vector.mine);
        return;
      }
      const error = errorName(() => fence(vector.stored, vector.mine));
      assert.equal(error.name, vector.expect.error);
      assert.deepEqual([error.holder, error.token], [vector.expect.holder, vector.expect.token]);
    });
  }
});

/**
 * A stand-in gateway on loopback: every lookup is 404 `unknown-key` (never sent), every other
 * request is recorded as the vectors write it down and answered 200.
 */
async function startRecorder() {
  const received = [];
  const server = createServer((request, response) => {
    const chunks = [];
    request.on("data", (chunk) => chunks.push(chunk));
    request.on("end", () => {
      if (request.url.startsWith("/operations/")) {
        response.writeHead(404, { "Content-Type": "application/problem+json" });
        response.end(JSON.stringify({ type: "https://idempotency-gateway.dev/problems/unknown-key" }));
        return;
      }
      const body = Buffer.concat(chunks);
      received.push({
        method: request.method,
        target: request.url,
        body: body.length > 0 ? body.toString("utf-8") : null,
        content_type: request.headers["content-type"] ?? null,
      });
      response.writeHead(200, { "Content-Type": "application/json" });
      response.end('{"ok":true}');
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  return {
    url: `http://127.0.0.1:${server.address().port}`,
    received,
    stop: () => new Promise((resolve) => server.close(resolve)),
  };
}

/** A journal whose one planned call, not yet sent, has `request` as the vector writes it. */
function plannedJournal(request) {
  const planned = { call: { call_id: "c1", name: "tool", arguments: {} }, key: "run-v:0:c1", request };
  const turn = { index: 0, calls: [planned], results: {}, planned_at: 1764583201.25 };
  return JSON.stringify({ format: 1, run_id: "run-v", flow_version: "v1", turns: [turn] });
}

describe("what a planned call sends", () => {
  let recorder;
  const directory = temporaryDirectory("igw-request-vectors-");
  before(async () => {
    recorder = await startRecorder();
  });
  after(() => recorder?.stop());

  REQUESTS.cases.forEach((vector, index) => {
    test(vector.description, async () => {
      if (vector.tool) {
        const tool = new HttpTool(vector.tool.method, vector.tool.path, vector.tool.headers);
        const call = { call_id: "c1", name: "tool", arguments: vector.arguments };
        if (vector.refused === "plan") {
          assert.throws(() => tool.request(call), { name: "TypeError", message: /no body/ });
          return;
        }
        assert.deepEqual(tool.request(call), vector.request);
      }
      const path = join(directory, `run-${index}.json`);
      writeFileSync(path, plannedJournal(vector.request));
      const before = recorder.received.length;
      const run = await Run.open(new FileJournal(path), {
        client: new GatewayClient(recorder.url),
        runId: "run-v",
        flowVersion: "v1",
        tools: { tool: new HttpTool("POST", "/unused") },
      });
      try {
        if (vector.refused === "send") {
          await assert.rejects(run.step(() => []), { name: "TypeError", message: /no body/ });
        } else {
          await run.step(() => []);
          assert.equal(run.finished, true);
        }
      } finally {
        await run.close();
      }
      assert.deepEqual(recorder.received.slice(before), vector.refused ? [] : [vector.sent]);
    });
  });
});
