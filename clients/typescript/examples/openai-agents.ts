// OpenAI Agents JS (@openai/agents 0.20): execute(input, runContext?, details?)
// where details?: ToolCallDetails and details.toolCall?: protocol.FunctionCallItem,
// whose `callId: string` is the model's call id. ToolCallDetails is not exported
// from the package root, so it is not named here.
import { tool } from "@openai/agents";
import { z } from "zod";

declare function keyFor(runId: string, turn: number, callId: string): string;
declare function postThroughGateway(path: string, key: string, body: unknown): Promise<unknown>;

const RUN_ID = "run-1";
const TURN = 0;

export const createTicket = tool({
  name: "create_ticket",
  description: "Create a support ticket",
  parameters: z.object({ title: z.string() }),
  execute: async ({ title }, _runContext, details) => {
    // Both `details` and `details.toolCall` are optional in the types; the Runner
    // always supplies them, but a direct `invoke()` may not.
    const callId = details?.toolCall?.callId;
    if (callId === undefined) {
      throw new Error("create_ticket: no tool call id (tool invoked outside a Runner?)");
    }
    const key = keyFor(RUN_ID, TURN, callId);
    const result = await postThroughGateway("/tickets", key, { title });
    return JSON.stringify(result);
  },
});
