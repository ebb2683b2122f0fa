/**
 * `Run`: an agent loop that survives `kill -9` without repeating or losing an effect.
 *
 * The recovery protocol, in the order a step applies it:
 *
 * 1. Persist the model's decision (the turn's calls, and the exact request each
 *    becomes) before any tool runs, so a restart never asks the model again.
 * 2. One stable key per effect, `runId:turn:callId`, sent on every attempt.
 * 3. Persist each result before the next call.
 * 4. After a restart, for each call without a result, ask the gateway first:
 *    `completed` -> take the receipt; `in_flight` -> wait; `released` or 404 ->
 *    send; `unknown` -> stop (`ReconciliationRequired`), never resend.
 * 5. A call the gateway refuses as the same request as another key's operation
 *    (`similar-operation`: the key of an earlier attempt was lost) is never sent as a
 *    second effect: a twin whose outcome is `unknown` stops the run
 *    (`ReconciliationRequired`, naming the twin); any other twin's key is taken over,
 *    the call sent under it, and its answer (the twin's receipt, once it is done) is
 *    the call's result.
 * 6. A call whose key the gateway holds for another request whose call is still
 *    `in_flight` or `unknown` (`key-mismatch-unsettled`) stops the run as an unknown
 *    outcome does (`ReconciliationRequired`): that earlier call may have happened, so
 *    nothing is sent, under this key or a new one. A `key-mismatch` (the first call
 *    settled) is thrown as it is: the plan is wrong.
 * 7. The journal is pinned to one flow version, and one worker holds the run's
 *    lease (with a fencing token) at a time.
 *
 * The same protocol as the Python client's `Run`, over the same journal format:
 * a run started by one resumes in the other.
 */

import { BODILESS_METHODS, type GatewayClient } from "./client.js";
import {
  CallUnconfirmed,
  type GatewayProblem,
  JournalError,
  KeyMismatchUnsettled,
  OutcomeUnknown,
  ReceiptExpired,
  ReceiptNotRetained,
  ReconciliationRequired,
  RunLeaseLost,
  SimilarOperation,
  type SimilarTwin,
} from "./errors.js";
import type { EventKind, RunObserver } from "./events.js";
import { deriveKey, operationPath } from "./keys.js";
import { currentWorker, type JournalStore, type Worker } from "./lease.js";
import { MCP_METHOD, mcpReceipt } from "./mcp.js";
import type { Operation } from "./models.js";
import {
  currentTurn,
  type JournalDocument,
  now,
  pendingCalls,
  type PlannedCall,
  resultFromBytes,
  type ToolCall,
  type ToolRequest,
  type ToolResult,
  type Turn,
  withTurn,
} from "./records.js";
import { isSendingTool, type Planner, type Tool } from "./tools.js";

/** Twins followed for one call: the twin's key may itself be refused in a third key's name. */
const MAX_TAKEOVERS = 3;

export interface RunOptions {
  readonly client: GatewayClient;
  readonly runId: string;
  readonly flowVersion: string;
  readonly tools: Readonly<Record<string, Tool>>;
  /** A name for this worker in lease messages (default `host:pid`). */
  readonly worker?: string;
  /** Seconds a lease lasts; renewed every third of it while the run is open (default 30). */
  readonly leaseDuration?: number;
  /** Seconds to wait for a call another worker left `in_flight` (default 60). */
  readonly settleTimeout?: number;
  readonly onEvent?: RunObserver;
}

/** A promise-chain mutex: a renewal never writes back a document older than a save. */
class Mutex {
  private tail: Promise<unknown> = Promise.resolve();

  run<T>(critical: () => Promise<T>): Promise<T> {
    const result = this.tail.then(critical, critical);
    this.tail = result.catch(() => undefined);
    return result;
  }
}

/**
 * One run of an agent, advanced one turn at a time through the gateway.
 *
 * `Run.open` takes the run's lease (`RunLeased` if another live worker holds it;
 * `IncompatibleJournal` if the journal was written for another flow version) and
 * keeps renewing it; `close` releases it.
 *
 * ```ts
 * const run = await Run.open(new FileJournal("runs/run-77.json"), {
 *   client: gw, runId: "run-77", flowVersion: "triage-v1",
 *   tools: { create_ticket: new HttpTool("POST", "/tickets/v1/issues") },
 * });
 * try {
 *   while (!run.finished) await run.step(plan);
 * } finally {
 *   await run.close();
 * }
 * ```
 */
