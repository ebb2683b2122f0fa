// The operator console: the admin API in a page, for people settling `unknown` effects.
//
// Rules this file keeps, because upstream content reaches this page:
// - nothing from the API is ever parsed as HTML: every value goes in through
//   `textContent` or an attribute, never `innerHTML` (dom.js);
// - the admin token travels only as an `Authorization` header, never a cookie (api.js);
// - every action sends `If-Match` with the ETag of the version on screen, so two
//   operators cannot settle one operation two ways;
// - the browser's clock is never read: ages and deadlines come from the server;
// - what an action changed (or why it did not) is said at the top of the page.
//
// Addresses (the part after `#`): `/?state=&route=&older_than=&q=` a list or a search,
// `/op/<id>` one operation, `/key/<key>` a key (its operation, or the scopes holding
// it). `op=<id>` and `key=<key>` are accepted as short forms of the last two.

import { ACTOR_PATTERN, actor, api, endSession, onRefused, operationPath, startSession, token } from "./api.js";
import { $, localText, readableTime, show } from "./dom.js";
import { listAddress, listHash, listQuery, loadMore, loadOverview, may, showKey, showList, signedIn } from "./list.js";
import { changedSince, historyItems, renderOperation, renderRequests } from "./operation.js";

// --- what the last action did: at the top of the page -----------------------------

function clearNotices() {
  show("action-result", "");
  show("action-error", "");
  hideForce();
}

function notify(message) {
  clearNotices();
  show("action-result", localText(message));
  toTop("action-result");
}

function warn(message) {
  show("action-result", "");
  show("action-error", localText(message));
  toTop("action-error");
}

function toTop(id) {
  window.scrollTo(0, 0);
  $(id).focus({ preventScroll: true });
}

// --- sign in and out -------------------------------------------------------------

function signOut(message) {
  endSession();
  for (const id of ["list", "detail", "search", "sign-out", "signed-in-as"]) $(id).hidden = true;
  clearNotices();
  $("login").hidden = false;
  show("login-error", message);
  $("token").value = "";
  $("token").focus();
}

async function signIn(event) {
  event.preventDefault();
  const name = $("actor").value.trim();
  if (name && !ACTOR_PATTERN.test(name)) {
    show("login-error", "Your name must be plain ASCII (letters, digits, punctuation), 64 characters at most.");
    return;
  }
  startSession($("token").value.trim(), name);
  $("token").value = "";
  try {
    await loadOverview();
  } catch (error) {
    if (error.status !== 401) signOut(`The gateway could not be asked: ${error.message}`);
    return;
  }
  show("login-error", "");
  await route();
}

function showSignedIn() {
  $("login").hidden = true;
  $("sign-out").hidden = false;
  $("search").hidden = false;
  const you = signedIn();
  if (you?.name) {
    // The token's name and role; the history records its actor (with the typed label, if any).
    $("signed-in-as").textContent = `Signed in as ${you.name} (${you.role}), recorded as “${you.actor}”`;
  } else {
    $("signed-in-as").textContent = actor()
      ? `Signed in as ${actor()}`
      : "Signed in (your actions are recorded as “admin”)";
  }
  $("signed-in-as").hidden = false;
}

// --- one operation ------------------------------------------------------------------

let shown = null; // { op, etag, historyNext }

async function showDetail(id) {
  $("list").hidden = true;
  $("detail").hidden = false;
  await loadDetail(id);
}

async function loadDetail(id) {
  let answer;
  try {
    answer = await api(operationPath(id));
  } catch (error) {
    if (error.status === 401) return;
    $("detail").hidden = true;
    warn(error.status === 404 ? `No operation has the id “${id}”.` : error.message);
    return;
  }
  display(answer);
  await loadRequests(id);
}

async function loadRequests(id) {
  try {
    renderRequests((await api(operationPath(id, "requests"))).document);
  } catch (error) {
    if (error.status !== 401) $("requests-summary").textContent = `The requests could not be read: ${error.message}`;
  }
}

function display(answer) {
  shown = { op: answer.document, etag: answer.etag, historyNext: answer.document.history_next ?? null };
  renderOperation(shown.op);
  renderActions(shown.op);
}

async function moreHistory() {
  const { op, historyNext } = shown;
  const params = new URLSearchParams({ after: String(historyNext), limit: "200" });
  try {
    const page = (await api(`${operationPath(op.id, "history")}?${params}`)).document;
    $("history").append(...historyItems(page.items));
    shown.historyNext = page.next ?? null;
    $("history-more").hidden = shown.historyNext === null;
  } catch (error) {
    if (error.status !== 401) warn(`The history could not be read: ${error.message}`);
  }
}

