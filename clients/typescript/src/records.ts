/**
 * What a run journal holds, as it is written to disk: journal format 1.
 *
 *     JournalDocument  run id, flow version, whether the run is finished, the lease
 *     └── Turn         one decision of the model, saved before any of its calls runs
 *         ├── PlannedCall   the model's ToolCall, its key and the exact request to send
 *         └── ToolResult    per call id: what the tool answered, saved before the next step
 *
 * The format is shared with the Python client (`docs/journal.md`): a journal one
 * writes, the other resumes. So the records keep the file's member names, a
 * reader refuses members it does not know (a journal it cannot fully understand
 * is not one it may advance), and times are Unix seconds. Records are immutable;
 * a change is a new document written whole.
 */

import { IncompatibleJournal, JournalCorrupt } from "./errors.js";
import type { BodyEncoding } from "./models.js";

/** The layout of the journal itself; a journal of another format is refused, not guessed at. */
export const JOURNAL_FORMAT = 1;

/** One tool call as the model decided it: its id, the tool's name, the arguments. */
export interface ToolCall {
  readonly call_id: string;
  readonly name: string;
  readonly arguments: Readonly<Record<string, unknown>>;
}

/**
 * The request a tool call becomes, fixed in the plan so every retry sends it exactly.
 *
 * For an HTTP tool, `path` is the gateway path (with the route prefix) and `json`
 * the body (null: no body, as a GET or HEAD always has). For an MCP tool, `method` is `tools/call`, `path` the tool's name on
 * the server and `json` its arguments: what the gateway records for an MCP call.
 */
export interface ToolRequest {
  readonly method: string;
  readonly path: string;
  readonly json: unknown;
  readonly headers: Readonly<Record<string, string>>;
}

/** A call of a saved plan: the model's decision plus the key and the request it maps to. */
export interface PlannedCall {
  readonly call: ToolCall;
  readonly key: string;
  readonly request: ToolRequest;
}

/** `response`: this worker sent the call; `receipt`: a lookup found it; `manual`: recorded by hand. */
export type ResultSource = "response" | "receipt" | "manual";

/**
 * What the tool answered for one call, as recorded in the journal.
 *
 * `state` is the key's state with that answer: `completed`, or `released` when
 * the tool refused with one of the route's `release_statuses`. An MCP tool's
 * result has status 200 and a JSON body `{"result": ...}` or `{"error": ...}`.
 */
export interface ToolResult {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
  readonly body_encoding: BodyEncoding;
  readonly replayed: boolean;
  readonly state: string | null;
  readonly source: ResultSource;
  readonly recorded_at: number;
}

/** One decision of the model and the results of its calls, in call order. */
export interface Turn {
  readonly index: number;
  readonly calls: readonly PlannedCall[];
  readonly results: Readonly<Record<string, ToolResult>>;
  readonly planned_at: number;
}

/**
 * Who may advance the run, until when, and the fencing token of that grant.
 *
 * The token grows every time a worker takes the run over, so a worker that was
 * paused past its lease finds a newer token and stops instead of writing.
 */
export interface RunLease {
  readonly holder: string;
  readonly token: number;
  readonly expires_at: number;
  readonly host: string;
  readonly pid: number;
}

/** The whole durable record of one run. */
export interface JournalDocument {
  readonly format: number;
  readonly run_id: string;
  readonly flow_version: string;
  readonly created_at: number;
  readonly finished: boolean;
  readonly turns: readonly Turn[];
  readonly lease: RunLease | null;
}

/** Now, in the journal's unit: Unix seconds. */
export function now(): number {
  return Date.now() / 1000;
}

/** The calls of `turn` without a recorded result, in order. */
export function pendingCalls(turn: Turn): readonly PlannedCall[] {
  return turn.calls.filter((planned) => !Object.hasOwn(turn.results, planned.call.call_id));
}

/** The recorded result of a call; throws when it has none yet. */
export function resultOf(turn: Turn, callId: string): ToolResult {
  if (!Object.hasOwn(turn.results, callId)) {
    throw new RangeError(`turn ${turn.index} has no result for call ${JSON.stringify(callId)}`);
  }
  return turn.results[callId] as ToolResult;
}

/** The last turn, or null before the first plan. */
export function currentTurn(document: JournalDocument): Turn | null {
  return document.turns.at(-1) ?? null;
}

/** `document` with `turn` replacing the turn of the same index, or appended. */
export function withTurn(document: JournalDocument, turn: Turn): JournalDocument {
  const turns = document.turns.filter((existing) => existing.index !== turn.index);
  turns.push(turn);
  turns.sort((a, b) => a.index - b.index);
  return { ...document, turns };
}

/** A new run's document. */
export function newDocument(runId: string, flowVersion: string, createdAt: number): JournalDocument {
  return {
    format: JOURNAL_FORMAT,
    run_id: runId,
    flow_version: flowVersion,
    created_at: createdAt,
    finished: false,
    turns: [],
    lease: null,
  };
}

