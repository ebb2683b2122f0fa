// The operator console: the admin API in a page, for people settling `unknown` effects.
//
// Rules this file keeps, because upstream content reaches this page:
// - nothing from the API is ever parsed as HTML: every value goes in through
//   `textContent` or an attribute, never `innerHTML`;
// - the admin token travels only as an `Authorization` header (a cookie would ride
//   along on another site's requests) and is kept in this tab's sessionStorage;
// - every action sends `If-Match` with the ETag of the version on screen, so two
//   operators cannot settle one operation two ways.

const TOKEN_SLOT = "idempotency-gateway.admin-token";
const STATES = ["unknown", "in_flight", "completed", "released"];
const STATE_LABELS = {
  unknown: "Unknown",
  in_flight: "In flight",
  completed: "Completed",
  released: "Released",
  all: "All",
};
const PAGE_SIZE = 50;

const $ = (id) => document.getElementById(id);

class ApiError extends Error {
  constructor(status, problem) {
    super(problem.detail || problem.title || `HTTP ${status}`);
    this.status = status;
    this.problem = problem;
  }
}

// --- the admin API ---------------------------------------------------------------

function token() {
  return sessionStorage.getItem(TOKEN_SLOT);
}

async function api(path, { method = "GET", body, ifMatch } = {}) {
  const headers = { Authorization: `Bearer ${token()}`, Accept: "application/json" };
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
    signOut("The gateway refused this token. Sign in again.");
    throw new ApiError(401, document_);
  }
  if (!response.ok) throw new ApiError(response.status, document_);
  return { document: document_, etag: response.headers.get("ETag") };
}

// --- small DOM helpers (text only) -----------------------------------------------

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name === "data") Object.assign(node.dataset, value);
    else node.setAttribute(name, value);
  }
  for (const child of children) node.append(child);
  return node;
}

function show(id, message) {
  const node = $(id);
  node.textContent = message || "";
  node.hidden = !message;
}

function ago(iso) {
  if (!iso) return "";
  const seconds = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (seconds < 90) return `${Math.round(seconds)} s ago`;
  if (seconds < 90 * 60) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 36 * 3600) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

function when(iso) {
  return iso ? el("time", { datetime: iso, title: iso, text: ago(iso) }) : "";
}

// --- sign in and out -------------------------------------------------------------

function signOut(message) {
  sessionStorage.removeItem(TOKEN_SLOT);
  for (const id of ["list", "detail"]) $(id).hidden = true;
  $("sign-out").hidden = true;
  $("login").hidden = false;
  show("login-error", message);
  $("token").value = "";
  $("token").focus();
}

async function signIn(event) {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_SLOT, $("token").value.trim());
  $("token").value = "";
  try {
    await loadOverview();
  } catch (error) {
    if (error.status !== 401) signOut(`The gateway could not be asked: ${error.message}`);
    return;
  }
  show("login-error", "");
  $("login").hidden = true;
  $("sign-out").hidden = false;
  await route();
}

// --- the list: operations by state, unknown first --------------------------------

let overview = { counts: {}, routes: [] };
let listCursor = null;

