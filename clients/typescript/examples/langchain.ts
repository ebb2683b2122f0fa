// LangChain.js (@langchain/core): the tool function's config carries the model's call
// as `config.toolCall` (set when a ToolNode or agent invokes the tool with a ToolCall).
// Annotate `config` as ToolRunnableConfig, or `config.toolCall` is typed `any`.
import { tool, type ToolRunnableConfig } from "@langchain/core/tools";
import { GatewayClient, langChainKey, type RunPosition } from "idempotency-gateway-client";
import { z } from "zod";

const gateway = new GatewayClient("http://127.0.0.1:8080");

export function createTicketTool(at: RunPosition) {
  return tool(
    async ({ title }: { title: string }, config: ToolRunnableConfig) => {
      const response = await gateway.post("/tickets/v1/issues", { key: langChainKey(at, config), json: { title } });
      return response.text;
    },
    {
      name: "create_ticket",
      description: "Create a support ticket",
      schema: z.object({ title: z.string() }),
    },
  );
}
