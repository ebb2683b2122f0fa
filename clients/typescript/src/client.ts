/**
 * `GatewayClient`: calls through the gateway, lookups and resolutions, over `fetch`.
 *
 * `fetch`'s failures are translated here and nowhere else: a transport failure
 * becomes `GatewayConnectionError`, a gateway problem its typed `GatewayProblem`,
 * each with the original as its `cause`.
 */

import { Backoff, sleep } from "./backoff.js";
import { canonicalJson } from "./canonical.js";
import { GatewayConnectionError, type GatewayProblem, UnknownKey } from "./errors.js";
import { keyHeader, operationPath, validateKey } from "./keys.js";
import { GatewayResponse, type Operation, parseOperation, type StoredResponse } from "./models.js";
import { problemFrom } from "./problems.js";

export interface GatewayClientOptions {
  /** Sent with every request: the scope's credential, usually `Authorization`. */
  readonly headers?: Readonly<Record<string, string>>;
  /** Seconds one exchange may take (default 60). */
  readonly timeout?: number;
  /** Retries of answers that say they are safe to retry (default `new Backoff()`). */
  readonly backoff?: Backoff;
  /** The `fetch` to use (default the global one): a test's, or one with a dispatcher. */
  readonly fetch?: typeof fetch;
}

/**
 * Methods whose requests carry no body, in both clients: `fetch` refuses one, and a planned call
 * must send the same request whichever client sends it.
 */
export const BODILESS_METHODS: ReadonlySet<string> = new Set(["GET", "HEAD"]);

export interface RequestOptions {
  /** The `Idempotency-Key`; null sends the request without one. */
  readonly key: string | null;
  /**
   * Sent as canonical JSON (RFC 8785), with `Content-Type: application/json`. `undefined` or
   * `null` (a planned call's `json: null`): no body and no `Content-Type` (the JSON text `null`
   * is `body: "null"`). A GET or HEAD takes neither `json` nor `body` (a `TypeError`).
   */
  readonly json?: unknown;
  /** Sent as is. */
  readonly body?: string | Uint8Array;
  readonly headers?: Readonly<Record<string, string>>;
  /** Ask the gateway to hold an in-flight answer up to this many seconds (`Prefer: wait=N`). */
  readonly wait?: number;
  readonly backoff?: Backoff;
  readonly signal?: AbortSignal;
}

export interface ResolveOptions {
  /** HTTP operations: the upstream's answer to store as the receipt of an `applied` resolution. */
  readonly response?: Pick<StoredResponse, "status"> & Partial<Pick<StoredResponse, "headers" | "body" | "body_encoding">>;
  /** MCP operations: the tool result to replay (`content`, `structuredContent`, `isError`). */
  readonly result?: Readonly<Record<string, unknown>>;
  readonly note?: string;
  /** The `etag` of the lookup the decision was based on; a changed operation is refused. */
  readonly ifMatch?: string | null;
}

interface Exchange {
  readonly method: string;
  readonly path: string;
  readonly body: string | Uint8Array | null;
  readonly headers: Record<string, string>;
  readonly key: string | null;
  readonly limit: number;
  readonly backoff: Backoff;
  readonly signal?: AbortSignal | undefined;
}

/**
 * A client for agents calling tools through the idempotency gateway.
 *
 * Answers with `safe_to_retry: true` (`in-progress`, `store-unavailable`,
 * `route-saturated`, `lease-lost`, `upstream-unreachable`, `quota-exceeded`) are
 * retried with the same key under `backoff`, honouring `Retry-After`; every other
 * gateway problem is thrown at once as its typed error. Any answer that is not a
 * gateway problem is returned, whatever its status: it is the tool's answer.
 *
 * ```ts
 * const gw = new GatewayClient("http://127.0.0.1:8080", { headers: { Authorization: "Bearer t" } });
 * const response = await gw.request("POST", "/tickets/v1/issues", {
 *   key: deriveKey("run-77", 0, "c1"),
 *   json: { title: "Printer on fire" },
 * });
 * response.status, response.replayed; // 201, false
 * ```
 */
export class GatewayClient {
  readonly baseUrl: string;
  readonly headers: Readonly<Record<string, string>>;
  readonly timeout: number;
  readonly backoff: Backoff;
  private readonly fetch: typeof fetch;

