/**
 * Keys from the tool-call ids the common TypeScript agent frameworks hand a tool.
 *
 * Each framework gives a tool's `execute` the model's id for the call, in its own
 * place. These helpers read it there and derive the call's key
 * (`runId:turn:callId`), and refuse, rather than invent a key, when the tool was
 * invoked without one (a direct `invoke` in a test, say): a made-up key would
 * make every retry a new effect.
 *
 * - Vercel AI SDK: `execute(input, options)` -> `options.toolCallId`
 * - OpenAI Agents JS: `execute(input, context, details)` -> `details.toolCall.callId`
 * - LangChain.js: `tool(func, ...)`, `func(input, config)` -> `config.toolCall.id`
 */

import { KeyFormatError } from "./errors.js";
import { deriveKey } from "./keys.js";

/** Where in a run the model's decision is: the run id and the index of the decision. */
export interface RunPosition {
  readonly runId: string;
  readonly turn: number;
}

/** The call id the Vercel AI SDK passes a tool's `execute` (`ToolExecutionOptions`). */
export function vercelCallId(options: { readonly toolCallId?: string | undefined }): string {
  return required(options.toolCallId, "Vercel AI SDK", "options.toolCallId");
}

/** The call id OpenAI Agents JS passes a tool's `execute` as its third argument. */
export function openAIAgentsCallId(
  details: { readonly toolCall?: { readonly callId?: string | undefined } | undefined } | undefined,
): string {
  return required(details?.toolCall?.callId, "OpenAI Agents JS", "details.toolCall.callId");
}

/** The call id LangChain.js passes a tool function in its config (`ToolRunnableConfig`). */
export function langChainCallId(
  config: { readonly toolCall?: { readonly id?: string | undefined } | undefined } | undefined,
): string {
  return required(config?.toolCall?.id, "LangChain.js", "config.toolCall.id");
}

/** The key of a Vercel AI SDK tool call. */
export function vercelKey(at: RunPosition, options: { readonly toolCallId?: string | undefined }): string {
  return deriveKey(at.runId, at.turn, vercelCallId(options));
}

/** The key of an OpenAI Agents JS tool call. */
export function openAIAgentsKey(
  at: RunPosition,
  details: { readonly toolCall?: { readonly callId?: string | undefined } | undefined } | undefined,
): string {
  return deriveKey(at.runId, at.turn, openAIAgentsCallId(details));
}

/** The key of a LangChain.js tool call. */
export function langChainKey(
  at: RunPosition,
  config: { readonly toolCall?: { readonly id?: string | undefined } | undefined } | undefined,
): string {
  return deriveKey(at.runId, at.turn, langChainCallId(config));
}

function required(callId: string | undefined, framework: string, where: string): string {
  if (typeof callId !== "string" || callId.length === 0) {
    throw new KeyFormatError(
      `${framework} gave this tool no call id (${where}): it was invoked outside the agent's tool-call ` +
        "loop. A key needs the model's id for the call; a made-up one would make every retry a new effect",
    );
  }
  return callId;
}
