/**
 * Telling a gateway problem from an upstream answer, and turning it into an error.
 *
 * An upstream may answer `application/problem+json` too; only a problem whose
 * `type` URI is under the gateway's base is the gateway's own. A replayed receipt
 * is never a gateway problem, whatever its body.
 */

import { parseRetryAfter } from "./backoff.js";
import { type GatewayProblem, typedProblem } from "./errors.js";

export const PROBLEM_BASE_URI = "https://idempotency-gateway.dev/problems/";
export const PROBLEM_JSON = "application/problem+json";

/** What `problemFrom` needs of an answer's headers (a `Headers`, or a plain lookup). */
export interface HeaderLookup {
  get(name: string): string | null;
}

/** The typed error for a gateway problem answer, or null for any other answer. */
export function problemFrom(status: number, headers: HeaderLookup, body: Uint8Array): GatewayProblem | null {
  if ((headers.get("Idempotent-Replayed") ?? "").toLowerCase() === "true") {
    return null;
  }
  const contentType = (headers.get("Content-Type") ?? "").split(";", 1)[0]?.trim().toLowerCase();
  if (contentType !== PROBLEM_JSON) {
    return null;
  }
  const document = jsonObject(body);
  if (document === null) {
    return null;
  }
  const typeUri = document["type"];
  if (typeof typeUri !== "string" || !typeUri.startsWith(PROBLEM_BASE_URI)) {
    return null;
  }
  const kind = typeUri.slice(PROBLEM_BASE_URI.length).replace(/^\/+|\/+$/g, "");
  return typedProblem(kind, document, {
    status,
    retryAfter: parseRetryAfter(headers.get("Retry-After")),
  });
}

function jsonObject(body: Uint8Array): Record<string, unknown> | null {
  let document: unknown;
  try {
    document = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(body));
  } catch {
    return null;
  }
  return typeof document === "object" && document !== null && !Array.isArray(document)
    ? (document as Record<string, unknown>)
    : null;
}