/** A result whose body is kept as UTF-8 text when it is, else as base64. */
export function resultFromBytes(
  status: number,
  headers: Readonly<Record<string, string>>,
  body: Uint8Array,
  fields: { replayed: boolean; state: string | null; source: ResultSource },
): ToolResult {
  let text: string;
  let encoding: BodyEncoding = "utf-8";
  try {
    text = new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(body);
  } catch {
    text = Buffer.from(body).toString("base64");
    encoding = "base64";
  }
  return {
    status,
    headers: { ...headers },
    body: text,
    body_encoding: encoding,
    replayed: fields.replayed,
    state: fields.state,
    source: fields.source,
    recorded_at: now(),
  };
}

/** The journal's bytes: JSON, two-space indent, a final newline (as the Python client writes it). */
export function serializeJournal(document: JournalDocument): string {
  return JSON.stringify(normalized(document), null, 2) + "\n";
}

/** Read a stored journal, telling a foreign format from a damaged file. */
export function parseJournal(raw: Uint8Array | string, where: string): JournalDocument {
  let data: unknown;
  try {
    const text = typeof raw === "string" ? raw : new TextDecoder("utf-8", { fatal: true }).decode(raw);
    data = JSON.parse(text);
  } catch (error) {
    throw new JournalCorrupt(`${where}: not a JSON journal: ${(error as Error).message}`);
  }
  if (typeof data !== "object" || data === null || Array.isArray(data)) {
    throw new JournalCorrupt(`${where}: not a JSON journal object`);
  }
  const format = (data as Record<string, unknown>)["format"];
  if (format !== JOURNAL_FORMAT) {
    throw new IncompatibleJournal(
      `${where}: journal format ${format === undefined ? "None" : JSON.stringify(format)}; this client reads format ${JOURNAL_FORMAT}`,
    );
  }
  try {
    return readDocument(new Reader(data as Record<string, unknown>, "journal"));
  } catch (error) {
    if (error instanceof InvalidRecord) {
      throw new JournalCorrupt(`${where}: invalid journal: ${error.message}`);
    }
    throw error;
  }
}

/** The document rebuilt member by member, in the format's order. */
function normalized(document: JournalDocument): JournalDocument {
  return readDocument(new Reader(document as unknown as Record<string, unknown>, "journal"));
}

class InvalidRecord extends Error {}

/** Reads one JSON object of the journal: each member checked, unknown members refused. */
class Reader {
  private readonly seen = new Set<string>();

  constructor(
    private readonly data: Record<string, unknown>,
    private readonly where: string,
  ) {}

  static of(value: unknown, where: string): Reader {
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      throw new InvalidRecord(`${where}: expected an object`);
    }
    return new Reader(value as Record<string, unknown>, where);
  }

  private take(name: string): unknown {
    this.seen.add(name);
    return this.data[name];
  }

  private fail(name: string, expected: string): never {
    throw new InvalidRecord(`${this.where}.${name}: expected ${expected}, got ${JSON.stringify(this.data[name])}`);
  }

  string(name: string, options: { minLength?: number; fallback?: string } = {}): string {
    const value = this.take(name);
    if (value === undefined && options.fallback !== undefined) {
      return options.fallback;
    }
    if (typeof value !== "string" || value.length < (options.minLength ?? 0)) {
      this.fail(name, options.minLength ? "a non-empty string" : "a string");
    }
    return value;
  }

  optionalString(name: string): string | null {
    const value = this.take(name);
    if (value === undefined || value === null) {
      return null;
    }
    if (typeof value !== "string") {
      this.fail(name, "a string or null");
    }
    return value;
  }

  integer(name: string, options: { minimum?: number } = {}): number {
    const value = this.take(name);
    if (typeof value !== "number" || !Number.isInteger(value) || value < (options.minimum ?? -Infinity)) {
      this.fail(name, options.minimum === undefined ? "an integer" : `an integer >= ${options.minimum}`);
    }
    return value;
  }

  seconds(name: string, fallback?: () => number): number {
    const value = this.take(name);
    if (value === undefined && fallback !== undefined) {
      return fallback();
    }
    if (typeof value !== "number" || !Number.isFinite(value)) {
      this.fail(name, "a number of seconds");
    }
    return value;
  }

  boolean(name: string, fallback: boolean): boolean {
    const value = this.take(name);
    if (value === undefined) {
      return fallback;
    }
    if (typeof value !== "boolean") {
      this.fail(name, "true or false");
    }
    return value;
  }

  oneOf<T extends string>(name: string, choices: readonly T[], fallback: T): T {
    const value = this.take(name);
    if (value === undefined) {
      return fallback;
    }
    if (!choices.includes(value as T)) {
      this.fail(name, choices.map((choice) => JSON.stringify(choice)).join(" or "));
    }
    return value as T;
  }

  stringMap(name: string): Record<string, string> {
    const value = this.take(name);
    if (value === undefined) {
      return {};
    }
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      this.fail(name, "an object of strings");
    }
    const out: Record<string, string> = {};
    for (const [member, item] of Object.entries(value)) {
      if (typeof item !== "string") {
        this.fail(name, "an object of strings");
      }
      out[member] = item;
    }
    return out;
  }

  object(name: string, fallback?: Record<string, unknown>): Record<string, unknown> {
    const value = this.take(name);
    if (value === undefined && fallback !== undefined) {
      return fallback;
    }
    if (typeof value !== "object" || value === null || Array.isArray(value)) {
      this.fail(name, "an object");
    }
    return value as Record<string, unknown>;
  }

  any(name: string): unknown {
    const value = this.take(name);
    return value === undefined ? null : value;
  }

  array(name: string, fallback?: unknown[]): unknown[] {
    const value = this.take(name);
    if (value === undefined && fallback !== undefined) {
      return fallback;
    }
    if (!Array.isArray(value)) {
      this.fail(name, "an array");
    }
    return value;
  }

  nested(name: string): Reader | null {
    const value = this.take(name);
    if (value === undefined || value === null) {
      return null;
    }
    return Reader.of(value, `${this.where}.${name}`);
  }

  /** Call after reading every known member: anything left is a member this format does not have. */
  done(): void {
    const extra = Object.keys(this.data).filter((name) => !this.seen.has(name));
    if (extra.length > 0) {
      throw new InvalidRecord(`${this.where}: unknown member ${extra.map((name) => JSON.stringify(name)).join(", ")}`);
    }
  }
}

