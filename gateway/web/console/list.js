// The list: operations by state (unknown first), a search, or the scopes holding one key.
//
// Its address is `#/?state=&route=&older_than=&q=`; with `q`, the operations whose key,
// id or forwarded key starts with it (every state unless one is picked).

import { api } from "./api.js";
import { $, agoOnServer, el, readableTime, show } from "./dom.js";

const STATES = ["unknown", "in_flight", "completed", "released"];
const STATE_LABELS = {
  unknown: "Unknown",
  in_flight: "In flight",
  completed: "Completed",
  released: "Released",
  all: "All",
};
const PAGE_SIZE = 50;

let overview = { counts: {}, routes: [] };
let listCursor = null;
let lastListHash = "#/";
let shownList = 0; // which list the table holds: an answer for an older one is dropped

/** Where "back to the operations" leads: the last list shown. */
export function listAddress() {
  return lastListHash;
}

export function listQuery(hash = location.hash) {
  const params = new URLSearchParams(hash.replace(/^#\/?\??/, ""));
  const q = params.get("q") || "";
  return {
    state: params.get("state") || (q ? "all" : "unknown"),
    route: params.get("route") || "",
    older_than: params.get("older_than") || "",
    q,
  };
}

export function listHash(query) {
  const params = new URLSearchParams();
  for (const [name, value] of Object.entries(query)) if (value) params.set(name, value);
  return `#/?${params}`;
}

export async function loadOverview() {
  overview = (await api("/admin/overview")).document;
}

/** Who the gateway says the token belongs to: `{name, role, actor}` (name null for the shared token). */
export function signedIn() {
  return overview?.you ?? null;
}

const RANK = { viewer: 0, operator: 1, admin: 2 };

/** Whether the token's role reaches `role`: the page offers only what the gateway would
 * accept (it still decides, and a refusal is shown as any other). */
export function may(role) {
  return (RANK[signedIn()?.role ?? "admin"] ?? 0) >= RANK[role];
}

function renderStates(query) {
  const nav = $("states");
  nav.replaceChildren();
  for (const state of [...STATES, "all"]) {
    const count = state === "all"
      ? Object.values(overview.counts).reduce((a, b) => a + b, 0)
      : overview.counts[state] ?? 0;
    const link = el("a", { href: listHash({ ...query, state }), data: { state } });
    link.append(el("span", { text: STATE_LABELS[state] }));
    // The counts are the whole store's: beside a search's matches they would mislead.
    if (!query.q) link.append(" ", el("span", { class: "count", text: String(count) }));
    if (state === query.state) link.setAttribute("aria-current", "page");
    if (state === "unknown" && count > 0) link.classList.add("attention");
    nav.append(link);
  }
  const select = $("route");
  select.replaceChildren(el("option", { value: "", text: "all routes" }));
  for (const name of overview.routes) select.append(el("option", { value: name, text: name }));
  select.value = query.route;
  $("older-than").value = query.older_than;
}

function openList({ caption = "", filters = true } = {}) {
  lastListHash = location.hash || "#/";
  $("detail").hidden = true;
  $("list").hidden = false;
  show("list-caption", caption);
  $("states").hidden = !filters;
  $("filters").hidden = !filters;
  show("list-error", "");
  show("list-empty", "");
  $("more").hidden = true;
  $("operations").tBodies[0].replaceChildren();
  listCursor = null;
  shownList += 1;
}

export async function showList(query) {
  $("q").value = query.q;
  openList({
    caption: query.q ? `Operations whose key, operation id or forwarded key starts with “${query.q}”.` : "",
  });
  const asked = shownList;
  await loadOverview();
  if (asked !== shownList) return;
  renderStates(query);
  await loadPage(query);
}

function emptyWords(query) {
  if (query.q) return `No operation's key, operation id or forwarded key starts with “${query.q}” here.`;
  if (query.state !== "unknown") return "No operations match.";
  return query.route || query.older_than
    ? "No unknown operation matches these filters: nothing here waits for an operator."
    : "Nothing waits for an operator: no operation's outcome is unknown.";
}

/** The next page of the list shown. */
export function loadMore() {
  return loadPage(listQuery());
}

async function loadPage(query) {
  const params = new URLSearchParams({ limit: String(PAGE_SIZE) });
  if (query.state !== "all") params.set("state", query.state);
  for (const name of ["route", "older_than", "q"]) if (query[name]) params.set(name, query[name]);
  if (listCursor) params.set("cursor", listCursor);
  const asked = shownList;
  let page;
  try {
    page = await api(`/admin/operations?${params}`);
  } catch (error) {
    if (error.status !== 401 && asked === shownList) show("list-error", error.message);
    return;
  }
  if (asked !== shownList) return;
  const items = page.document.items;
  if (query.q && !listCursor && items.length === 1 && !page.document.next_cursor) {
    // One match: it is what was looked for. Replaced, so Back returns before the search.
    location.replace(`#/op/${encodeURIComponent(items[0].id)}`);
    return;
  }
  addRows(items, page.serverNow);
  listCursor = page.document.next_cursor;
  $("more").hidden = !listCursor;
  show("list-empty", $("operations").tBodies[0].rows.length ? "" : emptyWords(query));
}

function addRows(items, serverNow) {
  const body = $("operations").tBodies[0];
  for (const op of items) body.append(operationRow(op, serverNow));
}

function operationRow(op, serverNow) {
  // `data-label` names each cell when a narrow screen stacks a row into a card.
  const cell = (label, props, ...children) => el("td", { ...props, "data-label": label }, ...children);
  const created = op.created_at
    ? el("time", { datetime: op.created_at, title: readableTime(op.created_at), text: agoOnServer(op.created_at, serverNow) })
    : "";
  return el(
    "tr",
    { data: { id: op.id, state: op.state } },
    cell("Key", {}, el("a", { href: `#/op/${encodeURIComponent(op.id)}`, text: op.key })),
    cell("State", {}, el("span", { class: `state ${op.state}`, text: op.state })),
    cell("Route", { text: op.route }),
    cell("Request", { class: "request", text: `${op.method} ${op.path}` }),
    cell("Attempts", { text: String(op.attempts) }),
    cell("Created", {}, created),
    cell("Scope", { class: "scope", text: op.scope ?? "" }),
  );
}

/** A key's operations across scopes: listed when several, else the one's id (or null). */
export async function showKey(key) {
  $("q").value = key;
  const asked = ++shownList;
  let answer;
  try {
    answer = await api(`/admin/operations?${new URLSearchParams({ key, limit: "100" })}`);
  } catch (error) {
    if (error.status !== 401 && asked === shownList) {
      openList({ filters: false });
      show("list-error", error.message);
    }
    return null;
  }
  if (asked !== shownList) return null;
  const items = answer.document.items;
  if (items.length === 1) return items[0].id;
  if (items.length === 0) {
    openList({ caption: `Key “${key}”`, filters: false });
    show("list-empty", `No operation has the key “${key}”, in any scope.`);
    return null;
  }
  openList({
    caption: `The key “${key}” is held in ${items.length} scopes (each a different caller, settled on its own): pick one.`,
    filters: false,
  });
  addRows(items, answer.serverNow);
  return null;
}
