/**
 * MCP tool calls through the gateway, with the official TypeScript SDK's `Client.callTool`.
 *
 * An MCP client sets a call's key in `params._meta.idempotencyKey` (the SDKs set
 * `_meta` per call, not HTTP headers). `callToolWithKey` does that for one call;
 * `McpTool` lets `Run` plan, key, record and resume MCP calls exactly as HTTP
 * ones: the plan stores the call as the gateway records it (method `tools/call`,
 * path the tool's name, the arguments as the body), and after a crash a call
 * without a result is looked up before anything is resent.
 *
 * The gateway answers what it refuses as a tool result with `isError: true` and
 * the problem in `_meta.idempotency` (an SDK would hide an HTTP error body); this
 * module turns it back into the package's typed errors, so `unknown` stops a run
 * with `ReconciliationRequired` as over HTTP. The SDK itself is not a dependency:
 * anything with its `callTool` shape works.
 */

import { Backoff, sleep } from "./backoff.js";
import { canonicalJson } from "./canonical.js";
import { CallUnconfirmed, GatewayProblem, kindOf, type ProblemDocument, typedProblem } from "./errors.js";
import { validateKey } from "./keys.js";
import type { Operation } from "./models.js";
import { PROBLEM_BASE_URI } from "./problems.js";
import { now, type PlannedCall, type ToolCall, type ToolRequest, type ToolResult } from "./records.js";
import type { SendingTool } from "./tools.js";

/** The method of every MCP operation at the gateway (its path is the tool's name). */
export const MCP_METHOD = "tools/call";

/** The `params._meta` member that carries a call's idempotency key. */
export const KEY_META = "idempotencyKey";

const REPLAYED_META = "idempotencyReplayed";
const STATE_META = "idempotency";
/** `_meta` members only the gateway writes (it strips an upstream's copies). */
const OWNED_META: ReadonlySet<string> = new Set([REPLAYED_META, STATE_META]);

/**
 * The HTTP status an HTTP route gives each problem. An MCP refusal is a tool result
 * and carries no status; this keeps `GatewayProblem.status` equal to what the same
 * refusal would carry over HTTP.
 */
const STATUS_OF: Readonly<Record<string, number>> = {
  "missing-key": 400,
  "invalid-key": 400,
  "invalid-request": 400,
  "request-timeout": 408,
  "payload-too-large": 413,
  unauthorized: 401,
  "client-not-allowed": 403,
  "no-route": 404,
  "unknown-key": 404,
  "key-mismatch": 422,
  "key-mismatch-unsettled": 422,
  "in-progress": 409,
  "receipt-expired": 409,
  "receipt-not-retained": 409,
  "outcome-unknown": 409,
  "similar-operation": 409,
  "upstream-timeout": 504,
  "upstream-connection-lost": 502,
  "quota-exceeded": 429,
  "store-unavailable": 503,
  "route-saturated": 503,
  "lease-lost": 503,
  "upstream-unreachable": 502,
};

/** The parameters of one MCP tool call, as the SDK's `callTool` takes them. */
export interface McpCallParams {
  name: string;
  arguments?: Record<string, unknown>;
  _meta?: Record<string, unknown>;
}

/** The SDK's per-request options that matter here. */
export interface McpCallOptions {
  timeout?: number;
  signal?: AbortSignal;
}

/**
 * What this module needs of an MCP client: the official SDK's `Client` fits
 * (`import { Client } from "@modelcontextprotocol/sdk/client/index.js"`), opened on
 * the gateway's MCP route with the scope's credential in `requestInit.headers`.
 */
export interface McpCaller {
  callTool(params: McpCallParams, resultSchema?: undefined, options?: McpCallOptions): Promise<unknown>;
}

/**
 * Call `params.name` with `params._meta.idempotencyKey` set to `key`.
 *
 * Returns the tool's result as the SDK gave it (also an `isError` result: the
 * tool's own failure, and final; `_meta.idempotencyReplayed` says it came from the
 * gateway's receipt). A gateway refusal is thrown as its typed `GatewayProblem`;
 * refusals that are safe to retry (`in-progress`, `store-unavailable`, ...) are
 * resent with the same key under `backoff` first. The SDK's own errors (a server's
 * JSON-RPC error, a timeout, a lost stream) are thrown as they are: only a lookup
 * of the key tells which happened.
 */
