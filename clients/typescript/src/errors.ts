/**
 * Everything this package throws, in one tree (the same tree as the Python client).
 *
 * Gateway answers that are RFC 9457 problems become `GatewayProblem` subclasses
 * chosen by the problem type (the last path segment of the `type` URI); a type
 * this client does not know becomes a plain `GatewayProblem`, so a newer gateway
 * never breaks an older client. Each problem keeps every field the gateway sent,
 * and says what to do next (`nextAction`) when the gateway did.
 *
 *     GatewayClientError
 *     ├── KeyFormatError                 a key part the gateway would refuse
 *     ├── GatewayConnectionError         the gateway could not be reached or its answer was lost
 *     ├── GatewayProblem                 any problem+json answer from the gateway
 *     │   ├── BadRequest (MissingKey, InvalidKey, InvalidRequest, PayloadTooLarge, RequestTimeout)
 *     │   ├── Unauthorized (MissingCredentials), ClientNotAllowed, RoleForbidden
 *     │   ├── NotFound (NoRoute, UnknownKey)
 *     │   ├── MethodNotAllowed
 *     │   ├── KeyConflict (KeyMismatch, InProgress, ReceiptExpired, ReceiptNotRetained, NotResolvable, TooEarly,
 *     │   │   SimilarOperation: the same request under another key;
 *     │   │   KeyMismatchUnsettled extends KeyMismatch: the key's first call, of another request, may have run)
 *     │   ├── OutcomeUnknown (UpstreamTimeout, UpstreamConnectionLost): stop, reconcile, never resend
 *     │   ├── PreconditionFailed
 *     │   ├── QuotaExceeded
 *     │   ├── Unavailable (StoreUnavailable, RouteSaturated, LeaseLost)
 *     │   └── UpstreamUnreachable
 *     ├── ReconciliationRequired         a run's call may or may not have happened: stop
 *     ├── CallUnconfirmed                a call's answer could not be read (MCP); look the key up
 *     └── JournalError (JournalCorrupt, IncompatibleJournal, RunLeased, RunLeaseLost)
 */

import type { Operation } from "./models.js";

/** Base of every error this package throws. */
export class GatewayClientError extends Error {
  override get name(): string {
    return this.constructor.name;
  }
}

/** A key part the gateway would refuse, caught before anything is sent. */
export class KeyFormatError extends GatewayClientError {}

/**
 * The gateway could not be reached, or the connection broke before its answer arrived.
 *
 * With a key this is safe to retry: the gateway finishes what it started and the
 * retry gets the receipt (or `in-progress`, or `outcome-unknown`).
 */
export class GatewayConnectionError extends GatewayClientError {
  key: string | null;
  safeToRetry: boolean;

  constructor(message: string, options: { key?: string | null; cause?: unknown } = {}) {
    super(message, { cause: options.cause });
    this.key = options.key ?? null;
    this.safeToRetry = this.key !== null;
  }
}

/** A problem document as the gateway sends it: every member kept, typed where the contract fixes it. */
export type ProblemDocument = Record<string, unknown>;

/** An RFC 9457 problem answered by the gateway, with every field it carried. */
export class GatewayProblem extends GatewayClientError {
  /** The problem type this class stands for (the last segment of the type URI). */
  static readonly problemType: string = "";

  readonly problem: ProblemDocument;
  readonly status: number;
  readonly title: string;
  readonly detail: string;
  readonly typeUri: string;
  readonly key: string | null;
  /** The key's state when the gateway refused (`in_flight`, `unknown`, ...). */
  readonly state: string | null;
  /** The lookup URL of the operation the key is bound to. */
  readonly operation: string | null;
  /** True: the same request with the same key may be sent again; null: the gateway did not say. */
  readonly safeToRetry: boolean | null;
  /**
   * The one thing to do after a problem of this type, as the gateway says it: `retry`
   * (the same request, same key, after `retryAfter`), `wait` (still at work: ask again
   * later), `reconcile` (look the operation up and settle it; never resend),
   * `fix-request` (the request is wrong; a changed one is a new effect) or `stop`.
   * Null when the body has none (an older gateway): read, never guessed from the type.
   */
  readonly nextAction: string | null;
  /** Seconds from the `Retry-After` header, when the gateway sent one. */
  readonly retryAfter: number | null;