  constructor(baseUrl: string, options: GatewayClientOptions = {}) {
    let url: URL;
    try {
      url = new URL(baseUrl);
    } catch {
      throw new TypeError(`baseUrl must be an http(s) URL, got ${JSON.stringify(baseUrl)}`);
    }
    if ((url.protocol !== "http:" && url.protocol !== "https:") || !url.host) {
      throw new TypeError(`baseUrl must be an http(s) URL, got ${JSON.stringify(baseUrl)}`);
    }
    const timeout = options.timeout ?? 60;
    if (!(timeout > 0)) {
      throw new RangeError(`timeout must be > 0 seconds, got ${timeout}`);
    }
    this.baseUrl = baseUrl.replace(/\/+$/, "");
    this.headers = { "Accept-Encoding": "identity", ...options.headers };
    this.timeout = timeout;
    this.backoff = options.backoff ?? new Backoff();
    this.fetch = options.fetch ?? globalThis.fetch;
  }

  /**
   * Send one request through the gateway with `options.key` as its `Idempotency-Key`.
   *
   * A body on a GET or HEAD is a `TypeError`, thrown before anything is sent (as the Python
   * client refuses it), never a `GatewayConnectionError` to retry.
   */
  async request(method: string, path: string, options: RequestOptions): Promise<GatewayResponse> {
    const json = options.json ?? undefined;
    if (json !== undefined && options.body !== undefined) {
      throw new TypeError("pass json or body, not both");
    }
    const upper = method.toUpperCase();
    if (BODILESS_METHODS.has(upper) && (json !== undefined || options.body !== undefined)) {
      throw new TypeError(`a ${upper} request has no body: pass no json or body`);
    }
    if (options.key !== null && new Headers(options.headers).has("Idempotency-Key")) {
      throw new TypeError("pass the key as options.key, not also as a header");
    }
    // One value per header name, whatever its case: a later value replaces an earlier one.
    const merged = new Headers(this.headers);
    new Headers(options.headers).forEach((value, name) => merged.set(name, value));
    const key = options.key;
    if (key !== null) {
      merged.set("Idempotency-Key", keyHeader(validateKey(key)));
    }
    let body: string | Uint8Array | null = options.body ?? null;
    if (json !== undefined) {
      body = canonicalJson(json);
      if (!merged.has("Content-Type")) {
        merged.set("Content-Type", "application/json");
      }
    }
    const headers = Object.fromEntries(merged);
    let limit = this.timeout;
    if (options.wait !== undefined) {
      if (!(options.wait > 0)) {
        throw new RangeError(`wait must be > 0 seconds, got ${options.wait}`);
      }
      headers["prefer"] = `wait=${options.wait}`;
      limit = Math.max(limit, options.wait + 10);
    }
    return this.exchange({
      method: upper,
      path,
      body,
      headers,
      key,
      limit,
      backoff: options.backoff ?? this.backoff,
      signal: options.signal,
    });
  }

  /** `request("POST", ...)`. */
  async post(path: string, options: RequestOptions): Promise<GatewayResponse> {
    return this.request("POST", path, options);
  }

  /** What the gateway knows about `key` in this scope; null when it has no record (404). */
  async lookup(key: string, options: { signal?: AbortSignal } = {}): Promise<Operation | null> {
    let response: GatewayResponse;
    try {
      response = await this.exchange({
        method: "GET",
        path: operationPath(validateKey(key)),
        body: null,
        headers: { ...this.headers },
        key,
        limit: this.timeout,
        backoff: this.backoff,
        signal: options.signal,
      });
    } catch (error) {
      if (error instanceof UnknownKey) {
        return null;
      }
      throw error;
    }
    return parseOperation(response.body, response.headers.get("ETag"));
  }

  /**
   * Settle an `unknown` operation: `applied` (with the response as its receipt) or `not_applied`.
   *
   * `not_applied` is refused (`TooEarly`, the operation stays `unknown`) while the tool may
   * still be applying the last send: check the tool again at its `allowedAt`.
   *
   * Not retried on a lost answer (a resolution is not idempotent): look the key up instead.
   */
  async resolve(key: string, outcome: "applied" | "not_applied", options: ResolveOptions = {}): Promise<Operation> {
    if (options.response !== undefined && options.result !== undefined) {
      throw new TypeError("pass response (HTTP) or result (MCP), not both");
    }
    const document: Record<string, unknown> = { outcome };
    if (options.result !== undefined) {
      document["result"] = options.result;
    }
    if (options.response !== undefined) {
      document["response"] = options.response;
    }
    if (options.note !== undefined) {
      document["note"] = options.note;
    }
    const headers: Record<string, string> = { ...this.headers, "Content-Type": "application/json" };
    if (options.ifMatch !== undefined && options.ifMatch !== null) {
      headers["If-Match"] = options.ifMatch;
    }
    const answer = await this.exchange({
      method: "POST",
      path: operationPath(validateKey(key)) + "/resolve",
      body: canonicalJson(document),
      headers,
      key: null,
      limit: this.timeout,
      backoff: this.backoff,
    });
    return parseOperation(answer.body, answer.headers.get("ETag"));
  }