function listQuery() {
  const params = new URLSearchParams(location.hash.replace(/^#\/?\??/, ""));
  return {
    state: params.get("state") || "unknown",
    route: params.get("route") || "",
    older_than: params.get("older_than") || "",
  };
}

function listHash(query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) if (value) params.set(name, value);
  return `#/?${params}`;
}

async function loadOverview() {
  overview = (await api("/admin/overview")).document;
}

function renderStates(current) {
  const nav = $("states");
  nav.replaceChildren();
  const query = listQuery();
  for (const state of [...STATES, "all"]) {
    const count = state === "all"
      ? Object.values(overview.counts).reduce((a, b) => a + b, 0)
      : overview.counts[state] ?? 0;
    const link = el("a", { href: listHash({ ...query, state }), data: { state } });
    link.append(el("span", { text: STATE_LABELS[state] }), " ", el("span", { class: "count", text: String(count) }));
    if (state === current) link.setAttribute("aria-current", "page");
    if (state === "unknown" && count > 0) link.classList.add("attention");
    nav.append(link);
  }
  const select = $("route");
  const chosen = query.route;
  select.replaceChildren(el("option", { value: "", text: "all routes" }));
  for (const name of overview.routes) select.append(el("option", { value: name, text: name }));
  select.value = chosen;
  $("older-than").value = query.older_than;
}

let lastListHash = "#/";

async function showList() {
  const query = listQuery();
  lastListHash = location.hash || "#/";
  $("detail").hidden = true;
  $("list").hidden = false;
  show("list-error", "");
  await loadOverview();
  renderStates(query.state);
  $("operations").tBodies[0].replaceChildren();
  listCursor = null;
  await loadPage(query);
}

async function loadPage(query) {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (query.state !== "all") params.set("state", query.state);
  if (query.route) params.set("route", query.route);
  if (query.older_than) params.set("older_than", query.older_than);
  if (listCursor) params.set("cursor", listCursor);
  let page;
  try {
    page = (await api(`/admin/operations?${params}`)).document;
  } catch (error) {
    if (error.status !== 401) show("list-error", error.message);
    return;
  }
  const body = $("operations").tBodies[0];
  for (const op of page.items) body.append(operationRow(op));
  listCursor = page.next_cursor;
  $("more").hidden = !listCursor;
  $("list-empty").hidden = body.rows.length > 0;
}

function operationRow(op) {
  const link = el("a", { href: `#/op/${encodeURIComponent(op.id)}`, text: op.key });
  return el(
    "tr",
    { data: { id: op.id, state: op.state } },
    el("td", {}, link),
    el("td", {}, el("span", { class: `state ${op.state}`, text: op.state })),
    el("td", { text: op.route }),
    el("td", { class: "request", text: `${op.method} ${op.path}` }),
    el("td", { text: String(op.attempts) }),
    el("td", {}, when(op.created_at)),
    el("td", { class: "scope", text: op.scope ?? "" }),
  );
}

// --- one operation's story --------------------------------------------------------

let shown = null; // { op, etag }

async function showDetail(id) {
  $("list").hidden = true;
  $("detail").hidden = false;
  for (const slot of ["action-error", "action-result"]) show(slot, "");
  await loadDetail(id);
}

async function loadDetail(id) {
  let answer;
  try {
    answer = await api(`/admin/operations/${encodeURIComponent(id)}`);
  } catch (error) {
    if (error.status !== 401) show("action-error", error.message);
    return;
  }
  shown = { op: answer.document, etag: answer.etag };
  renderDetail(shown.op);
}

function renderDetail(op) {
  $("detail-title").textContent = `Operation ${op.key}`;
  const facts = [
    ["State", el("span", { class: `state ${op.state}`, text: op.state })],
    ["Id", op.id],
    ["Key", op.key],
    ["Scope", op.scope ?? ""],
    ["Route", op.route],
    ["Request", `${op.method} ${op.path}`],
    ["Forwarded key", op.forwarded_key ?? "none (this route forwards no key)"],
    ["Attempts (sends upstream)", String(op.attempts)],
    ["Fencing token", String(op.fencing_token)],
    ["Fingerprint", op.fingerprint],
    ["Created", op.created_at ?? ""],
    ["Updated", op.updated_at ?? ""],
    ["Safe to retry", op.safe_to_retry ? "yes" : "no"],
  ];
  if (op.state === "in_flight" && op.lease_expires_at) facts.push(["Lease expires", op.lease_expires_at]);
  if (op.expires_at) facts.push(["Receipt kept until", op.expires_at]);
  $("summary").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", {}, value)]),
  );
  $("timeline").replaceChildren(...timeline(op));
  renderReceipt(op);
  renderActions(op);
}

function timeline(op) {
  const events = [
    {
      at: op.created_at,
      kind: "claim",
      text: `Claimed: the key and the request's fingerprint were recorded before anything was sent (${op.method} ${op.path}).`,
    },
  ];
  for (const item of op.evidence) {
    const parts = [`${item.source}: ${item.detail}`];
    if (item.status !== null && item.status !== undefined) parts.push(`status ${item.status}`);
    if (item.body_sha256) parts.push(`body sha256 ${item.body_sha256}`);
    events.push({ at: item.at, kind: `evidence ${item.source}`, text: parts.join(" · ") });
  }
  if (op.resolution) {
    const note = op.resolution.note ? `: ${op.resolution.note}` : "";
    events.push({ at: op.resolution.at, kind: "resolution", text: `Settled by ${op.resolution.by}${note}` });
  }
  events.sort((a, b) => (a.at ?? "").localeCompare(b.at ?? ""));
  events.push({
    at: op.updated_at,
    kind: "now",
    text: `Now ${op.state} after ${op.attempts} send(s) upstream.`,
  });
  return events.map((event) =>
    el(
      "li",
      { class: event.kind },
      el("time", { datetime: event.at ?? "", text: event.at ?? "" }),
      " ",
      el("span", { class: "event", text: event.text }),
    ),
  );
}

