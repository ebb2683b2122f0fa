// LangChain.js (@langchain/core v1): tool(func, { name, description, schema }).
// func's second argument is a ToolRunnableConfig = RunnableConfig & { toolCall?: ToolCall; ... }
// and ToolCall.id is `id?: string`, so the id path is `config.toolCall?.id` (string | undefined).
import { tool, type ToolRunnableConfig } from "@langchain/core/tools";
import { z } from "zod";

declare function keyFor(runId: string, turn: number, callId: string): string;
declare function postThroughGateway(path: string, key: string, body: unknown): Promise<unknown>;

const RUN_ID = "run-1";
const TURN = 0;

export const createTicket = tool(
  async ({ title }: { title: string }, config: ToolRunnableConfig) => {
    // Only set when the tool is invoked with a ToolCall object
    // (tool.invoke({ id, name, args, type: "tool_call" })), as ToolNode/agents do.
    const callId = config.toolCall?.id;
    if (callId === undefined) {
      throw new Error("create_ticket: no tool call id (invoked with plain args?)");
    }
    const key = keyFor(RUN_ID, TURN, callId);
    const result = await postThroughGateway("/tickets", key, { title });
    return JSON.stringify(result);
  },
  {
    name: "create_ticket",
    description: "Create a support ticket",
    schema: z.object({ title: z.string() }),
  },
);