export class Run {
  readonly journal: JournalStore;
  readonly client: GatewayClient;
  readonly runId: string;
  readonly flowVersion: string;
  readonly tools: Readonly<Record<string, Tool>>;
  readonly worker: Worker;
  readonly leaseDuration: number;
  readonly settleTimeout: number;
  private readonly onEvent: RunObserver | undefined;
  private current: JournalDocument | null = null;
  private readonly writes = new Mutex();
  private keeper: ReturnType<typeof setInterval> | null = null;
  private lost: RunLeaseLost | null = null;

  private constructor(journal: JournalStore, options: RunOptions) {
    deriveKey(options.runId, 0, "check"); // refuse a run id that cannot make keys, now
    if (!options.flowVersion) {
      throw new TypeError("flowVersion may not be empty");
    }
    const leaseDuration = options.leaseDuration ?? 30;
    const settleTimeout = options.settleTimeout ?? 60;
    if (!(leaseDuration > 0)) {
      throw new RangeError(`leaseDuration must be > 0 seconds, got ${leaseDuration}`);
    }
    if (!(settleTimeout >= 0)) {
      throw new RangeError(`settleTimeout must be >= 0 seconds, got ${settleTimeout}`);
    }
    this.journal = journal;
    this.client = options.client;
    this.runId = options.runId;
    this.flowVersion = options.flowVersion;
    this.tools = { ...options.tools };
    this.worker = currentWorker(options.worker);
    this.leaseDuration = leaseDuration;
    this.settleTimeout = settleTimeout;
    this.onEvent = options.onEvent;
  }

  /** Take the run's lease (creating the run when it is new) and keep renewing it until `close`. */
  static async open(journal: JournalStore, options: RunOptions): Promise<Run> {
    const run = new Run(journal, options);
    run.current = await journal.acquire(run.runId, run.flowVersion, run.worker, run.leaseDuration);
    run.keeper = setInterval(() => void run.renew(), (run.leaseDuration / 3) * 1000);
    run.keeper.unref(); // a run left open must not keep the process alive
    if (run.current.finished) {
      run.emit("finished"); // a rerun of a finished run does nothing: it says so, rather than nothing
    }
    return run;
  }

  /** Open the run, give it to `body`, and close it however `body` ends. */
  static async with<T>(journal: JournalStore, options: RunOptions, body: (run: Run) => Promise<T>): Promise<T> {
    const run = await Run.open(journal, options);
    try {
      return await body(run);
    } finally {
      await run.close();
    }
  }

  /** Stop renewing and let the lease expire now, so the next worker need not wait. */
  async close(): Promise<void> {
    if (this.keeper !== null) {
      clearInterval(this.keeper);
      this.keeper = null;
    }
    const document = this.current;
    this.current = null;
    if (document === null || this.lost !== null) {
      return;
    }
    await this.writes.run(async () => {
      try {
        await this.journal.release(document);
      } catch (error) {
        if (!(error instanceof RunLeaseLost)) {
          throw error;
        }
      }
    });
  }

  /** The journal as this worker last wrote it. */
  get document(): JournalDocument {
    if (this.current === null) {
      throw new Error("open the run with `await Run.open(...)` first (or it was closed)");
    }
    return this.current;
  }

  get turns(): readonly Turn[] {
    return this.document.turns;
  }

  get finished(): boolean {
    return this.document.finished;
  }

  /** Calls of the current turn without a recorded result. */
  get pending(): readonly PlannedCall[] {
    const turn = currentTurn(this.document);
    return turn === null ? [] : pendingCalls(turn);
  }

  /**
   * Advance one turn: settle what an earlier worker left, plan, execute, record.
   *
   * The planner is asked only when every saved call has its result; an empty plan
   * finishes the run (and returns null).
   */
  async step(plan: Planner): Promise<Turn | null> {
    if (this.finished) {
      return null;
    }
    await this.resume();
    const calls = await plan(this.turns);
    if (calls.length === 0) {
      await this.save({ ...this.document, finished: true });
      this.emit("finished");
      return null;
    }
    const index = this.turns.length;
    const turn: Turn = { index, calls: this.bind(index, calls), results: {}, planned_at: now() };
    await this.save(withTurn(this.document, turn));
    this.emit("planned", { turn: index });
    for (const planned of turn.calls) {
      await this.send(index, planned);
    }
    return this.turns[index] ?? null;
  }

