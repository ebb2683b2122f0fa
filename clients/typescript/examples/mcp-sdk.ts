// The official MCP TypeScript SDK through the gateway's MCP route: one call with its key in
// `_meta.idempotencyKey` (`callToolWithKey`), and a whole run whose tools are MCP tools
// (`McpTool`), journaled and resumed like HTTP tools.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import {
  callToolWithKey,
  deriveKey,
  FileJournal,
  GatewayClient,
  McpTool,
  mcpResult,
  OutcomeUnknown,
  Run,
  type Turn,
} from "idempotency-gateway-client";

const GATEWAY = "http://127.0.0.1:8080";
const credential = { Authorization: `Bearer ${process.env["AGENT_TOKEN"] ?? ""}` };

export async function connect(): Promise<Client> {
  const client = new Client({ name: "ticket-agent", version: "1.0.0" });
  await client.connect(
    new StreamableHTTPClientTransport(new URL(`${GATEWAY}/mcp`), { requestInit: { headers: credential } }),
  );
  return client;
}

/** One call: the retry after a crash sends the same key, and gets the receipt. */
export async function createTicketOnce(client: Client, runId: string, callId: string): Promise<unknown> {
  try {
    const result = await callToolWithKey(client, { name: "create_ticket", arguments: { title: "x" } }, deriveKey(runId, 0, callId));
    return result["structuredContent"];
  } catch (error) {
    if (error instanceof OutcomeUnknown) {
      return { state: "unknown" }; // stop and reconcile; never resend with a new key
    }
    throw error;
  }
}

/** A run whose tools are MCP tools: planned, keyed, recorded and resumed as over HTTP. */
export async function runWithMcpTools(client: Client, runId: string): Promise<void> {
  const tools = { create_ticket: new McpTool(client), send_email: new McpTool(client) };
  const plan = (turns: readonly Turn[]) => {
    if (turns.length === 0) {
      return [{ call_id: "c1", name: "create_ticket", arguments: { title: "Printer on fire" } }];
    }
    const first = turns[0]?.results["c1"];
    const ticket = first ? mcpResult(first)["structuredContent"] : undefined;
    return turns.length === 1 ? [{ call_id: "c2", name: "send_email", arguments: { about: ticket } }] : [];
  };
  await Run.with(
    new FileJournal(`runs/${runId}.json`),
    { client: new GatewayClient(GATEWAY, { headers: credential }), runId, flowVersion: "mcp-v1", tools },
    async (run) => {
      while (!run.finished) {
        await run.step(plan);
      }
    },
  );
}
