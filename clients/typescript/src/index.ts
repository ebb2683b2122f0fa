/**
 * Agent-side client for the idempotency gateway, for Node agents.
 *
 * Stable keys (`deriveKey`), calls that turn gateway problems into typed errors
 * (`GatewayClient`), lookups of what happened to an effect (`GatewayClient.lookup`),
 * and a durable run journal (`Run` over a `FileJournal`) that follows the recovery
 * protocol, for HTTP tools (`HttpTool`) and MCP tools (`McpTool`). The journal is
 * the Python client's format: a run one starts, the other resumes.
 */

export { Backoff, parseRetryAfter } from "./backoff.js";
export { canonicalJson } from "./canonical.js";
export { GatewayClient } from "./client.js";
export type { GatewayClientOptions, RequestOptions, ResolveOptions } from "./client.js";
export * from "./errors.js";
export type { EventKind, RunEvent, RunObserver } from "./events.js";
export { FileJournal } from "./file-journal.js";
export type { FileJournalOptions } from "./file-journal.js";
export {
  langChainCallId,
  langChainKey,
  openAIAgentsCallId,
  openAIAgentsKey,
  vercelCallId,
  vercelKey,
} from "./frameworks.js";
export type { RunPosition } from "./frameworks.js";
export { deriveKey, keyHeader, MAX_KEY_LENGTH, operationPath, unquoteKey, validateKey } from "./keys.js";
export { currentWorker, fence, grant, isLive, released, renewed } from "./lease.js";
export type { JournalStore, Worker } from "./lease.js";
export { LockFile } from "./lock-file.js";
export type { LockGrant, LockRecord } from "./lock-file.js";
export {
  callToolWithKey,
  KEY_META,
  MCP_METHOD,
  McpErrorAnswer,
  mcpReceipt,
  mcpResult,
  McpTool,
  mcpToolResult,
} from "./mcp.js";
export type { McpCaller, McpCallOptions, McpCallParams } from "./mcp.js";
export { bodyBytes, bodyJson, GatewayResponse, hasReceipt, parseOperation } from "./models.js";
export type { BodyEncoding, Evidence, Operation, OperationState, Resolution, StoredResponse } from "./models.js";
export { PROBLEM_BASE_URI, PROBLEM_JSON, problemFrom } from "./problems.js";
export {
  currentTurn,
  JOURNAL_FORMAT,
  newDocument,
  parseJournal,
  pendingCalls,
  resultFromBytes,
  resultOf,
  serializeJournal,
  withTurn,
} from "./records.js";
export type {
  JournalDocument,
  PlannedCall,
  ResultSource,
  RunLease,
  ToolCall,
  ToolRequest,
  ToolResult,
  Turn,
} from "./records.js";
export { Run } from "./run.js";
export type { RunOptions } from "./run.js";
export { HttpTool, isSendingTool } from "./tools.js";
export type { Planner, SendingTool, Tool } from "./tools.js";