  /**
   * Settle every call of the current turn that has no result, asking the gateway first.
   *
   * Returns the results recorded now. Throws `ReconciliationRequired` for a call
   * whose outcome nobody knows, leaving it (and the calls after it) without a
   * result for the next resume.
   */
  async resume(): Promise<readonly ToolResult[]> {
    const turn = currentTurn(this.document);
    if (turn === null) {
      return [];
    }
    const recorded: ToolResult[] = [];
    for (const planned of pendingCalls(turn)) {
      const receipt = await this.lookUp(turn.index, planned);
      recorded.push(receipt !== null ? await this.record(turn.index, planned, receipt) : await this.send(turn.index, planned));
    }
    return recorded;
  }

  /** Record a result found by hand (after reconciliation) for a call of the current turn. */
  async recordResult(callId: string, result: ToolResult): Promise<void> {
    const turn = currentTurn(this.document);
    const planned = this.pending.find((candidate) => candidate.call.call_id === callId);
    if (turn === null || planned === undefined) {
      throw new RangeError(`no call ${JSON.stringify(callId)} without a result in the current turn`);
    }
    await this.record(turn.index, planned, { ...result, source: "manual" });
  }

  private bind(turn: number, calls: readonly ToolCall[]): PlannedCall[] {
    const seen = new Set<string>();
    return calls.map((call) => {
      if (seen.has(call.call_id)) {
        throw new RangeError(`turn ${turn}: call id ${JSON.stringify(call.call_id)} appears twice`);
      }
      seen.add(call.call_id);
      const tool = this.tools[call.name];
      if (tool === undefined) {
        const names = Object.keys(this.tools).sort().join(", ");
        throw new RangeError(`turn ${turn}: no tool ${JSON.stringify(call.name)}; tools: ${names}`);
      }
      const key = deriveKey(this.runId, turn, call.call_id);
      const frozen: ToolCall = { call_id: call.call_id, name: call.name, arguments: { ...call.arguments } };
      const request = tool.request(frozen);
      checkSendable(turn, frozen, request);
      return { call: frozen, key, request };
    });
  }

  /** The receipt of a call an earlier attempt may have sent; null: send it. */
  private async lookUp(turn: number, planned: PlannedCall): Promise<ToolResult | null> {
    let operation = await this.client.lookup(planned.key);
    this.emit("lookup", { turn, call: planned, state: stateOf(operation) });
    if (operation !== null && operation.state === "in_flight") {
      operation = await this.client.waitSettled(planned.key, this.settleTimeout);
      this.emit("lookup", { turn, call: planned, state: stateOf(operation) });
    }
    if (operation === null || operation.state === "released" || operation.state === "in_flight") {
      return null; // still in flight: sending waits on the gateway's `in-progress` answers
    }
    checkSameRequest(planned, operation);
    if (operation.state === "unknown") {
      throw new ReconciliationRequired(
        `${planned.key}: the gateway does not know whether ${planned.call.name} took effect (state ` +
          "unknown); resolve it (probe, GatewayClient.resolve or an operator), then resume. It will not be resent",
        { key: planned.key, callId: planned.call.call_id, operation },
      );
    }
    const receipt = receiptOf(operation);
    if (receipt === null) {
      throw new ReconciliationRequired(
        `${planned.key}: ${planned.call.name} took effect, but its receipt is gone (expired or too large ` +
          "to keep); read the result from the tool and record it with Run.recordResult. It will not be resent",
        { key: planned.key, callId: planned.call.call_id, operation },
      );
    }
    return receipt;
  }

  private async send(turn: number, planned: PlannedCall): Promise<ToolResult> {
    this.emit("sending", { turn, call: planned });
    let result: ToolResult;
    try {
      result = await this.deliver(planned);
    } catch (error) {
      if (error instanceof SimilarOperation) {
        return this.answered(turn, planned, await this.takeOver(turn, planned, error, 0));
      }
      if (error instanceof KeyMismatchUnsettled) {
        // Not a request to fix under a new key: if both requests meant this effect,
        // a new key would make it twice. Settled first, as an unknown outcome is.
        throw new ReconciliationRequired(
          `${planned.key}: the key was first used with another request, whose call is ` +
            `${error.state ?? "unsettled"}: it may have taken effect (${error.kind}); ` +
            `${planned.call.name} was not sent, and will not be under this key or a new ` +
            `one. Settle that earlier call (look it up at ${this.client.baseUrl}${operationPath(planned.key)}), then resume`,
          { key: planned.key, callId: planned.call.call_id, problem: error },
        );
      }
      if (error instanceof OutcomeUnknown || error instanceof ReceiptExpired || error instanceof ReceiptNotRetained) {
        throw new ReconciliationRequired(
          `${planned.key}: ${planned.call.name} may have taken effect and no receipt says what it ` +
            `returned (${error.kind}); it will not be resent. Reconcile, then resume`,
          { key: planned.key, callId: planned.call.call_id, problem: error },
        );
      }
      if (error instanceof CallUnconfirmed) {
        // What came back may hide an answer the gateway recorded: ask it, as a resume would.
        const receipt = await this.lookUp(turn, planned);
        if (receipt === null) {
          throw error;
        }
        return this.record(turn, planned, receipt);
      }
      throw error;
    }
    return this.answered(turn, planned, result);
  }