  constructor(problem: ProblemDocument, options: { status: number; retryAfter?: number | null }) {
    const detail = stringOrNull(problem["detail"]) ?? "";
    const title = stringOrNull(problem["title"]) ?? "";
    const typeUri = stringOrNull(problem["type"]) ?? "";
    super(`${options.status} ${kindOf(typeUri)}: ${detail || title}`);
    this.problem = problem;
    this.status = options.status;
    this.title = title;
    this.detail = detail;
    this.typeUri = typeUri;
    this.key = stringOrNull(problem["key"]);
    this.state = stringOrNull(problem["state"]);
    this.operation = stringOrNull(problem["operation"]);
    const safe = problem["safe_to_retry"];
    this.safeToRetry = typeof safe === "boolean" ? safe : null;
    this.nextAction = stringOrNull(problem["next_action"]);
    this.retryAfter = options.retryAfter ?? null;
  }

  /** The problem type as the gateway sent it (also for types this client does not know). */
  get kind(): string {
    return kindOf(this.typeUri) || (this.constructor as typeof GatewayProblem).problemType;
  }
}

/** The problem type of a type URI: its last path segment. */
export function kindOf(typeUri: string): string {
  const trimmed = typeUri.replace(/\/+$/, "");
  return trimmed.slice(trimmed.lastIndexOf("/") + 1);
}

function stringOrNull(value: unknown): string | null {
  return typeof value === "string" ? value : null;
}

export class BadRequest extends GatewayProblem {
  static override readonly problemType: string = "bad-request";
}
export class MissingKey extends BadRequest {
  static override readonly problemType: string = "missing-key";
}
export class InvalidKey extends BadRequest {
  static override readonly problemType: string = "invalid-key";
}
export class InvalidRequest extends BadRequest {
  static override readonly problemType: string = "invalid-request";
}
export class PayloadTooLarge extends BadRequest {
  static override readonly problemType: string = "payload-too-large";
}
/** The request body did not arrive in time; nothing was recorded. */
export class RequestTimeout extends BadRequest {
  static override readonly problemType: string = "request-timeout";
}
export class Unauthorized extends GatewayProblem {
  static override readonly problemType: string = "unauthorized";
}
/** No scope credential was sent, and the gateway does not let callers share one scope. */
export class MissingCredentials extends Unauthorized {
  static override readonly problemType: string = "missing-credentials";
}
/** This client may not use the route (`clients = [...]` on the route). */
export class ClientNotAllowed extends GatewayProblem {
  static override readonly problemType: string = "client-not-allowed";
}
/** A named admin token whose role may not do this (the admin API). */
export class RoleForbidden extends GatewayProblem {
  static override readonly problemType: string = "role-forbidden";
}
export class NotFound extends GatewayProblem {
  static override readonly problemType: string = "not-found";
}
export class NoRoute extends NotFound {
  static override readonly problemType: string = "no-route";
}
export class UnknownKey extends NotFound {
  static override readonly problemType: string = "unknown-key";
}
export class MethodNotAllowed extends GatewayProblem {
  static override readonly problemType: string = "method-not-allowed";
}
/** The key is bound to an operation that forbids forwarding this request. */
export class KeyConflict extends GatewayProblem {}
/** The key was first used with a different request; a new effect needs a new key. */
export class KeyMismatch extends KeyConflict {
  static override readonly problemType: string = "key-mismatch";
}
/**
 * The key was first used with a different request whose call may have happened; reconcile.
 *
 * That first call is still `in_flight` or `unknown`. If both requests meant the same
 * effect, sending this one under a new key could make it twice: settle the key's first
 * call before anything else (`Run` stops with `ReconciliationRequired`, as on an unknown
 * outcome). `instanceof KeyMismatch` is true of it too: test for this class first.
 */
export class KeyMismatchUnsettled extends KeyMismatch {
  static override readonly problemType: string = "key-mismatch-unsettled";
}
/** An attempt with this key is still in flight (thrown once the client's wait is spent). */
export class InProgress extends KeyConflict {
  static override readonly problemType: string = "in-progress";
}
/** The effect happened, but its stored response is gone; never resend. */
export class ReceiptExpired extends KeyConflict {
  static override readonly problemType: string = "receipt-expired";
}
/** The effect happened, but its response was too large to keep; never resend. */
export class ReceiptNotRetained extends KeyConflict {
  static override readonly problemType: string = "receipt-not-retained";
}
/** Only an `unknown` operation can be resolved. */
export class NotResolvable extends KeyConflict {
  static override readonly problemType: string = "not-resolvable";
}
/**
 * A `not_applied` resolve while the tool may still be applying the last send.
 *
 * Releasing the key now would let a retry be sent while the first send may still
 * land: two effects. The operation stays `unknown`. Check the tool again at
 * `allowedAt` (an ISO 8601 time; `retryAfter` is the same instant in seconds from
 * the answer) and resolve then; `lastSendAge` is how long ago, in seconds, the last
 * send was.
 */