export async function callToolWithKey(
  client: McpCaller,
  params: McpCallParams,
  key: string,
  options: McpCallOptions & { backoff?: Backoff } = {},
): Promise<Record<string, unknown>> {
  validateKey(key);
  const backoff = options.backoff ?? new Backoff();
  const sent: McpCallParams = { ...params, _meta: { ...params._meta, [KEY_META]: key } };
  const requestOptions: McpCallOptions = {};
  if (options.timeout !== undefined) requestOptions.timeout = options.timeout;
  if (options.signal !== undefined) requestOptions.signal = options.signal;
  let attempts = 0;
  let waited = 0;
  for (;;) {
    attempts += 1;
    let problem: GatewayProblem | null;
    let cause: unknown = undefined;
    try {
      const answer = asObject(await client.callTool(sent, undefined, requestOptions));
      problem = refusalOf(answer);
      if (problem === null) {
        return answer;
      }
    } catch (error) {
      problem = problemOfError(error);
      if (problem === null) {
        throw error;
      }
      cause = error;
    }
    const delay = problem.safeToRetry === true ? backoff.nextDelay(attempts, waited, problem.retryAfter) : null;
    if (delay === null) {
      if (cause !== undefined) {
        Object.defineProperty(problem, "cause", { value: cause, enumerable: false });
      }
      throw problem;
    }
    await sleep(delay, options.signal);
    waited += delay;
  }
}

/** A tool of an MCP server behind the gateway, called through `client` by `Run`. */
export class McpTool implements SendingTool {
  readonly client: McpCaller;
  /** The tool's name on the server when the model knows it by another (default: the model's). */
  readonly name: string | null;
  /** Milliseconds the SDK waits for the call's answer (default: the SDK's). */
  readonly timeout: number | null;
  readonly backoff: Backoff;

  constructor(client: McpCaller, options: { name?: string; timeout?: number; backoff?: Backoff } = {}) {
    if (options.name !== undefined && !options.name) {
      throw new TypeError("McpTool name may not be empty (leave it out: the model's name for it)");
    }
    if (options.timeout !== undefined && !(options.timeout > 0)) {
      throw new RangeError(`McpTool timeout must be > 0 ms, got ${options.timeout}`);
    }
    this.client = client;
    this.name = options.name ?? null;
    this.timeout = options.timeout ?? null;
    this.backoff = options.backoff ?? new Backoff();
  }

  /** The call as the gateway records it: `tools/call`, the tool's name, the arguments. */
  request(call: ToolCall): ToolRequest {
    return { method: MCP_METHOD, path: this.name ?? call.name, json: { ...call.arguments }, headers: {} };
  }

  /** Call the planned tool with the planned arguments (the stored request, not a rebuilt one). */
  async send(planned: PlannedCall): Promise<ToolResult> {
    const request = planned.request;
    if (request.method !== MCP_METHOD) {
      throw new TypeError(
        `${planned.key}: the plan sends ${request.method} ${request.path}, not an MCP ${MCP_METHOD}; ` +
          `was '${planned.call.name}' an HTTP tool when it was planned?`,
      );
    }
    const args = isObject(request.json) ? { ...request.json } : {};
    let answer: Record<string, unknown>;
    try {
      answer = await callToolWithKey(this.client, { name: request.path, arguments: args }, planned.key, {
        backoff: this.backoff,
        ...(this.timeout !== null ? { timeout: this.timeout } : {}),
      });
    } catch (error) {
      if (error instanceof GatewayProblem) {
        throw error;
      }
      throw new CallUnconfirmed(
        `${planned.key}: ${request.path} answered an MCP error (${describe(error)}); a server's error ` +
          "answer, a timeout or a lost stream look alike here, so the gateway is asked what happened",
        { key: planned.key, callId: planned.call.call_id, cause: error },
      );
    }
    const replayed = metaOf(answer)[REPLAYED_META] === true;
    return mcpResultRecord({ result: withoutOwnedMeta(answer) }, { replayed, source: "response" });
  }
}

/** The result a lookup's MCP receipt stands for (source `receipt`); null when it is gone. */
export function mcpReceipt(operation: Operation): ToolResult | null {
  if (operation.error !== undefined && operation.error !== null) {
    return mcpResultRecord({ error: operation.error }, { replayed: true, source: "receipt" });
  }
  if (operation.result === undefined || operation.result === null) {
    return null;
  }
  const result = isObject(operation.result) ? withoutOwnedMeta(operation.result) : operation.result;
  return mcpResultRecord({ result }, { replayed: true, source: "receipt" });
}