function readDocument(reader: Reader): JournalDocument {
  const document: JournalDocument = {
    format: reader.integer("format"),
    run_id: reader.string("run_id"),
    flow_version: reader.string("flow_version"),
    created_at: reader.seconds("created_at", now),
    finished: reader.boolean("finished", false),
    turns: reader.array("turns", []).map((turn, index) => readTurn(Reader.of(turn, `turns[${index}]`))),
    lease: readLease(reader.nested("lease")),
  };
  reader.done();
  return document;
}

function readTurn(reader: Reader): Turn {
  const index = reader.integer("index", { minimum: 0 });
  const calls = reader.array("calls").map((call, position) => readPlanned(Reader.of(call, `turns[${index}].calls[${position}]`)));
  const stored = reader.object("results", {});
  const results: Record<string, ToolResult> = {};
  for (const [callId, result] of Object.entries(stored)) {
    results[callId] = readResult(Reader.of(result, `turns[${index}].results.${callId}`));
  }
  const turn: Turn = { index, calls, results, planned_at: reader.seconds("planned_at", now) };
  reader.done();
  return turn;
}

function readPlanned(reader: Reader): PlannedCall {
  const call = reader.nested("call");
  const request = reader.nested("request");
  if (call === null || request === null) {
    throw new InvalidRecord("a planned call needs its call and its request");
  }
  const planned: PlannedCall = { call: readCall(call), key: reader.string("key"), request: readRequest(request) };
  reader.done();
  return planned;
}

function readCall(reader: Reader): ToolCall {
  const call: ToolCall = {
    call_id: reader.string("call_id", { minLength: 1 }),
    name: reader.string("name", { minLength: 1 }),
    arguments: reader.object("arguments", {}),
  };
  reader.done();
  return call;
}

function readRequest(reader: Reader): ToolRequest {
  const request: ToolRequest = {
    method: reader.string("method", { fallback: "POST" }),
    path: reader.string("path"),
    json: reader.any("json"),
    headers: reader.stringMap("headers"),
  };
  reader.done();
  return request;
}

function readResult(reader: Reader): ToolResult {
  const result: ToolResult = {
    status: reader.integer("status"),
    headers: reader.stringMap("headers"),
    body: reader.string("body", { fallback: "" }),
    body_encoding: reader.oneOf("body_encoding", ["utf-8", "base64"] as const, "utf-8"),
    replayed: reader.boolean("replayed", false),
    state: reader.optionalString("state"),
    source: reader.oneOf("source", ["response", "receipt", "manual"] as const, "response"),
    recorded_at: reader.seconds("recorded_at", now),
  };
  reader.done();
  return result;
}

function readLease(reader: Reader | null): RunLease | null {
  if (reader === null) {
    return null;
  }
  const lease: RunLease = {
    holder: reader.string("holder"),
    token: reader.integer("token", { minimum: 1 }),
    expires_at: reader.seconds("expires_at"),
    host: reader.string("host"),
    pid: reader.integer("pid"),
  };
  reader.done();
  return lease;
}