/** What the form does for this operation: settle an unknown one, attach the receipt an
 * `applied` settlement went without (once: the gateway's `ATTACHABLE`), or nothing. */
function formMode(op) {
  if (op.state === "unknown") return "settle";
  const byPerson = op.resolution?.by === "admin" || op.resolution?.by === "owner";
  return op.state === "completed" && op.response_status === null && byPerson ? "attach" : null;
}

function renderActions(op) {
  const resolve = $("resolve-form");
  resolve.reset();
  $("redact-form").reset();
  $("redact-confirm").hidden = true;
  const mode = formMode(op);
  resolve.hidden = mode === null || !may("operator");
  resolve.dataset.mode = mode ?? "";
  const attach = mode === "attach";
  $("resolve-title").textContent = attach ? "Attach the missing receipt" : "Settle this unknown operation";
  $("settle-intro").hidden = attach;
  $("attach-intro").hidden = !attach;
  $("outcome-fields").hidden = attach;
  $("outcome-fields").disabled = attach;
  $("resolve-submit").textContent = attach ? "Attach receipt" : "Settle";
  const mcp = "result" in op;
  $("http-receipt").hidden = mcp;
  $("mcp-receipt").hidden = !mcp;
  $("receipt-fields").disabled = !attach;
  if (mode !== null) restoreDraft(op.id, mode);
  else dropDraft(op.id);
  $("probe-box").hidden ||= !may("operator");
  $("redact-form").hidden = !may("admin");
  renderReadOnly(mode !== null || op.state === "unknown");
}

/** Say what this token may not do here, rather than offer a button the gateway refuses. */
function renderReadOnly(actionable) {
  const you = signedIn();
  let words = "";
  if (!may("operator")) {
    words = `Your token${you?.name ? ` (${you.name})` : ""} has the role viewer: you can read ` +
      "everything here; settling, probing and attaching need the role operator.";
  } else if (!may("admin") && actionable) {
    words = "Your token has the role operator: a forced release and a redaction need the role admin.";
  }
  show("read-only", words);
}

// --- drafts: what an operator typed survives a probe, a reload and a conflict --------
// Kept in the tab's sessionStorage by operation id, dropped once the operation is settled.

const draftKey = (id) => `idempotency-gateway:draft:${id}`;

function saveDraft() {
  if (!shown) return;
  const draft = {};
  for (const field of $("resolve-form").elements) {
    if (!field.name) continue;
    if (field.type === "radio") {
      if (field.checked) draft[field.name] = field.value;
    } else if (field.type === "checkbox") {
      draft[field.name] = field.checked;
    } else {
      draft[field.name] = field.value;
    }
  }
  sessionStorage.setItem(draftKey(shown.op.id), JSON.stringify(draft));
}

function restoreDraft(id, mode) {
  let draft;
  try {
    draft = JSON.parse(sessionStorage.getItem(draftKey(id)) ?? "null");
  } catch {
    draft = null;
  }
  if (!draft) return;
  for (const field of $("resolve-form").elements) {
    if (!field.name || !(field.name in draft)) continue;
    if (field.type === "radio") field.checked = draft[field.name] === field.value;
    else if (field.type === "checkbox") field.checked = draft[field.name] === true;
    else field.value = String(draft[field.name]);
  }
  if (mode === "settle") $("receipt-fields").disabled = draft.outcome !== "applied";
}

function dropDraft(id) {
  sessionStorage.removeItem(draftKey(id));
}

// --- actions ------------------------------------------------------------------------