/** A JSON-RPC error a server answered an MCP call with, as recorded in the journal. */
export class McpErrorAnswer extends Error {
  readonly code: number;
  readonly data: unknown;

  constructor(code: number, message: string, data: unknown) {
    super(message);
    this.name = "McpErrorAnswer";
    this.code = code;
    this.data = data;
  }
}

/**
 * An MCP tool's recorded result as the SDK's `CallToolResult` wire form, as `callTool` returned it.
 *
 * A recorded JSON-RPC error is thrown as `McpErrorAnswer`; a result of another kind
 * of tool is a TypeError.
 */
export function mcpResult(result: ToolResult): Record<string, unknown> {
  const document: unknown = JSON.parse(
    result.body_encoding === "base64" ? Buffer.from(result.body, "base64").toString("utf-8") : result.body,
  );
  if (!isObject(document) || !("result" in document || "error" in document)) {
    throw new TypeError("not an MCP tool's result: its body has no 'result' or 'error'");
  }
  const error = document["error"];
  if (error !== undefined && error !== null) {
    const details = isObject(error) ? error : {};
    const code = details["code"];
    throw new McpErrorAnswer(
      typeof code === "number" && Number.isInteger(code) ? code : -32603,
      String(details["message"] ?? JSON.stringify(error)),
      details["data"],
    );
  }
  return asObject(document["result"]);
}

/** A `ToolResult` for an MCP tool's answer found by hand, for `Run.recordResult`. */
export function mcpToolResult(answer: Record<string, unknown>): ToolResult {
  return mcpResultRecord({ result: withoutOwnedMeta(answer) }, { replayed: false, source: "manual" });
}

function mcpResultRecord(
  document: Record<string, unknown>,
  fields: { replayed: boolean; source: ToolResult["source"] },
): ToolResult {
  return {
    status: 200,
    headers: { "content-type": "application/json" },
    body: canonicalJson(document),
    body_encoding: "utf-8",
    replayed: fields.replayed,
    state: "completed",
    source: fields.source,
    recorded_at: now(),
  };
}

function isObject(value: unknown): value is Record<string, unknown> {
  return typeof value === "object" && value !== null && !Array.isArray(value);
}

function asObject(value: unknown): Record<string, unknown> {
  return isObject(value) ? value : {};
}

function metaOf(document: Record<string, unknown>): Record<string, unknown> {
  return asObject(document["_meta"]);
}

/** The tool result without the gateway's own `_meta` members (kept in ToolResult fields). */
function withoutOwnedMeta(document: Record<string, unknown>): Record<string, unknown> {
  const meta = Object.fromEntries(Object.entries(metaOf(document)).filter(([name]) => !OWNED_META.has(name)));
  const stripped = Object.fromEntries(Object.entries(document).filter(([name]) => name !== "_meta"));
  if (Object.keys(meta).length > 0) {
    stripped["_meta"] = meta;
  }
  return stripped;
}

/** The gateway's refusal, when the tool result is one (`isError`, `_meta.idempotency`). */
function refusalOf(document: Record<string, unknown>): GatewayProblem | null {
  const problem = metaOf(document)[STATE_META];
  if (document["isError"] !== true || !isObject(problem)) {
    return null;
  }
  return typed(problem, null);
}

/**
 * The gateway's problem in a JSON-RPC error's `data`, or null for anyone else's error.
 *
 * The gateway refuses malformed calls with a JSON-RPC error whose `data` is its
 * problem document; a replay of an error receipt is marked `idempotencyReplayed`
 * and is the server's, whatever it holds.
 */
function problemOfError(error: unknown): GatewayProblem | null {
  if (!isObject(error)) {
    return null;
  }
  const data = error["data"];
  if (!isObject(data) || data[REPLAYED_META] === true) {
    return null;
  }
  const typeUri = data["type"];
  if (typeof typeUri !== "string" || !typeUri.startsWith(PROBLEM_BASE_URI)) {
    return null;
  }
  const status = data["status"];
  return typed(data, typeof status === "number" ? status : null);
}

function typed(problem: ProblemDocument, status: number | null): GatewayProblem {
  const kind = kindOf(String(problem["type"] ?? ""));
  return typedProblem(kind, { ...problem }, { status: status ?? STATUS_OF[kind] ?? 200 });
}

function describe(error: unknown): string {
  return error instanceof Error ? error.message : String(error);
}
