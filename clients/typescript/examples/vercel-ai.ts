// Vercel AI SDK (ai v6): the tool-call id arrives as `options.toolCallId`
// (ToolExecutionOptions, re-exported from @ai-sdk/provider-utils).
import { tool, type ToolExecutionOptions } from "ai";
import { z } from "zod";

declare function keyFor(runId: string, turn: number, callId: string): string;
declare function postThroughGateway(path: string, key: string, body: unknown): Promise<unknown>;

const RUN_ID = "run-1";
const TURN = 0;

export const createTicket = tool({
  description: "Create a support ticket",
  inputSchema: z.object({ title: z.string() }),
  execute: async ({ title }, options: ToolExecutionOptions) => {
    // toolCallId: string (required); abortSignal?: AbortSignal; messages: ModelMessage[]
    const key = keyFor(RUN_ID, TURN, options.toolCallId);
    return postThroughGateway("/tickets", key, { title });
  },
});
