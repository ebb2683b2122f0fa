/**
 * How a model's tool call becomes a request through the gateway, and what plans.
 *
 * The request is computed once, when the plan is saved, and stored with it: a
 * retry after a restart sends the stored request, so a code change between two
 * processes cannot change the bytes (and the fingerprint) of an effect already
 * on its way. `Run` sends an `HttpTool`'s request with `GatewayClient.request`; a
 * `SendingTool` (an `McpTool`) sends the stored request itself, with the same key.
 */

import { BODILESS_METHODS } from "./client.js";
import type { PlannedCall, ToolCall, ToolRequest, ToolResult, Turn } from "./records.js";

/**
 * Asks the model for the next turn's calls, given every finished turn; no calls: the run is done.
 *
 * It is called at most once per turn whose plan reaches the journal: a restart
 * resumes the saved plan and never asks the model to choose again.
 */
export type Planner = (turns: readonly Turn[]) => readonly ToolCall[] | Promise<readonly ToolCall[]>;

/**
 * Turns one call of this tool into the request to send through the gateway.
 *
 * Must be deterministic (the same call gives the same request) and must not
 * perform the effect itself: `Run` sends the request, with the call's key, after
 * the plan is saved.
 */
export interface Tool {
  request(call: ToolCall): ToolRequest;
}

/**
 * A tool that sends its stored request itself rather than through `GatewayClient.request`.
 *
 * `send` must send `planned.request` with `planned.key`, and report what came back
 * as `Run` expects of the HTTP path: the tool's answer as a `ToolResult` (source
 * `response`); a gateway refusal as its typed `GatewayProblem` (on `SimilarOperation`
 * the run stops, or calls `send` again with the twin's key as `planned.key`); an
 * answer it cannot read as `CallUnconfirmed`, and `Run` looks the key up at once.
 */
export interface SendingTool extends Tool {
  send(planned: PlannedCall): Promise<ToolResult>;
}

export function isSendingTool(tool: Tool | undefined): tool is SendingTool {
  return tool !== undefined && typeof (tool as Partial<SendingTool>).send === "function";
}

/**
 * A tool that is one HTTP endpoint behind the gateway: the arguments are the JSON body.
 *
 * A GET or HEAD has no body (`BODILESS_METHODS`): its request is the path as written (query
 * included) with `json` null, and a call with arguments is a `TypeError` when the plan is made,
 * since there is no body to carry them; a tool of your own can put them in the path. Other
 * methods (DELETE too) send the arguments, `{}` when there are none. As the Python `HttpTool`.
 */
export class HttpTool implements Tool {
  readonly method: string;
  readonly path: string;
  readonly headers: Readonly<Record<string, string>>;

  constructor(method: string, path: string, headers: Readonly<Record<string, string>> = {}) {
    if (!path.startsWith("/")) {
      throw new TypeError(`HttpTool path must start with '/', got ${JSON.stringify(path)}`);
    }
    this.method = method.toUpperCase();
    this.path = path;
    this.headers = { ...headers };
  }

  request(call: ToolCall): ToolRequest {
    const bodiless = BODILESS_METHODS.has(this.method);
    const names = Object.keys(call.arguments);
    if (bodiless && names.length > 0) {
      throw new TypeError(
        `${call.name}: a ${this.method} request has no body to carry the arguments ` +
          `${JSON.stringify(names.sort())}; put them in the path with a tool of your own`,
      );
    }
    const json = bodiless ? null : { ...call.arguments };
    return { method: this.method, path: this.path, json, headers: { ...this.headers } };
  }
}
