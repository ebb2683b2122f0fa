// MCP tool calls with the official TypeScript SDK's Client through the gateway's MCP route,
// in front of the example MCP server: the key in _meta, replays, refusals as typed errors,
// and a run whose MCP call took effect before a crash resuming from the gateway's receipt.
import assert from "node:assert/strict";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";

import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";

import {
  Backoff,
  CallUnconfirmed,
  callToolWithKey,
  deriveKey,
  FileJournal,
  GatewayClient,
  InProgress,
  KeyMismatch,
  McpTool,
  mcpResult,
  OutcomeUnknown,
  Run,
  RouteSaturated,
} from "../dist/index.js";
import { mcpRoute, startGateway, startMcpServer, startToolApi, temporaryDirectory } from "./support/servers.mjs";

const directory = temporaryDirectory("igw-mcp-");
let server;
let tools;
let gateway;
let mcp;

before(async () => {
  [server, tools] = await Promise.all([startMcpServer(), startToolApi()]);
  gateway = await startGateway({ upstream: tools.url, extraRoutes: [mcpRoute(server.url)] });
  mcp = new Client({ name: "node-tests", version: "1.0.0" });
  await mcp.connect(new StreamableHTTPClientTransport(new URL(`${gateway.url}/mcp`)));
});

after(async () => {
  await mcp?.close();
  await Promise.all([gateway?.stop(), server?.stop(), tools?.stop()]);
});

const ticketCount = async () => {
  const listed = await mcp.callTool({ name: "list_tickets", arguments: {} });
  return listed.structuredContent.items.length;
};

describe("an MCP call with its key in _meta", () => {
  test("a retry with the same key replays the result; the server applied one effect", async () => {
    const key = deriveKey("mcp-replay", 0, "c1");
    const before = await ticketCount();
    const first = await callToolWithKey(mcp, { name: "create_ticket", arguments: { title: "Printer on fire" } }, key);
    const second = await callToolWithKey(mcp, { name: "create_ticket", arguments: { title: "Printer on fire" } }, key);
    assert.equal(first.isError ?? false, false);
    assert.deepEqual(second.structuredContent, first.structuredContent);
    assert.equal(second._meta?.idempotencyReplayed, true);
    assert.equal(await ticketCount(), before + 1);
  });

  test("the same key with other arguments is KeyMismatch, and nothing is called", async () => {
    const key = deriveKey("mcp-mismatch", 0, "c1");
    await callToolWithKey(mcp, { name: "create_ticket", arguments: { title: "one" } }, key);
    const before = await ticketCount();
    await assert.rejects(callToolWithKey(mcp, { name: "create_ticket", arguments: { title: "two" } }, key), (error) => {
      assert.ok(error instanceof KeyMismatch);
      assert.deepEqual([error.status, error.kind, error.key, error.safeToRetry], [422, "key-mismatch", key, false]);
      return true;
    });
    assert.equal(await ticketCount(), before);
  });

  test("the gateway records the call as tools/call <tool>, and a lookup shows its result", async () => {
    const key = deriveKey("mcp-lookup", 0, "c1");
    const sent = await callToolWithKey(mcp, { name: "create_ticket", arguments: { title: "look" } }, key);
    const operation = await new GatewayClient(gateway.url).lookup(key);
    assert.deepEqual([operation.method, operation.path, operation.state], ["tools/call", "create_ticket", "completed"]);
    assert.deepEqual(operation.result.structuredContent, sent.structuredContent);
  });
});

describe("a run whose tools are MCP tools", () => {
  const plan = (turns) => (turns.length === 0 ? [{ call_id: "c1", name: "create_ticket", arguments: { title: "resume me" } }] : []);

  /** An McpTool whose process "dies" right after the call took effect, before its result is saved. */
  class CrashAfterSend extends McpTool {
    async send(planned) {
      await super.send(planned);
      throw new Error("crash after the effect");
    }
  }

  test("an MCP call that took effect before a crash is taken from the receipt, not resent", async () => {
    const runId = "mcp-run";
    const journal = new FileJournal(join(directory, `${runId}.json`));
    const options = (tool, onEvent) => ({
      client: new GatewayClient(gateway.url),
      runId,
      flowVersion: "v1",
      tools: { create_ticket: tool },
      ...(onEvent ? { onEvent } : {}),
    });
    await assert.rejects(
      Run.with(journal, options(new CrashAfterSend(mcp)), (run) => run.step(plan)),
      /crash after the effect/,
    );
    const before = await ticketCount();

    const events = [];
    const turn = await Run.with(journal, options(new McpTool(mcp), (event) => events.push(`${event.kind}:${event.state ?? ""}`)), async (run) => {
      assert.equal(run.pending.length, 1, "the plan was saved, its result was not");
      await run.resume();
      return run.turns[0];
    });
    assert.equal(await ticketCount(), before, "not sent again");
    assert.deepEqual(events, ["lookup:completed", "recorded:"]);
    const result = turn.results.c1;
    assert.deepEqual([result.source, result.replayed, result.status], ["receipt", true, 200]);
    assert.equal(mcpResult(result).structuredContent.title, "resume me");
  });
});