  /** Look `key` up until it is no longer `in_flight`, for at most `seconds`; the last lookup. */
  async waitSettled(key: string, seconds: number): Promise<Operation | null> {
    const deadline = performance.now() + seconds * 1000;
    for (let retry = 0; ; retry++) {
      const operation = await this.lookup(key);
      if (operation === null || operation.state !== "in_flight") {
        return operation;
      }
      const delay = Math.min(this.backoff.delay(retry, null), (deadline - performance.now()) / 1000);
      if (delay <= 0) {
        return operation;
      }
      await sleep(delay);
    }
  }

  private async exchange(exchange: Exchange): Promise<GatewayResponse> {
    if (!exchange.path.startsWith("/")) {
      throw new TypeError(`path must start with '/', got ${JSON.stringify(exchange.path)}`);
    }
    let sent = 0;
    let waited = 0;
    for (;;) {
      sent += 1;
      let delay: number | null;
      try {
        const response = await this.send(exchange);
        const problem = problemFrom(response.status, response.headers, response.body);
        if (problem === null) {
          return response;
        }
        delay = retryDelay(problem, exchange.backoff, sent, waited);
        if (delay === null) {
          throw problem;
        }
      } catch (error) {
        if (!(error instanceof GatewayConnectionError) || exchange.signal?.aborted) {
          throw error;
        }
        error.key = exchange.key;
        error.safeToRetry = exchange.key !== null;
        delay = exchange.key !== null ? exchange.backoff.nextDelay(sent, waited, null) : null;
        if (delay === null) {
          throw error;
        }
      }
      await sleep(delay, exchange.signal);
      waited += delay;
    }
  }

  private async send(exchange: Exchange): Promise<GatewayResponse> {
    const url = this.baseUrl + exchange.path;
    const init: RequestInit = {
      method: exchange.method,
      headers: exchange.headers,
      body: exchange.body,
      redirect: "manual",
    };
    // What fetch refuses before sending anything (a body on GET, a method or header it cannot
    // send) throws its TypeError here, outside the catch below: the caller's error, never a lost
    // connection to retry.
    new Request(url, init);
    const signal = bothSignals(AbortSignal.timeout(exchange.limit * 1000), exchange.signal);
    try {
      const answer = await this.fetch(url, { ...init, signal });
      const received = new Uint8Array(await answer.arrayBuffer());
      return new GatewayResponse(answer.status, answer.headers, received);
    } catch (error) {
      if (exchange.signal?.aborted) {
        throw exchange.signal.reason;
      }
      const reason = describe(error);
      throw new GatewayConnectionError(`${exchange.method} ${url}: ${reason}`, { cause: error });
    }
  }
}

/** Aborted when either aborts (`AbortSignal.any` is Node 20.3+; this client runs on every Node 20). */
function bothSignals(limit: AbortSignal, caller: AbortSignal | undefined): AbortSignal {
  if (caller === undefined) {
    return limit;
  }
  const both = new AbortController();
  for (const signal of [limit, caller]) {
    if (signal.aborted) {
      both.abort(signal.reason);
    } else {
      signal.addEventListener("abort", () => both.abort(signal.reason), { once: true });
    }
  }
  return both.signal;
}

/**
 * Safe to repeat, but never repeated by the client: `too-early` asks the person who
 * resolved to check the tool again after `Retry-After` (it may apply the send meanwhile),
 * not to have the same verdict sent for them once the time has come.
 */
const DECIDED_AGAIN: ReadonlySet<string> = new Set(["too-early"]);

function retryDelay(problem: GatewayProblem, backoff: Backoff, sent: number, waited: number): number | null {
  if (problem.safeToRetry !== true || DECIDED_AGAIN.has(problem.kind)) {
    return null;
  }
  return backoff.nextDelay(sent, waited, problem.retryAfter);
}

function describe(error: unknown): string {
  if (error instanceof Error) {
    const cause = error.cause instanceof Error ? `: ${error.cause.message}` : "";
    return `${error.message}${cause}`;
  }
  return String(error);
}
