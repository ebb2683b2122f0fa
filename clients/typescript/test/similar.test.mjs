// `Run` meeting `similar-operation`, against a scripted gateway (a fetch that answers as the
// gateway would; no real gateway). The gateway refuses a new key whose request is the same as
// another key's operation (the twin): the key of a first attempt was lost. A run never makes
// that a second effect: it stops on a twin whose outcome is `unknown` (naming the twin, the one
// to settle), and otherwise sends the same call under the twin's key and takes its answer.
import assert from "node:assert/strict";
import { join } from "node:path";
import { describe, test } from "node:test";

import {
  Backoff,
  FileJournal,
  GatewayClient,
  HttpTool,
  McpTool,
  mcpResult,
  operationPath,
  ReconciliationRequired,
  Run,
  SimilarOperation,
} from "../dist/index.js";
import { temporaryDirectory } from "./support/servers.mjs";

const BASE = "https://idempotency-gateway.dev/problems/";
const URL_BASE = "http://gw.test";
const ISSUES = "/tickets/v1/issues";
/** The key the run derives for its call: new to the gateway, and refused. */
const MINE = "run-1:0:c1";
/** The key of the first attempt of the same request, which the agent lost. */
const TWIN = "lost:0:c1";
const OPERATION_ID = "op_01JDZ4W6Q8X3M2K7R5T9V0B1C2";
const fast = new Backoff({ initial: 0.001, maximum: 0.01 });
const directory = temporaryDirectory("igw-similar-");

/** The refusal as the gateway writes it: the caller's key, and the twin it names. */
const similarProblem = (state) => ({
  type: `${BASE}similar-operation`,
  title: "The same request is already in flight or unknown under another key",
  status: 409,
  detail: "the same request is another key's operation",
  key: MINE,
  operation: operationPath(MINE),
  safe_to_retry: false,
  next_action: "reconcile",
  similar_operation: { key: TWIN, state, operation: operationPath(TWIN), operation_id: OPERATION_ID },
});

const problem = (status, body) =>
  new Response(JSON.stringify(body), { status, headers: { "Content-Type": "application/problem+json" } });

/**
 * A fetch that refuses `MINE` as similar to `TWIN` (in `twinState`), answers `TWIN` with the
 * twin's receipt after `inProgress` in-progress answers (or, `twinEndsUnknown`, with
 * outcome-unknown), and knows no operation by lookup.
 */
function scriptedGateway(twinState, { inProgress = 0, twinEndsUnknown = false } = {}) {
  const sent = [];
  let busy = inProgress;
  const fetch = async (url, init) => {
    const headers = new Headers(init.headers);
    const path = new URL(url).pathname;
    sent.push({ method: init.method, path, key: headers.get("idempotency-key"), headers, body: init.body });
    if (init.method === "GET") {
      return problem(404, { type: `${BASE}unknown-key`, status: 404, safe_to_retry: false, next_action: "retry" });
    }
    if (headers.get("idempotency-key") !== TWIN) {
      return problem(409, similarProblem(twinState));
    }
    if (busy > 0) {
      busy -= 1;
      return problem(409, { type: `${BASE}in-progress`, status: 409, key: TWIN, state: "in_flight", safe_to_retry: true });
    }
    if (twinEndsUnknown) {
      return problem(409, { type: `${BASE}outcome-unknown`, status: 409, key: TWIN, state: "unknown", safe_to_retry: false });
    }
    return new Response('{"id":"T-1","title":"printer"}', {
      status: 201,
      headers: { "Content-Type": "application/json", "Idempotent-Replayed": "true", "Idempotency-Status": "completed" },
    });
  };
  const postedKeys = () => sent.filter((request) => request.method === "POST").map((request) => request.key);
  return { fetch, sent, postedKeys };
}

const planOnce = (turns) => (turns.length > 0 ? [] : [{ call_id: "c1", name: "ticket", arguments: { title: "printer" } }]);

let runs = 0;
/** A fresh journal file for one test (or the given one, to resume it). */
const journalFile = () => join(directory, `run-${(runs += 1)}.json`);

function options(gateway, extra = {}) {
  return {
    client: new GatewayClient(URL_BASE, { fetch: gateway.fetch, backoff: fast }),
    runId: "run-1",
    flowVersion: "v1",
    tools: { ticket: new HttpTool("POST", ISSUES) },
    ...extra,
  };
}

function assertNamesTheTwinToSettle(error) {
  assert.ok(error instanceof ReconciliationRequired, String(error));
  assert.ok(error.message.includes(`settle ${TWIN} (look it up at ${URL_BASE}${operationPath(TWIN)})`), error.message);
  assert.ok(error.message.includes("then resume; this call will not be sent"), error.message);
  assert.doesNotMatch(error.message, /distinct|force/i);
  assert.deepEqual([error.key, error.callId], [MINE, "c1"]);
  assert.deepEqual(error.similarOperation, { key: TWIN, state: "unknown", operation: operationPath(TWIN), operationId: OPERATION_ID });
  assert.ok(error.problem instanceof SimilarOperation);
  assert.equal(error.problem.nextAction, "reconcile");
  return true;
}