export class TooEarly extends KeyConflict {
  static override readonly problemType: string = "too-early";

  /** When a `not_applied` resolve is accepted (ISO 8601), when the gateway said. */
  readonly allowedAt: string | null;
  /** Seconds since the attempt's last send, on the gateway's clocks, when it said. */
  readonly lastSendAge: number | null;

  constructor(problem: ProblemDocument, options: { status: number; retryAfter?: number | null }) {
    super(problem, options);
    this.allowedAt = stringOrNull(problem["allowed_at"]);
    const age = problem["last_send_age"];
    this.lastSendAge = typeof age === "number" && Number.isFinite(age) ? age : null;
  }
}
/**
 * The other key's operation that a `similar-operation` refusal names (its `similar_operation`).
 *
 * The gateway refuses a new key whose request is the same as an operation it already
 * has under another key: most likely the caller lost the key of its first attempt.
 * That operation is the one to settle or to take over.
 */
export interface SimilarTwin {
  readonly key: string;
  /** The twin's state (`in_flight`, `unknown`, `completed`, `released`), as sent. */
  readonly state: string;
  /** The twin's lookup path, `/operations/<percent-encoded key>`. */
  readonly operation: string;
  readonly operationId: string | null;
}

/** The twin a problem's `similar_operation` member names; null when it names none. */
export function similarTwinOf(document: unknown): SimilarTwin | null {
  if (typeof document !== "object" || document === null || Array.isArray(document)) {
    return null;
  }
  const members = document as Record<string, unknown>;
  const key = stringOrNull(members["key"]);
  const state = stringOrNull(members["state"]);
  const operation = stringOrNull(members["operation"]);
  if (key === null || state === null || operation === null) {
    return null;
  }
  return { key, state, operation, operationId: stringOrNull(members["operation_id"]) };
}

/**
 * The gateway refused a new key whose request is the same as another key's operation.
 *
 * Most likely the key of a first attempt was lost. Nothing was sent. `similarOperation`
 * names that other operation (the twin), which is the one to settle; the refused key
 * stays bound to it for the route's `similar_window`, so repeating it gets this same
 * refusal. `Run` stops on a twin whose outcome is `unknown` and otherwise takes the
 * twin's key over.
 */
export class SimilarOperation extends KeyConflict {
  static override readonly problemType: string = "similar-operation";

  readonly similarOperation: SimilarTwin | null;

  constructor(problem: ProblemDocument, options: { status: number; retryAfter?: number | null }) {
    super(problem, options);
    this.similarOperation = similarTwinOf(problem["similar_operation"]);
  }
}
/** The effect may or may not have happened: stop and reconcile; never resend. */
export class OutcomeUnknown extends GatewayProblem {
  static override readonly problemType: string = "outcome-unknown";
}
/** Sent, but no complete answer in time; the key is now `unknown`. */
export class UpstreamTimeout extends OutcomeUnknown {
  static override readonly problemType: string = "upstream-timeout";
}
/** Sent, but the connection broke before a complete answer; the key is now `unknown`. */
export class UpstreamConnectionLost extends OutcomeUnknown {
  static override readonly problemType: string = "upstream-connection-lost";
}
/** The operation changed since the lookup whose ETag was sent. */
export class PreconditionFailed extends GatewayProblem {
  static override readonly problemType: string = "precondition-failed";
}
/** This client is over one of its quotas; nothing was recorded (see `retryAfter`). */
export class QuotaExceeded extends GatewayProblem {
  static override readonly problemType: string = "quota-exceeded";
}
/** Nothing was recorded or forwarded; the same request with the same key may be resent. */
export class Unavailable extends GatewayProblem {}
export class StoreUnavailable extends Unavailable {
  static override readonly problemType: string = "store-unavailable";
}
export class RouteSaturated extends Unavailable {
  static override readonly problemType: string = "route-saturated";
}
export class LeaseLost extends Unavailable {
  static override readonly problemType: string = "lease-lost";
}
/** The upstream could not be reached; nothing was sent and the key is released. */
export class UpstreamUnreachable extends GatewayProblem {
  static override readonly problemType: string = "upstream-unreachable";
}

