// Vercel AI SDK (ai v6): a tool whose effect goes through the gateway with a stable key.
// The SDK hands `execute` the model's id for the call as `options.toolCallId`
// (`ToolExecutionOptions`); `vercelKey` turns it into `runId:turn:callId`.
import { tool } from "ai";
import { GatewayClient, OutcomeUnknown, type RunPosition, vercelKey } from "idempotency-gateway-client";
import { z } from "zod";

const gateway = new GatewayClient("http://127.0.0.1:8080", {
  headers: { Authorization: `Bearer ${process.env["AGENT_TOKEN"] ?? ""}` },
});

/** The tool for one model decision: `at` is the run (its id stored by your agent) and the turn. */
export function createTicketTool(at: RunPosition) {
  return tool({
    description: "Create a support ticket",
    inputSchema: z.object({ title: z.string() }),
    execute: async ({ title }, options) => {
      try {
        const response = await gateway.post("/tickets/v1/issues", { key: vercelKey(at, options), json: { title } });
        return { status: response.status, replayed: response.replayed, ticket: response.json() };
      } catch (error) {
        if (error instanceof OutcomeUnknown) {
          // Never retry with a new key: tell the model to stop, and reconcile.
          return { status: "unknown", detail: "the outcome is unknown; do not call this tool again" };
        }
        throw error;
      }
    },
  });
}
