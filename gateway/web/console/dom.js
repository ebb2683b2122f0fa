// Small DOM and wording helpers for the console: text only, no browser wall clock.
//
// Every value from the API goes in through `textContent` or an attribute, never as
// HTML. Times are the server's instants, shown in the browser's zone (UTC on hover); "how
// long ago" is counted from the server's own answer (its `Date` header or a field it
// computed) plus the page's monotonic clock since, never the browser's wall clock.

export const $ = (id) => document.getElementById(id);

export function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(props)) {
    if (value === undefined || value === null) continue;
    if (name === "text") node.textContent = value;
    else if (name === "class") node.className = value;
    else if (name === "data") Object.assign(node.dataset, value);
    else node.setAttribute(name, value);
  }
  for (const child of children) if (child !== null && child !== undefined) node.append(child);
  return node;
}

export function show(id, message) {
  const node = $(id);
  node.textContent = message || "";
  node.hidden = !message;
}

/** "2026-12-02T06:20:30.123456Z" -> "2026-12-02 06:20:30 UTC": the server's instant, exact to the second. */
export function utcTime(iso) {
  if (!iso) return "";
  const match = /^(\d{4}-\d{2}-\d{2})T(\d{2}:\d{2}:\d{2})(?:\.\d+)?Z$/.exec(iso);
  return match ? `${match[1]} ${match[2]} UTC` : iso;
}

const LOCAL = new Intl.DateTimeFormat("en-CA", {
  year: "numeric",
  month: "2-digit",
  day: "2-digit",
  hour: "2-digit",
  minute: "2-digit",
  second: "2-digit",
  hourCycle: "h23",
  timeZoneName: "short",
});

/** The same instant in the browser's zone, named ("2026-12-02 07:20:30 GMT+1"): an operator
 * reads their own clock; `time()` keeps the UTC form on hover. Converting an instant the
 * server gave is not reading the browser's clock. */
export function readableTime(iso) {
  if (!iso) return "";
  const at = Date.parse(iso);
  if (Number.isNaN(at)) return iso;
  const part = Object.fromEntries(LOCAL.formatToParts(at).map(({ type, value }) => [type, value]));
  return `${part.year}-${part.month}-${part.day} ${part.hour}:${part.minute}:${part.second} ${part.timeZoneName}`;
}

const INSTANT = /\b\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(?:\.\d+)?Z\b/g;

/** The server's words with every instant they name in the browser's zone, as the page shows
 * every other time: one instant is never written two ways on one screen. */
export function localText(text) {
  return String(text).replace(INSTANT, (iso) => readableTime(iso));
}

export function time(iso, text = readableTime(iso)) {
  return iso ? el("time", { datetime: iso, title: utcTime(iso), text }) : "";
}

/** A duration in seconds, in the unit an operator reads at a glance. */
export function duration(seconds) {
  const s = Math.max(0, seconds);
  if (s < 90) return `${Math.round(s)} s`;
  if (s < 90 * 60) return `${Math.round(s / 60)} min`;
  if (s < 36 * 3600) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86400)} d`;
}

/** How long before `serverNow` (ms, from the answer's Date header) `iso` was. */
export function agoOnServer(iso, serverNow) {
  if (!iso || !Number.isFinite(serverNow)) return readableTime(iso);
  return `${duration((serverNow - Date.parse(iso)) / 1000)} ago`;
}
