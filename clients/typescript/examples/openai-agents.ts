// OpenAI Agents JS (@openai/agents): `execute(input, runContext, details)` gets the
// model's call id as `details.toolCall.callId` when the Runner calls the tool.
// `openAIAgentsKey` refuses (rather than invents a key) when it is missing.
import { tool } from "@openai/agents";
import { GatewayClient, openAIAgentsKey, type RunPosition } from "idempotency-gateway-client";
import { z } from "zod";

const gateway = new GatewayClient("http://127.0.0.1:8080");

export function createTicketTool(at: RunPosition) {
  return tool({
    name: "create_ticket",
    description: "Create a support ticket",
    parameters: z.object({ title: z.string() }),
    execute: async ({ title }, _runContext, details) => {
      const response = await gateway.post("/tickets/v1/issues", {
        key: openAIAgentsKey(at, details),
        json: { title },
      });
      return response.text;
    },
  });
}