  private async answered(turn: number, planned: PlannedCall, result: ToolResult): Promise<ToolResult> {
    this.emit("response", { turn, call: planned, result });
    return this.record(turn, planned, result);
  }

  /**
   * The call's result through the key of the twin the gateway named, never a second send.
   *
   * The gateway refused the planned key because the same request already is another
   * key's operation (most likely an attempt whose key was lost). A twin whose outcome
   * is `unknown` must be settled first; any other twin is this call's effect: the same
   * request is sent under the twin's key, and the gateway answers with the twin's
   * receipt (waiting while it is in flight), or sends it under that key if the twin
   * was released. The journal keeps the planned key; a resume meets the refusal again
   * and takes over again.
   */
  private async takeOver(turn: number, planned: PlannedCall, refused: SimilarOperation, taken: number): Promise<ToolResult> {
    const twin = refused.similarOperation;
    if (twin === null || twin.state === "unknown") {
      throw this.settleTwin(planned, refused, twin, "whose outcome is unknown");
    }
    if (taken >= MAX_TAKEOVERS) {
      throw this.settleTwin(planned, refused, twin, `after ${taken} other keys of the same request in a row`);
    }
    this.emit("took_over", { turn, call: planned, state: twin.state, twin });
    const asTwin: PlannedCall = { ...planned, key: twin.key };
    try {
      // The twin may be (or be again) in flight: wait for its answer as for a call
      // another worker left in flight.
      return await this.deliver(asTwin, this.settleTimeout > 0 ? this.settleTimeout : undefined);
    } catch (error) {
      if (error instanceof SimilarOperation) {
        return this.takeOver(turn, planned, error, taken + 1);
      }
      if (
        error instanceof OutcomeUnknown ||
        error instanceof KeyMismatchUnsettled ||
        error instanceof ReceiptExpired ||
        error instanceof ReceiptNotRetained
      ) {
        throw this.settleTwin(planned, error, twin, `of which no receipt says what it returned (${error.kind} under its key)`);
      }
      if (error instanceof CallUnconfirmed) {
        const receipt = await this.lookUp(turn, asTwin);
        if (receipt === null) {
          throw error;
        }
        return receipt;
      }
      throw error;
    }
  }

  /** Stop: the call's effect is the twin's, and no receipt of the twin says what it was. */
  private settleTwin(
    planned: PlannedCall,
    problem: GatewayProblem,
    twin: SimilarTwin | null,
    why: string,
  ): ReconciliationRequired {
    const settle =
      twin === null
        ? "another key's operation, which it did not name; find that operation, settle it"
        : `${twin.key}, ${why}; settle ${twin.key} (look it up at ${this.client.baseUrl}${twin.operation})`;
    return new ReconciliationRequired(
      `${planned.key}: the gateway refused ${planned.call.name} as the same request as ${settle}, ` +
        "then resume; this call will not be sent",
      { key: planned.key, callId: planned.call.call_id, problem, similarOperation: twin },
    );
  }

  /**
   * Send the planned request: by the tool itself (MCP), else through the HTTP client.
   *
   * `wait` asks the gateway to hold the answer of an attempt in flight (HTTP only; an
   * MCP tool resends on `in-progress` under its backoff).
   */
  private async deliver(planned: PlannedCall, wait?: number): Promise<ToolResult> {
    const tool = this.tools[planned.call.name];
    if (isSendingTool(tool)) {
      return tool.send(planned);
    }
    const request = planned.request;
    if (request.method === MCP_METHOD) {
      throw new TypeError(
        `${planned.key}: the plan holds an MCP call of '${planned.call.name}', but that tool is not ` +
          "an McpTool now; an MCP call is sent by an McpTool",
      );
    }
    const response = await this.client.request(request.method, request.path, {
      key: planned.key,
      json: request.json,
      headers: request.headers,
      ...(wait !== undefined ? { wait } : {}),
    });
    const headers: Record<string, string> = {};
    response.headers.forEach((value, name) => {
      const lower = name.toLowerCase();
      headers[lower] = lower in headers ? `${headers[lower]}, ${value}` : value;
    });
    return resultFromBytes(response.status, headers, response.body, {
      replayed: response.replayed,
      state: response.state,
      source: "response",
    });
  }