describe("a run's call refused as similar-operation", () => {
  test("a twin whose outcome is unknown stops the run naming the twin; nothing is sent", async () => {
    const gateway = scriptedGateway("unknown");
    await Run.with(new FileJournal(journalFile()), options(gateway), async (run) => {
      await assert.rejects(run.step(planOnce), assertNamesTheTwinToSettle);
      assert.deepEqual(
        run.pending.map((planned) => planned.key),
        [MINE],
      );
    });
    assert.deepEqual(gateway.postedKeys(), [MINE]);
    assert.ok(gateway.sent.every((request) => !request.headers.has("idempotency-distinct")));
  });

  for (const state of ["in_flight", "completed", "released"]) {
    test(`a twin ${state}: the call is sent under its key, and its answer is the result`, async () => {
      const inProgress = state === "in_flight" ? 1 : 0;
      const gateway = scriptedGateway(state, { inProgress });
      const events = [];
      const turn = await Run.with(
        new FileJournal(journalFile()),
        options(gateway, { settleTimeout: 5, onEvent: (event) => events.push(event) }),
        (run) => run.step(planOnce),
      );
      assert.equal(turn.calls[0].key, MINE);
      const result = turn.results["c1"];
      assert.deepEqual([result.status, result.replayed, JSON.parse(result.body).id], [201, true, "T-1"]);
      assert.deepEqual(
        events.map((event) => event.kind),
        ["planned", "sending", "took_over", "response", "recorded"],
      );
      const tookOver = events.find((event) => event.kind === "took_over");
      assert.deepEqual([tookOver.key, tookOver.state, tookOver.twin.key], [MINE, state, TWIN]);
      assert.deepEqual(gateway.postedKeys(), [MINE, ...Array(1 + inProgress).fill(TWIN)]);
      const [mine, ...asTwin] = gateway.sent;
      for (const request of asTwin) {
        assert.equal(request.body, mine.body);
        assert.equal(request.headers.get("prefer"), "wait=5");
      }
      assert.ok(gateway.sent.every((request) => !request.headers.has("idempotency-distinct")));
    });
  }

  test("a twin that ends unknown while taken over stops the run naming it", async () => {
    const gateway = scriptedGateway("in_flight", { twinEndsUnknown: true });
    await Run.with(new FileJournal(journalFile()), options(gateway), async (run) => {
      await assert.rejects(run.step(planOnce), (error) => {
        assert.ok(error instanceof ReconciliationRequired, String(error));
        assert.ok(error.message.includes(`settle ${TWIN} (look it up at ${URL_BASE}${operationPath(TWIN)})`), error.message);
        assert.ok(error.message.includes("(outcome-unknown under its key)"), error.message);
        assert.equal(error.similarOperation.key, TWIN);
        return true;
      });
    });
    assert.deepEqual(gateway.postedKeys(), [MINE, TWIN]);
  });

  test("a resume meets the refusal again and takes over again; the journal keeps the call's key", async () => {
    const gateway = scriptedGateway("in_flight");
    const file = journalFile();
    const crash = (event) => {
      if (event.kind === "took_over") throw new Error("killed at the takeover");
    };
    await Run.with(new FileJournal(file), options(gateway, { onEvent: crash }), async (run) => {
      await assert.rejects(run.step(planOnce), /killed at the takeover/);
    });
    gateway.sent.length = 0;
    const recorded = await Run.with(new FileJournal(file), options(gateway), async (run) => {
      const results = await run.resume();
      assert.equal(run.turns[0].calls[0].key, MINE);
      return results;
    });
    assert.deepEqual(
      recorded.map((result) => JSON.parse(result.body).id),
      ["T-1"],
    );
    assert.deepEqual(
      gateway.sent.slice(0, 3).map((request) => [request.method, request.key ?? decodeURIComponent(request.path.split("/").at(-1))]),
      [
        ["GET", MINE],
        ["POST", MINE],
        ["POST", TWIN],
      ],
    );
  });
});

/** An MCP client through the gateway: the run's key is refused as similar to `TWIN` (in `state`). */
function mcpGateway(state) {
  const keys = [];
  return {
    keys,
    async callTool(params) {
      const key = params._meta?.idempotencyKey;
      keys.push(key);
      if (key === TWIN) {
        return { content: [{ type: "text", text: "T-1" }], structuredContent: { id: "T-1" }, _meta: { idempotencyReplayed: true } };
      }
      const { status: _status, ...refusal } = { ...similarProblem(state), type: "similar-operation" };
      return { content: [{ type: "text", text: "similar" }], isError: true, _meta: { idempotency: refusal } };
    },
  };
}

describe("an MCP call refused as similar-operation", () => {
  const mcpOptions = (client) =>
    options(scriptedGateway("unknown"), { tools: { ticket: new McpTool(client, { name: "create_ticket", backoff: fast }) } });

  test("a twin whose outcome is unknown stops the run naming the twin", async () => {
    const client = mcpGateway("unknown");
    await Run.with(new FileJournal(journalFile()), mcpOptions(client), async (run) => {
      await assert.rejects(run.step(planOnce), (error) => assertNamesTheTwinToSettle(error) && error.problem.status === 409);
    });
    assert.deepEqual(client.keys, [MINE]);
  });

  test("a twin in flight is taken over: the call is sent under its key", async () => {
    const client = mcpGateway("in_flight");
    const turn = await Run.with(new FileJournal(journalFile()), mcpOptions(client), (run) => run.step(planOnce));
    assert.equal(turn.calls[0].key, MINE);
    assert.deepEqual(mcpResult(turn.results["c1"]).structuredContent, { id: "T-1" });
    assert.deepEqual(client.keys, [MINE, TWIN]);
  });
});
