// The admin API as the console calls it: one session (token and name) per tab.
//
// The admin token travels only as an `Authorization` header (a cookie would ride
// along on another site's requests) and is kept in this tab's sessionStorage; the
// operator's name, when given, goes with every call as `X-Admin-Actor`.

const TOKEN_SLOT = "idempotency-gateway.admin-token";
const ACTOR_SLOT = "idempotency-gateway.admin-actor";

/** A name the gateway records as `admin:<name>`: printable ASCII (it travels as a header). */
export const ACTOR_PATTERN = /^[!-~](?:[ -~]{0,62}[!-~])?$/;

export class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }

  get tooEarly() {
    return this.status === 409 && String(this.problem.type ?? "").endsWith("too-early");
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_SLOT);
}

export function actor() {
  return sessionStorage.getItem(ACTOR_SLOT) || "";
}

export function startSession(newToken, name) {
  sessionStorage.setItem(TOKEN_SLOT, newToken);
  if (name) sessionStorage.setItem(ACTOR_SLOT, name);
  else sessionStorage.removeItem(ACTOR_SLOT);
}

export function endSession() {
  sessionStorage.removeItem(TOKEN_SLOT);
  sessionStorage.removeItem(ACTOR_SLOT);
}

let refused = () => {};

/** What to do when the gateway refuses the token (401): the caller still gets the error. */
export function onRefused(handler) {
  refused = handler;
}

export async function api(path, { method = "GET", body, ifMatch } = {}) {
  const headers = { Authorization: `Bearer ${token()}`, Accept: "application/json" };
  if (actor()) headers["X-Admin-Actor"] = actor();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (ifMatch) headers["If-Match"] = ifMatch;
  const response = await fetch(path, {
    method,
    headers,
    body: body === undefined ? undefined : JSON.stringify(body),
    cache: "no-store",
    credentials: "omit",
  });
  const text = await response.text();
  let document_ = {};
  try {
    document_ = text ? JSON.parse(text) : {};
  } catch {
    document_ = { detail: text };
  }
  if (response.status === 401) {
    refused();
    throw new ApiError(401, document_);
  }
  if (!response.ok) throw new ApiError(response.status, document_);
  return {
    document: document_,
    etag: response.headers.get("ETag"),
    // The server's clock at the answer: "how long ago" is counted from it, not from ours.
    serverNow: Date.parse(response.headers.get("Date") ?? ""),
  };
}

export const operationPath = (id, action = "") =>
  `/admin/operations/${encodeURIComponent(id)}${action ? `/${action}` : ""}`;
