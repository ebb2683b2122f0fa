/** What a run reports while it advances, for progress output, logs and tests. */

import type { SimilarTwin } from "./errors.js";
import type { PlannedCall, ToolResult } from "./records.js";

/**
 * - `planned`: a turn's calls are durably in the journal; none has run yet.
 * - `lookup`: a call left without a result was looked up at the gateway; `state`
 *   is the answer (`absent` for a 404).
 * - `sending`: the call is about to be sent through the gateway.
 * - `took_over`: the gateway refused the call's key as the same request as another
 *   key's operation (`similar-operation`), and the call is about to be sent again
 *   under that key (`twin.key`; `state` is the twin's), so that its answer, a replay
 *   of the twin's receipt, is this call's result. The journal keeps the call's own key.
 * - `response`: the gateway answered with the tool's answer (the effect exists);
 *   `result` is not in the journal yet.
 * - `recorded`: the call's `result` is durably in the journal.
 * - `finished`: the run is durably marked finished (also when a run opens finished: a rerun
 *   does nothing, and says so).
 */
export type EventKind = "planned" | "lookup" | "sending" | "took_over" | "response" | "recorded" | "finished";

/** One thing a `Run` did, reported to its `onEvent` observer when it happens. */
export interface RunEvent {
  readonly kind: EventKind;
  readonly runId: string;
  readonly turn: number | null;
  readonly call: PlannedCall | null;
  readonly state: string | null;
  readonly result: ToolResult | null;
  /** For `took_over`: the operation whose key the call was sent under. */
  readonly twin: SimilarTwin | null;
  /** The model's id of the call, for events about a call. */
  readonly callId: string | null;
  /** The call's idempotency key, for events about a call. */
  readonly key: string | null;
}

/** Called synchronously; an exception it throws propagates out of the `Run` method that reported. */
export type RunObserver = (event: RunEvent) => void;