function resolveBody(op, outcome = new FormData($("resolve-form")).get("outcome")) {
  const data = new FormData($("resolve-form"));
  const body = {
    outcome,
    note: String(data.get("note")).trim(),
    share_with_owner: data.get("share_with_owner") === "on",
  };
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

function requireText(id, message) {
  const field = $(id);
  if (field.value.trim()) return true;
  warn(message);
  field.focus();
  return false;
}

/** POST an action on the operation shown; on success show the new version and say `message(op)`. */
async function act(action, body, message) {
  const { op, etag } = shown;
  clearNotices();
  try {
    const answer = await api(operationPath(op.id, action), { method: "POST", body, ifMatch: etag });
    display(answer);
    notify(message(shown.op));
  } catch (error) {
    if (error.status === 401) return;
    if (error.tooEarly) {
      tooEarly(op, error.problem);
      return;
    }
    if (error.status === 409 || error.status === 412) {
      // Another operator (or a probe, or the owner) acted first: show what is true now,
      // say who did what (the history knows), and keep what was typed.
      saveDraft();
      const typed = String(new FormData($("resolve-form")).get("note") ?? "").trim();
      await loadDetail(op.id);
      const version = Number(/\.(\d+)"$/.exec(etag ?? "")?.[1] ?? NaN); // the ETag read: "<id>.<version>"
      const what = shown && Number.isFinite(version) ? changedSince(shown.op, version) : null;
      // Still open to the form: it holds the draft again. Settled: the form is gone, the words are not.
      const kept = shown && formMode(shown.op) !== null
        ? " Your draft is kept in the form."
        : typed ? ` Your note was: “${typed}”.` : "";
      warn(
        `Nothing was changed: ${op.key} changed since you read it` +
          `${what ? ` (${what})` : ""}: ${error.message}. It is reloaded: read it again before acting.${kept}`,
      );
      return;
    }
    warn(`Nothing was changed on ${op.key}: ${error.message}`);
  }
}

function settle(event) {
  event.preventDefault();
  if ($("resolve-form").dataset.mode === "attach") {
    attach();
    return;
  }
  // The page checks the form itself (`novalidate`), so that what is missing is said at the top.
  if (!new FormData($("resolve-form")).get("outcome")) {
    warn("Choose what happened first: applied or not applied.");
    return;
  }
  if (!requireText("resolve-note", "A note is required: say what you checked.")) return;
  const body = resolveBody(shown.op);
  if (!receiptSaysEnough(body)) return;
  act("resolve", body, (op) => settledWords(op, body));
}

/** The receipt an `applied` settlement went without: the same fields and checks as an
 * applied settlement's, sent once to `/receipt`. */
function attach() {
  if (!requireText("resolve-note", "A note is required: say where this receipt comes from.")) return;
  const { outcome, ...receipt } = resolveBody(shown.op, "applied");
  if (!receiptSaysEnough({ outcome, ...receipt })) return;
  act("receipt", receipt, (op) =>
    `Attached the receipt to ${op.key}: its retries now get status ${op.response_status} ` +
      "from it. Your note is kept in the history.");
}

/** An applied receipt with an empty body is replayed to every retry for ever: the page sends
 * one only when the operator said the tool's answer really had none (as the CLI's --empty-body). */
function receiptSaysEnough(body) {
  if (body.outcome !== "applied") return true;
  if (body.result) {
    return requireText("result-text", "The tool result text is empty: write what the tool answered.");
  }
  if (body.response.body.trim() || $("receipt-empty").checked) return true;
  warn(
    "The receipt's body is empty: every retry would get an empty answer. Write the body the " +
      "tool answered, or tick \"The tool's answer really had no body\".",
  );
  $("receipt-body").focus();
  return false;
}

function settledWords(op, sent) {
  if (sent.outcome === "applied") {
    return `Settled ${op.key} as applied: it is now ${op.state}, and its retries are answered ` +
      "with the receipt you stored. Note kept in the history.";
  }
  if (op.state !== "released") return `Settled ${op.key}: it is now ${op.state}. Note kept in the history.`;
  return sent.force
    ? `Released ${op.key} with force, before the tool's grace ended: its key may be sent again. ` +
        "The force and your note are kept in the history."
    : `Released ${op.key}: its key may be sent again. Note kept in the history.`;
}

// A not-applied release refused as too early: the server's words and time, then the way
// to force it, which takes two more clicks (offer, then confirm).
let forceAllowedAt = null;

function tooEarly(op, problem) {
  forceAllowedAt = problem.allowed_at ?? null;
  // The instant once: the gateway's words usually name it already.
  const named = forceAllowedAt && String(problem.detail ?? "").includes(forceAllowedAt);
  const when = forceAllowedAt && !named
    ? ` A release without force is accepted from ${readableTime(forceAllowedAt)}.`
    : "";
  const why = String(problem.detail || problem.title || "too early").replace(/\.$/, "");
  // Waiting is not the only way: the route's probe asks the tool now, and its answer settles.
  const probe = op.probe_available === true
    ? " Rather than wait, press Probe now above: if the tool can tell, its answer settles it."
    : "";
  if (!may("admin")) {
    warn(`Not released: ${why}.${when}${probe} A forced release needs the role admin.`);
    return;
  }
  warn(`Not released: ${why}.${when}${probe}`);
  $("force-step").hidden = false;
  $("force-ask").hidden = false;
  $("force-confirm").hidden = true;
}

function hideForce() {
  $("force-step").hidden = true;
  $("force-confirm").hidden = true;
}

function askForce() {
  const until = forceAllowedAt ? ` until ${readableTime(forceAllowedAt)}` : "";
  $("force-question").textContent =
    `Release ${shown.op.key} now, with force? The tool may still be applying the last send${until}; ` +
    "the agent's retry is sent as soon as it comes. The force is recorded in the history.";
  $("force-ask").hidden = true;
  $("force-confirm").hidden = false;
  $("force-confirm-button").focus();
}

function force() {
  if (!requireText("resolve-note", "A note is required: say what you checked.")) return;
  const body = { ...resolveBody(shown.op), outcome: "not_applied", force: true };
  hideForce();
  act("resolve", body, (op) => settledWords(op, body));
}

function askRedact(event) {
  event.preventDefault();
  if (!requireText("redact-reason", "A reason is required: say why the data must go.")) return;
  $("redact-question").textContent =
    `Erase the recorded request body and the receipt's headers and body of ${shown.op.key}? ` +
    "This cannot be undone.";
  $("redact-confirm").hidden = false;
  $("redact-confirm-button").focus();
}

function redact() {
  $("redact-confirm").hidden = true;
  act("redact", { reason: $("redact-reason").value.trim() }, (op) => {
    const last = (op.history ?? []).findLast((event) => event.type === "redacted");
    const erased = last?.erased?.length ? ` (${last.erased.join(" and ")})` : "";
    return `Redacted ${op.key}: the recorded request body and the receipt's headers and body are erased${erased}. ` +
      "The reason is kept in the history.";
  });
}

function probe() {
  act("probe", undefined, (op) => {
    if (op.state === "completed") {
      return `Probed ${op.key}: the upstream has the effect. It is now completed, with the probe's answer as its receipt.`;
    }
    if (op.state === "released") {
      return `Probed ${op.key}: the upstream has no such effect. Released: its key may be sent again.`;
    }
    const last = (op.history ?? []).findLast((event) => event.type === "probe");
    if (last && ["not-declared", "probe-blind", "not-calibrated", "too-many-kinds"].includes(last.verdict)) {
      return `Probed ${op.key}: the probe cannot vouch for this request, so its answer releases nothing; ` +
        `it is still ${op.state}. Check the tool by hand, then resolve.`;
    }
    return `Probed ${op.key}: the answer did not settle it; it is still ${op.state}. The answer is in the history.`;
  });
}

// --- wiring -----------------------------------------------------------------------

function target(hash) {
  let match = hash.match(/^#\/op\/(.+)$/);
  if (match) return { view: "op", id: decodeURIComponent(match[1]) };
  match = hash.match(/^#\/key\/(.+)$/);
  if (match) return { view: "key", key: decodeURIComponent(match[1]) };
  const params = new URLSearchParams(hash.replace(/^#\/?\??/, ""));
  if (params.get("op")) return { view: "op", id: params.get("op") };
  if (params.get("key")) return { view: "key", key: params.get("key") };
  return { view: "list", query: listQuery(hash) };
}

async function route() {
  if (!token()) {
    signOut("");
    return;
  }
  showSignedIn();
  clearNotices();
  try {
    const where = target(location.hash);
    if (where.view === "op") await showDetail(where.id);
    else if (where.view === "key") {
      const id = await showKey(where.key);
      if (id !== null) await showDetail(id);
    }
    else await showList(where.query);
  } catch (error) {
    if (error.status !== 401) warn(error.message);
  }
}

function start() {
  onRefused(() => signOut("The gateway refused this token. Sign in again."));
  $("login-form").addEventListener("submit", signIn);
  $("sign-out").addEventListener("click", () => signOut("Signed out."));
  $("search").addEventListener("submit", (event) => {
    event.preventDefault();
    const q = $("q").value.trim();
    location.hash = q ? listHash({ state: "all", q }) : "#/";
  });
  $("filters").addEventListener("submit", (event) => {
    event.preventDefault();
    const query = listQuery();
    location.hash = listHash({ ...query, route: $("route").value, older_than: $("older-than").value.trim() });
  });
  $("more").addEventListener("click", loadMore);
  $("back").addEventListener("click", (event) => {
    event.preventDefault();
    location.hash = listAddress();
  });
  $("reload").addEventListener("click", () => {
    clearNotices();
    loadDetail(shown.op.id);
  });
  $("history-more").addEventListener("click", moreHistory);
  $("probe-now").addEventListener("click", probe);
  $("resolve-form").addEventListener("input", saveDraft);
  $("resolve-form").addEventListener("change", (event) => {
    saveDraft();
    if (event.target.name !== "outcome") return;
    $("receipt-fields").disabled = event.target.value !== "applied";
    if (event.target.value === "applied") hideForce();
  });
  $("resolve-form").addEventListener("submit", settle);
  $("force-ask").addEventListener("click", askForce);
  $("force-confirm-button").addEventListener("click", force);
  $("force-cancel").addEventListener("click", hideForce);
  $("redact-form").addEventListener("submit", askRedact);
  $("redact-confirm-button").addEventListener("click", redact);
  $("redact-cancel").addEventListener("click", () => {
    $("redact-confirm").hidden = true;
  });
  window.addEventListener("hashchange", route);
  route();
}

start();