describe("MCP answers the client must read (unit, with a scripted client)", () => {
  const BASE = "https://idempotency-gateway.dev/problems/";
  const refusal = (kind, extra = {}) => ({
    content: [{ type: "text", text: "refused" }],
    isError: true,
    _meta: { idempotency: { type: BASE + kind, title: kind, detail: "d", ...extra } },
  });
  const scripted = (...answers) => {
    const calls = [];
    return {
      calls,
      async callTool(params) {
        calls.push(params);
        const answer = answers.shift();
        if (answer instanceof Error) throw answer;
        return answer;
      },
    };
  };
  const planned = { call: { call_id: "c1", name: "t", arguments: {} }, key: "r:0:c1", request: { method: "tools/call", path: "t", json: { a: 1 }, headers: {} } };

  test("the key goes in _meta.idempotencyKey, beside the caller's own _meta", async () => {
    const client = scripted({ content: [] });
    await callToolWithKey(client, { name: "t", arguments: { a: 1 }, _meta: { progressToken: 7 } }, "r:0:c1");
    assert.deepEqual(client.calls[0], { name: "t", arguments: { a: 1 }, _meta: { progressToken: 7, idempotencyKey: "r:0:c1" } });
  });

  test("a refusal in _meta.idempotency is its typed problem, with the status HTTP would give", async () => {
    const client = scripted(refusal("outcome-unknown", { state: "unknown", safe_to_retry: false }));
    await assert.rejects(callToolWithKey(client, { name: "t" }, "r:0:c1"), (error) => {
      assert.ok(error instanceof OutcomeUnknown);
      assert.deepEqual([error.status, error.state], [409, "unknown"]);
      return true;
    });
  });

  test("a refusal that is safe to retry is resent with the same key, then answered", async () => {
    const client = scripted(refusal("route-saturated", { safe_to_retry: true }), { content: [], structuredContent: { ok: 1 } });
    const answer = await callToolWithKey(client, { name: "t" }, "r:0:c1", { backoff: new Backoff({ initial: 0.01 }) });
    assert.deepEqual(answer.structuredContent, { ok: 1 });
    assert.equal(client.calls.length, 2);
    assert.ok(client.calls.every((call) => call._meta.idempotencyKey === "r:0:c1"));
  });

  test("past the backoff, the last refusal is thrown", async () => {
    const client = scripted(refusal("in-progress", { safe_to_retry: true }), refusal("in-progress", { safe_to_retry: true }));
    await assert.rejects(
      callToolWithKey(client, { name: "t" }, "r:0:c1", { backoff: new Backoff({ attempts: 2, initial: 0.01 }) }),
      InProgress,
    );
  });

  test("an isError result without the gateway's _meta is the tool's own answer", async () => {
    const client = scripted({ content: [{ type: "text", text: "no such user" }], isError: true });
    const answer = await callToolWithKey(client, { name: "t" }, "r:0:c1");
    assert.equal(answer.isError, true);
  });

  test("a JSON-RPC error carrying the gateway's problem is typed; a replayed one is the server's", async () => {
    const gatewayError = Object.assign(new Error("MCP error -32602"), { code: -32602, data: { type: BASE + "route-saturated", status: 503, safe_to_retry: false } });
    await assert.rejects(callToolWithKey(scripted(gatewayError), { name: "t" }, "k"), RouteSaturated);
    const replayed = Object.assign(new Error("MCP error -32000"), { code: -32000, data: { type: BASE + "x", idempotencyReplayed: true } });
    await assert.rejects(callToolWithKey(scripted(replayed), { name: "t" }, "k"), (error) => error === replayed);
  });

  test("McpTool turns an unreadable SDK error into CallUnconfirmed, so Run looks the key up", async () => {
    const lost = Object.assign(new Error("MCP error -32001: Request timed out"), { code: -32001 });
    const tool = new McpTool(scripted(lost));
    await assert.rejects(tool.send(planned), (error) => {
      assert.ok(error instanceof CallUnconfirmed);
      assert.deepEqual([error.key, error.callId, error.cause], ["r:0:c1", "c1", lost]);
      return true;
    });
  });

  test("McpTool records the answer without the gateway's own _meta members", async () => {
    const tool = new McpTool(scripted({ content: [], structuredContent: { id: "T-1" }, _meta: { idempotencyReplayed: true, trace: "t" } }));
    const result = await tool.send(planned);
    assert.equal(result.replayed, true);
    assert.deepEqual(JSON.parse(result.body), { result: { content: [], structuredContent: { id: "T-1" }, _meta: { trace: "t" } } });
    assert.deepEqual(mcpResult(result), { content: [], structuredContent: { id: "T-1" }, _meta: { trace: "t" } });
  });
});
