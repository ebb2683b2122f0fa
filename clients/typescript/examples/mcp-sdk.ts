// MCP TypeScript SDK (@modelcontextprotocol/sdk 1.32): call a tool over
// Streamable HTTP, passing the idempotency key in params._meta.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { ErrorCode, McpError, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";

declare function keyFor(runId: string, turn: number, callId: string): string;
declare function postThroughGateway(path: string, key: string, body: unknown): Promise<unknown>;

export async function createTicketViaMcp(): Promise<CallToolResult> {
  const transport = new StreamableHTTPClientTransport(new URL("http://127.0.0.1:8080/mcp"), {
    // requestInit?: RequestInit — merged into every fetch the transport makes.
    requestInit: { headers: { "x-run-id": "run-1" } },
  });
  const client = new Client({ name: "idempotency-example", version: "0.1.0" });
  await client.connect(transport);

  try {
    // params._meta is a loose object ({ [x: string]: unknown; progressToken?; ... }),
    // so `idempotencyKey` type-checks without a cast.
    const result = await client.callTool({
      name: "create_ticket",
      arguments: { title: "x" },
      _meta: { idempotencyKey: "run-1:0:c1" },
    });

    // Same call with per-request RequestOptions (3rd arg; 2nd is the result schema,
    // undefined = CallToolResultSchema). Default timeout is 60_000 ms.
    await client.callTool(
      { name: "create_ticket", arguments: { title: "x" }, _meta: { idempotencyKey: "run-1:0:c1" } },
      undefined,
      { timeout: 30_000, signal: AbortSignal.timeout(60_000) },
    );

    // The declared return type is CallToolResult | { toolResult: unknown } (the
    // legacy compatibility shape), both with an index signature. `"content" in result`
    // does NOT narrow (content stays `unknown`); `!("toolResult" in result)` does.
    if ("toolResult" in result) {
      throw new Error("legacy toolResult response not supported");
    }
    for (const block of result.content) {
      if (block.type === "text") console.log(block.text);
    }
    if (result.isError === true) {
      // Tool-level failure: reported in the result, not thrown.
      console.error("tool error", result.structuredContent, result._meta);
    }
    return result;
  } catch (err) {
    if (err instanceof McpError && err.code === ErrorCode.RequestTimeout) {
      // err.code: number; err.message: string ("MCP error -32001: ..."); err.data?: unknown
      console.error("timed out", err.data);
    }
    throw err;
  } finally {
    await client.close();
  }
}

// For symmetry with the framework examples: derive the key from a call id.
export async function createTicket(input: { title: string }, callId: string): Promise<unknown> {
  const key = keyFor("run-1", 0, callId);
  return postThroughGateway("/tickets", key, input);
}