type ProblemClass = new (
  problem: ProblemDocument,
  options: { status: number; retryAfter?: number | null },
) => GatewayProblem;

/** Problem type -> error class; a type not listed maps to `GatewayProblem` itself. */
export const PROBLEM_CLASSES: ReadonlyMap<string, ProblemClass> = new Map(
  [
    BadRequest,
    MissingKey,
    InvalidKey,
    InvalidRequest,
    PayloadTooLarge,
    RequestTimeout,
    Unauthorized,
    MissingCredentials,
    ClientNotAllowed,
    RoleForbidden,
    NotFound,
    NoRoute,
    UnknownKey,
    MethodNotAllowed,
    KeyMismatch,
    KeyMismatchUnsettled,
    InProgress,
    ReceiptExpired,
    ReceiptNotRetained,
    NotResolvable,
    TooEarly,
    SimilarOperation,
    OutcomeUnknown,
    UpstreamTimeout,
    UpstreamConnectionLost,
    PreconditionFailed,
    QuotaExceeded,
    StoreUnavailable,
    RouteSaturated,
    LeaseLost,
    UpstreamUnreachable,
  ].map((cls) => [cls.problemType, cls] as const),
);

/** The typed problem for a problem document of `kind`. */
export function typedProblem(
  kind: string,
  problem: ProblemDocument,
  options: { status: number; retryAfter?: number | null },
): GatewayProblem {
  const cls = PROBLEM_CLASSES.get(kind) ?? GatewayProblem;
  return new cls(problem, options);
}

/**
 * A run's call may have taken effect, and no receipt says what it returned.
 *
 * The run stops here. Settle the key (a route probe, `GatewayClient.resolve`, or
 * an operator), then resume: the next lookup finds the settled state. `problem`
 * is the gateway's answer when there was one; a `KeyMismatchUnsettled` says the key's
 * first call, of another request, may have happened, and it is that call to settle.
 * When the gateway refused the call as the same request as another key's operation
 * (`SimilarOperation`), `similarOperation` names that twin: settle the twin, not
 * `key`, which was never sent.
 */
export class ReconciliationRequired extends GatewayClientError {
  readonly key: string;
  readonly callId: string;
  readonly operation: Operation | null;
  readonly problem: GatewayProblem | null;
  readonly similarOperation: SimilarTwin | null;

  constructor(
    message: string,
    options: {
      key: string;
      callId: string;
      operation?: Operation | null;
      problem?: GatewayProblem | null;
      similarOperation?: SimilarTwin | null;
    },
  ) {
    super(message, { cause: options.problem ?? undefined });
    this.key = options.key;
    this.callId = options.callId;
    this.operation = options.operation ?? null;
    this.problem = options.problem ?? null;
    this.similarOperation = options.similarOperation ?? null;
  }
}

/**
 * A call may have reached the gateway, and what came back is no answer this client can read.
 *
 * An MCP client raises one error alike for a server's JSON-RPC error answer (which
 * the gateway keeps as the receipt), a timeout and a lost stream; only the gateway
 * knows which it was. `Run` therefore looks the key up at once and records the
 * receipt it finds; it throws this when the gateway has none to give.
 */
export class CallUnconfirmed extends GatewayClientError {
  readonly key: string;
  readonly callId: string;

  constructor(message: string, options: { key: string; callId: string; cause?: unknown }) {
    super(message, { cause: options.cause });
    this.key = options.key;
    this.callId = options.callId;
  }
}

/** The run journal refuses this worker or this run. */
export class JournalError extends GatewayClientError {}
/** The journal exists but cannot be read as a journal. */
export class JournalCorrupt extends JournalError {}
/** The journal was written for another flow version, another run or another format. */
export class IncompatibleJournal extends JournalError {}

/** Another live worker holds the run; this one must not advance it. */
export class RunLeased extends JournalError {
  readonly holder: string;
  readonly token: number;
  readonly expiresAt: number;

  constructor(message: string, options: { holder: string; token: number; expiresAt: number }) {
    super(message);
    this.holder = options.holder;
    this.token = options.token;
    this.expiresAt = options.expiresAt;
  }
}

/** A newer lease (a higher fencing token) took the run over; this worker must stop. */
export class RunLeaseLost extends JournalError {
  readonly holder: string | null;
  readonly token: number | null;

  constructor(message: string, options: { holder: string | null; token: number | null }) {
    super(message);
    this.holder = options.holder;
    this.token = options.token;
  }
}