  private async record(turn: number, planned: PlannedCall, result: ToolResult): Promise<ToolResult> {
    const existing = this.turns[turn];
    if (existing === undefined) {
      throw new RangeError(`no turn ${turn} in the journal`);
    }
    const updated: Turn = { ...existing, results: { ...existing.results, [planned.call.call_id]: result } };
    await this.save(withTurn(this.document, updated));
    this.emit("recorded", { turn, call: planned, result });
    return result;
  }

  private async save(document: JournalDocument): Promise<void> {
    if (this.lost !== null) {
      throw this.lost;
    }
    await this.writes.run(async () => {
      try {
        this.current = await this.journal.write(document, this.leaseDuration);
      } catch (error) {
        if (error instanceof RunLeaseLost) {
          this.lost = error;
        }
        throw error;
      }
    });
  }

  /** Renew the lease (every third of its duration while the run is open). */
  private async renew(): Promise<void> {
    await this.writes.run(async () => {
      if (this.current === null || this.lost !== null) {
        return;
      }
      try {
        this.current = await this.journal.write(this.current, this.leaseDuration);
      } catch (error) {
        if (error instanceof RunLeaseLost) {
          this.lost = error; // thrown by the next save
        } else if (!(error instanceof JournalError) && !isSystemError(error)) {
          throw error;
        } // disk full, lock busy: the next period tries again
      }
    });
  }

  private emit(
    kind: EventKind,
    details: { turn?: number; call?: PlannedCall; state?: string; result?: ToolResult; twin?: SimilarTwin } = {},
  ): void {
    if (this.onEvent === undefined) {
      return;
    }
    this.onEvent({
      kind,
      runId: this.runId,
      turn: details.turn ?? null,
      call: details.call ?? null,
      state: details.state ?? null,
      result: details.result ?? null,
      twin: details.twin ?? null,
      callId: details.call?.call.call_id ?? null,
      key: details.call?.key ?? null,
    });
  }
}

function stateOf(operation: Operation | null): string {
  return operation === null ? "absent" : operation.state;
}

function isSystemError(error: unknown): boolean {
  return error instanceof Error && typeof (error as NodeJS.ErrnoException).code === "string";
}

/** The result a completed operation's receipt stands for; null when it is gone. */
function receiptOf(operation: Operation): ToolResult | null {
  if (operation.method === MCP_METHOD) {
    return mcpReceipt(operation);
  }
  const response = operation.response;
  if (response === null) {
    return null;
  }
  return {
    status: response.status,
    headers: { ...response.headers },
    body: response.body,
    body_encoding: response.body_encoding,
    replayed: true,
    state: "completed",
    source: "receipt",
    recorded_at: now(),
  };
}

/**
 * A tool's GET or HEAD with a body is refused before the plan is saved: no client would send it
 * (`BODILESS_METHODS`), so saved, it would stop this run at every attempt to send it.
 */
function checkSendable(turn: number, call: ToolCall, request: ToolRequest): void {
  const method = request.method.toUpperCase();
  if (BODILESS_METHODS.has(method) && request.json !== null && request.json !== undefined) {
    throw new TypeError(
      `turn ${turn}: tool ${JSON.stringify(call.name)} made a ${method} request with a body; ` +
        `a ${method} request has no body (json null)`,
    );
  }
}

/** A receipt is taken only for the request the plan names (a reused run id would differ). */
function checkSameRequest(planned: PlannedCall, operation: Operation): void {
  const path = planned.request.path.split("?", 1)[0] ?? "";
  if (operation.method !== planned.request.method || operation.path !== path) {
    throw new ReconciliationRequired(
      `${planned.key}: the gateway recorded ${operation.method} ${operation.path} under this key, but ` +
        `the plan sends ${planned.request.method} ${path}; was the run id reused?`,
      { key: planned.key, callId: planned.call.call_id, operation },
    );
  }
}