function renderReceipt(op) {
  const box = $("receipt");
  box.replaceChildren();
  if ("result" in op) {
    // An MCP operation: the tool result, shown as JSON text.
    if (op.result === null) box.append(el("p", { text: "No tool result is stored." }));
    else box.append(el("pre", { class: "body", text: JSON.stringify(op.result, null, 2) }));
    return;
  }
  const response = op.response;
  if (!response) {
    const why = op.response_status
      ? `Status ${op.response_status}; the body is not retained.`
      : "No response is stored.";
    box.append(el("p", { text: why }));
    return;
  }
  box.append(el("p", { class: "status", text: `Status ${response.status}` }));
  const headers = el("table", { class: "headers" });
  for (const [name, value] of Object.entries(response.headers)) {
    headers.append(el("tr", {}, el("th", { text: name }), el("td", { text: value })));
  }
  box.append(headers);
  const label = response.body_encoding === "base64" ? "Body (base64)" : "Body";
  box.append(el("p", { text: label }), el("pre", { class: "body", text: response.body }));
}

function renderActions(op) {
  const resolve = $("resolve-form");
  const redact = $("redact-form");
  resolve.reset();
  redact.reset();
  resolve.hidden = op.state !== "unknown";
  redact.hidden = !(op.state === "completed" && (op.response || op.result));
  const mcp = "result" in op;
  $("http-receipt").hidden = mcp;
  $("mcp-receipt").hidden = !mcp;
  $("receipt-fields").disabled = true;
}

function resolveBody(form, op) {
  const data = new FormData(form);
  const outcome = data.get("outcome");
  const body = { outcome, note: String(data.get("note")).trim() };
  if (outcome !== "applied") return body;
  if ("result" in op) {
    body.result = { content: [{ type: "text", text: String(data.get("result_text")) }], isError: false };
  } else {
    const headers = {};
    const contentType = String(data.get("content_type")).trim();
    if (contentType) headers["content-type"] = contentType;
    body.response = { status: Number(data.get("status")), headers, body: String(data.get("body")) };
  }
  return body;
}

async function act(event, action) {
  event.preventDefault();
  const form = event.currentTarget;
  const note = form.querySelector("textarea[required]");
  if (!note.value.trim()) {
    show("action-error", "A note is required: say what you checked.");
    note.focus();
    return;
  }
  show("action-error", "");
  show("action-result", "");
  const { op, etag } = shown;
  const path = `/admin/operations/${encodeURIComponent(op.id)}/${action}`;
  const body = action === "resolve" ? resolveBody(form, op) : { reason: note.value.trim() };
  try {
    const answer = await api(path, { method: "POST", body, ifMatch: etag });
    shown = { op: answer.document, etag: answer.etag };
    renderDetail(shown.op);
    show("action-result", action === "resolve" ? `Settled: now ${shown.op.state}.` : "The receipt was erased.");
  } catch (error) {
    if (error.status === 401) return;
    if (error.status === 409 || error.status === 412) {
      // Another operator (or a probe, or the owner) acted first: show what is true now.
      await loadDetail(op.id);
      show(
        "action-error",
        `Someone changed this operation since you read it (${error.message}). ` +
          "It is reloaded: read it again before acting.",
      );
      return;
    }
    show("action-error", error.message);
  }
}

// --- wiring -----------------------------------------------------------------------

async function route() {
  if (!token()) {
    signOut("");
    return;
  }
  $("login").hidden = true;
  $("sign-out").hidden = false;
  const match = location.hash.match(/^#\/op\/(.+)$/);
  try {
    if (match) await showDetail(decodeURIComponent(match[1]));
    else await showList();
  } catch (error) {
    if (error.status !== 401) show("list-error", error.message);
  }
}

function start() {
  $("login-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut("Signed out."));
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = listQuery();
    location.hash = listHash({ ...query, route: $("route").value, older_than: $("older-than").value.trim() });
  });
  $("more").addEventListener("click", () => loadPage(listQuery()));
  $("back").addEventListener("click", (event) => {
    event.preventDefault();
    location.hash = lastListHash;
  });
  $("resolve-form").addEventListener("change", (event) => {
    if (event.target.name === "outcome") $("receipt-fields").disabled = event.target.value !== "applied";
  });
  $("resolve-form").addEventListener("submit", (event) => act(event, "resolve"));
  $("redact-form").addEventListener("submit", (event) => act(event, "redact"));
  window.addEventListener("hashchange", route);
  route();
}

start();
