/**
 * What the gateway answers: proxied responses and the operation JSON of a lookup.
 *
 * Gateway documents keep their wire names (`safe_to_retry`, `body_encoding`): they
 * are the contract, and the same names appear in the docs and in the journal.
 * Fields the contract fixes are checked at this boundary; anything a newer gateway
 * adds is kept, never refused.
 */

import { GatewayClientError } from "./errors.js";
import { unquoteKey } from "./keys.js";

export type OperationState = "in_flight" | "completed" | "unknown" | "released";

const STATES: ReadonlySet<string> = new Set(["in_flight", "completed", "unknown", "released"]);

export type BodyEncoding = "utf-8" | "base64";

/** A receipt: the upstream's status, headers and body as the gateway stored them. */
export interface StoredResponse {
  readonly status: number;
  readonly headers: Readonly<Record<string, string>>;
  readonly body: string;
  readonly body_encoding: BodyEncoding;
  readonly [extra: string]: unknown;
}

/** Who settled the operation (`upstream`, `probe`, `owner`, `admin`), when, and why. */
export interface Resolution {
  readonly by: string;
  readonly at?: string | null;
  readonly note?: string | null;
  readonly [extra: string]: unknown;
}

/** What a late writer or a probe saw, kept for whoever reconciles. */
export interface Evidence {
  readonly at?: string | null;
  readonly source?: string | null;
  readonly detail?: string | null;
  readonly status?: number | null;
  readonly body_sha256?: string | null;
  readonly [extra: string]: unknown;
}

/** The gateway's record of one key in the caller's scope (`GET /operations/<key>`). */
export interface Operation {
  readonly id: string;
  readonly key: string;
  readonly state: OperationState;
  readonly route: string;
  readonly method: string;
  readonly path: string;
  readonly fingerprint: string;
  readonly attempts: number;
  readonly created_at: string;
  readonly updated_at: string;
  readonly expires_at: string | null;
  readonly forgotten_at: string | null;
  readonly response: StoredResponse | null;
  /** An MCP operation's receipt (method `tools/call`): the tool result the server answered. */
  readonly result?: unknown;
  /** An MCP operation whose server answered a JSON-RPC error: that error, its receipt. */
  readonly error?: unknown;
  readonly resolution: Resolution | null;
  readonly evidence: readonly Evidence[];
  readonly safe_to_retry: boolean;
  /** The lookup's `ETag`: pass it to `resolve` so a concurrent change is refused, not overwritten. */
  readonly etag: string | null;
  readonly [extra: string]: unknown;
}

/** Completed with its response (an MCP result or error) still stored. */
export function hasReceipt(operation: Operation): boolean {
  const stored =
    operation.response !== null ||
    (operation.result !== undefined && operation.result !== null) ||
    (operation.error !== undefined && operation.error !== null);
  return operation.state === "completed" && stored;
}

/** The body bytes of a stored response or a journal result (base64 decoded when it was not UTF-8). */
export function bodyBytes(stored: { readonly body: string; readonly body_encoding: BodyEncoding }): Uint8Array {
  if (stored.body_encoding === "base64") {
    return new Uint8Array(Buffer.from(stored.body, "base64"));
  }
  return new TextEncoder().encode(stored.body);
}

/** The body parsed as JSON. */
export function bodyJson(stored: { readonly body: string; readonly body_encoding: BodyEncoding }): unknown {
  return JSON.parse(new TextDecoder().decode(bodyBytes(stored)));
}

/**
 * One answer through the gateway that is not a gateway problem.
 *
 * `replayed` is true when the gateway answered from its stored receipt and the
 * upstream was not called; `state` is the key's `Idempotency-Status`.
 */
export class GatewayResponse {
  readonly status: number;
  readonly headers: Headers;
  readonly body: Uint8Array;
  readonly key: string | null;
  readonly state: string | null;
  readonly replayed: boolean;
  /**
   * The lookup URL of a completed operation of the same request under another key
   * (`Idempotency-Similar`), when the gateway noted one: this answer may be a second
   * effect of what that operation already did. Null when it noted none.
   */
  readonly similar: string | null;
  /**
   * Who made a replayed receipt (`Idempotency-Receipt-Source`): `upstream` (the tool's own
   * answer), `probe` or `operator`. A probe's or an operator's receipt has their status, not
   * the tool's: a probe's lookup answers 200 where the tool's create answered 201, so read
   * `status` with it. Null for a live answer.
   */
  readonly receiptSource: string | null;

  constructor(status: number, headers: Headers, body: Uint8Array) {
    this.status = status;
    this.headers = headers;
    this.body = body;
    this.key = unquoteKey(headers.get("Idempotency-Key"));
    this.state = headers.get("Idempotency-Status");
    this.replayed = (headers.get("Idempotent-Replayed") ?? "").toLowerCase() === "true";
    this.similar = headers.get("Idempotency-Similar");
    this.receiptSource = headers.get("Idempotency-Receipt-Source");
  }

  /** The body as text (invalid UTF-8 replaced). */
  get text(): string {
    return new TextDecoder().decode(this.body);
  }

  /** The body parsed as JSON. */
  json(): unknown {
    return JSON.parse(this.text);
  }
}

/** An operation document from the gateway, checked where the contract fixes a field. */
export function parseOperation(body: Uint8Array, etag: string | null): Operation {
  let document: unknown;
  try {
    document = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch (error) {
    throw new GatewayClientError(`the gateway's operation is not JSON: ${String(error)}`);
  }
  if (typeof document !== "object" || document === null || Array.isArray(document)) {
    throw new GatewayClientError("the gateway's operation is not a JSON object");
  }
  const record = document as Record<string, unknown>;
  for (const name of ["id", "key", "route", "method", "path", "fingerprint", "created_at", "updated_at"]) {
    if (typeof record[name] !== "string") {
      throw new GatewayClientError(`the gateway's operation has no string ${name}`);
    }
  }
  if (typeof record["state"] !== "string" || !STATES.has(record["state"])) {
    throw new GatewayClientError(`the gateway's operation has an unknown state ${JSON.stringify(record["state"])}`);
  }
  if (typeof record["attempts"] !== "number" || typeof record["safe_to_retry"] !== "boolean") {
    throw new GatewayClientError("the gateway's operation has no attempts or safe_to_retry");
  }
  const response = record["response"];
  if (response !== undefined && response !== null && !isStoredResponse(response)) {
    throw new GatewayClientError("the gateway's operation has a malformed response");
  }
  return {
    ...record,
    expires_at: (record["expires_at"] as string | null | undefined) ?? null,
    forgotten_at: (record["forgotten_at"] as string | null | undefined) ?? null,
    response: (response as StoredResponse | null | undefined) ?? null,
    resolution: (record["resolution"] as Resolution | null | undefined) ?? null,
    evidence: Array.isArray(record["evidence"]) ? (record["evidence"] as Evidence[]) : [],
    etag,
  } as unknown as Operation;
}

function isStoredResponse(value: unknown): value is StoredResponse {
  if (typeof value !== "object" || value === null) {
    return false;
  }
  const response = value as Record<string, unknown>;
  return (
    typeof response["status"] === "number" &&
    typeof response["body"] === "string" &&
    (response["body_encoding"] === "utf-8" || response["body_encoding"] === "base64")
  );
}
