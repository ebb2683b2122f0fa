// One operation's page: what an operator needs to decide, as text.
//
// The request that was sent, every event of the history (notes verbatim), where the
// receipt came from, and, while the outcome is open, how long ago the last send was
// and until when the tool may still be working (both from the server's clocks).

import { $, duration, el, localText, readableTime, time } from "./dom.js";

const RECEIPT_SOURCES = {
  upstream: "the upstream's answer",
  probe: "a probe's answer",
  operator: "an operator's statement",
};

const EVENT_LABELS = {
  claimed: "Claimed",
  sent: "Sent upstream",
  answered: "Answered",
  "timed-out": "Timed out",
  "connection-lost": "Connection lost",
  "lease-expired": "Lease expired",
  probe: "Probe",
  resolved: "Resolved",
  released: "Released",
  redacted: "Redacted",
  expired: "Expired",
  truncated: "Truncated",
  "distinct-twin": "Same request, marked distinct",
  "probe-blind": "Probe blind",
  "receipt-attached": "Receipt attached",
  "cancellation-held": "Cancellation held back",
};

/** What changed an operation since `version`: its newest events after it, said briefly
 * ("Resolved by admin:ann"), or null when the history shown does not say. */
export function changedSince(op, version) {
  const newer = (op.history ?? []).filter((event) => event.version > version);
  if (!newer.length) return null;
  return newer
    .slice(-2)
    .map((event) => `${EVENT_LABELS[event.type] ?? event.type}${event.actor ? ` by ${event.actor}` : ""}`)
    .join(", then ");
}

const VERDICTS = {
  applied: "applied: the upstream has the effect",
  not_applied: "not applied: the upstream has no such effect",
  not_applied_too_soon: "not applied, but too soon to release (the tool may still apply the send)",
  inconclusive: "inconclusive",
  superseded: "superseded: about an attempt that is no longer current",
  "not-declared": "not found, but the probe is not declared for this request: check the tool by hand",
  "not-calibrated": "not found, but the probe could not be calibrated for this kind: kept unknown",
  "probe-blind": "not found, but the probe is blind for this kind of request: check the tool by hand",
  "too-many-kinds": "not found, but this kind is past the route's calibrated kinds: check by hand",
  found_not_proof: "found, but the forwarded key may name an earlier effect: check the tool by hand",
};

const OWN_WORDS = [["note", ""], ["reason", "Reason: "]];
const SHOWN_APART = new Set(["seq", "type", "at", "actor", "version", "reconstructed"]);
for (const [name] of OWN_WORDS) SHOWN_APART.add(name).add(`${name}_redacted`);

const GONE = {
  too_large: (request) =>
    `The body (${request.size} bytes) was larger than the route's record_request_max: ` +
    "only its size and digest are kept.",
  unparsed: (request) =>
    `The body (${request.size} bytes, ${request.content_type ?? "no content type"}) is in a ` +
    "format the route's redact_request cannot read: only its size and digest are kept " +
    "(record_raw = true on the route keeps such bodies as sent).",
  redacted: () => "The recorded request was erased by a redaction (see “Redacted” in the history).",
  expired: () => "The recorded request was dropped when its retention ended.",
};

export function renderOperation(op) {
  $("detail-title").textContent = `Operation ${op.key}`;
  renderTiming(op);
  $("probe-box").hidden = !(op.state === "unknown" && op.probe_available === true);
  renderProbeSight(op);
  renderSummary(op);
  renderRequest(op.request);
  $("history").replaceChildren(...historyItems(op.history ?? []));
  $("history-more").hidden = op.history_next === null || op.history_next === undefined;
  renderReceipt(op);
}

// --- timing: only the server's numbers ---------------------------------------------

function renderTiming(op) {
  const box = $("timing");
  const age = op.last_send_age;
  const open = op.state === "unknown" || op.state === "in_flight";
  box.hidden = !open || age === null || age === undefined;
  if (box.hidden) {
    box.replaceChildren();
    return;
  }
  const sent = tickingAge(age);
  if (!op.may_apply_until) {
    box.replaceChildren("Last sent ", sent, " ago.");
    return;
  }
  box.replaceChildren(
    "Last sent ",
    sent,
    " ago; the tool may still be working until ",
    time(op.may_apply_until),
    ". ",
    op.state === "unknown"
      ? "Releasing it (not applied) before then needs force."
      : "The gateway is still waiting for its answer.",
  );
}

// An age that ticks: the server's figure plus the page's monotonic clock since the answer
// came (rule: never the browser's wall clock). Only a new answer from the server changes
// what the box says about the tool; the age alone moves.
let ticker = null;

function tickingAge(serverAge) {
  clearInterval(ticker);
  const since = performance.now();
  const node = el("span", { class: "age", text: duration(serverAge) });
  ticker = setInterval(() => {
    if (!node.isConnected) {
      clearInterval(ticker);
      return;
    }
    node.textContent = duration(serverAge + (performance.now() - since) / 1000);
  }, 1000);
  return node;
}

// --- summary ---------------------------------------------------------------------

function renderSummary(op) {
  const keyLink = el("a", { href: `#/key/${encodeURIComponent(op.key)}`, text: op.key });
  const facts = [
    ["State", el("span", { class: `state ${op.state}`, text: op.state })],
    ["Id", op.id],
    ["Key", keyLink],
    ["Scope", op.scope ?? ""],
    ["Route", op.route],
    ["Request", `${op.method} ${op.path}`],
    ["Forwarded key", op.forwarded_key ?? "none (this route forwards no key)"],
    ["Attempts (sends upstream)", String(op.attempts)],
    ["Fencing token", String(op.fencing_token ?? "")],
    ["Fingerprint", op.fingerprint],
    ["Created", time(op.created_at)],
    ["Updated", time(op.updated_at)],
    ["Safe to retry", op.safe_to_retry ? "yes" : "no"],
  ];
  if (op.state === "in_flight" && op.lease_expires_at) facts.push(["Lease expires", time(op.lease_expires_at)]);
  if (op.expires_at) facts.push(["Receipt kept until", time(op.expires_at)]);
  $("summary").replaceChildren(
    ...facts.flatMap(([name, value]) => [el("dt", { text: name }), el("dd", {}, value)]),
  );
}

// --- the request that was sent -----------------------------------------------------

function renderRequest(request) {
  const box = $("request");
  if (!request) {
    box.replaceChildren(
      el("p", { text: "No request was recorded for this operation (recorded before the gateway kept requests)." }),
    );
    return;
  }
  const facts = [];
  if (request.method) facts.push(["Sent", request.target ? `${request.method} ${request.target}` : request.method]);
  if (request.tool) facts.push(["Tool", request.tool]);
  if (request.content_type !== undefined) facts.push(["Content type", request.content_type ?? "none"]);
  if (request.size !== null && request.size !== undefined) facts.push(["Size", `${request.size} bytes`]);
  if (request.digest) facts.push(["Digest", request.digest]);
  else if (request.sha256) facts.push(["SHA-256", request.sha256]);
  const parts = [];
  if (facts.length) {
    parts.push(el("dl", {}, ...facts.flatMap(([n, v]) => [el("dt", { text: n }), el("dd", { text: v })])));
  }
  if (request.arguments !== null && request.arguments !== undefined) {
    parts.push(el("p", { text: "Arguments" }));
    parts.push(el("pre", { class: "body", id: "request-arguments", text: JSON.stringify(request.arguments, null, 2) }));
  }
  if (request.body !== null && request.body !== undefined) {
    const label = request.body_encoding === "base64" ? "Body (base64: not UTF-8 text)" : "Body";
    parts.push(el("p", { text: label }), el("pre", { class: "body", id: "request-body", text: request.body }));
  } else if (request.body_gone) {
    const explain = GONE[request.body_gone];
    const words = explain ? explain(request) : `The body is not kept (${request.body_gone}).`;
    parts.push(el("p", { class: "gone", id: "request-gone", data: { gone: request.body_gone }, text: words }));
  } else if (!request.tool) {
    parts.push(el("p", { text: "The request had no body." }));
  }
  box.replaceChildren(...parts);
}

// --- history -------------------------------------------------------------------------

/** The events as list items, oldest first: time, what happened, who, details, the note verbatim. */
/** The key's request log: every request that carried it, what it was answered, and the
 * caller's request id to match against the agent's own log. */
export function renderRequests(log) {
  const counts = `${log.total} request${log.total === 1 ? "" : "s"} with this key: ` +
    `${log.replays} answered from the receipt, ${log.refusals} refused`;
  $("requests-summary").textContent = log.omitted
    ? `${counts}. ${log.omitted} in the middle are counted, not listed.`
    : `${counts}.`;
  $("requests").replaceChildren(
    ...log.items.map((line) =>
      el(
        "li",
        { class: `request ${line.outcome}`, data: { seq: String(line.seq) } },
        time(line.at),
        " ",
        el("span", { class: "status", text: String(line.status) }),
        " ",
        el("span", { class: "type", text: REQUEST_OUTCOMES[line.outcome] ?? line.outcome }),
        ...(line.problem ? [" ", el("span", { class: "details", text: line.problem })] : []),
        " ",
        el("code", { class: "request-id", title: "X-Request-Id", text: line.request_id }),
      ),
    ),
  );
}

const REQUEST_OUTCOMES = {
  forwarded: "sent to the tool",
  replayed: "answered from the receipt",
  released: "sent; the tool proved it did nothing",
  in_progress: "refused: still in flight",
  unknown: "outcome unknown",
  mismatch: "refused: another request under this key",
  rejected: "refused",
};

export function historyItems(events) {
  return events.map((event) => {
    const item = el(
      "li",
      { class: `event ${event.type}`, data: { type: event.type, seq: String(event.seq ?? "") } },
      time(event.at),
      " ",
      el("span", { class: "type", text: EVENT_LABELS[event.type] ?? event.type }),
      " ",
      el("span", { class: "actor", text: event.actor ? `by ${event.actor}` : "" }),
    );
    const details = eventDetails(event).map(localText);
    if (details.length) item.append(" ", el("span", { class: "details", text: details.join(" · ") }));
    if (event.reconstructed) {
      item.append(" ", el("span", { class: "mark", title: "rebuilt by the migration from an older record", text: "reconstructed" }));
    }
    item.append(...eventWords(event));
    return item;
  });
}

function attempt(event) {
  return event.attempt === undefined || event.attempt === null ? [] : [`attempt ${event.attempt}`];
}

function eventDetails(event) {
  switch (event.type) {
    case "claimed":
      return [
        event.attempt > 1 ? `the released key started attempt ${event.attempt}` : "the key was bound (attempt 1)",
        ...(event.token !== undefined ? [`fencing token ${event.token}`] : []),
        ...(event.distinct_from ? [`marked distinct from ${event.distinct_from}, the same request`] : []),
      ];
    case "sent":
      return [
        ...attempt(event),
        ...(event.token !== undefined ? [`fencing token ${event.token}`] : []),
        event.forwarded_key ? `forwarded key ${event.forwarded_key}` : "no key forwarded",
        ...(event.body_digest ? [`body ${event.body_digest}`] : []),
        "recorded with the attempt's outcome (the send began after the claim)",
      ];
    case "answered":
      return [
        ...attempt(event),
        ...(event.status !== undefined && event.status !== null ? [`status ${event.status}`] : []),
        ...(event.jsonrpc ? [`JSON-RPC ${event.jsonrpc}`] : []),
      ];
    case "timed-out":
    case "connection-lost":
    case "lease-expired":
      return [...attempt(event), ...(event.detail ? [event.detail] : []), "the outcome is unknown"];
    case "probe":
      return [
        ...attempt(event),
        VERDICTS[event.verdict] ?? `verdict ${event.verdict}`,
        ...(event.status !== undefined && event.status !== null ? [`status ${event.status}`] : []),
        ...probeAsked(event.probe),
        ...(event.detail ? [event.detail] : []),
        ...(event.count > 1
          ? [`${event.count} identical answers, ${readableTime(event.at)} to ${readableTime(event.last_at)}`]
          : []),
      ];
    case "resolved":
      return [
        event.outcome === "applied" ? "applied: the effect exists" : "not applied: the key may be sent again",
        // Who, once: "by admin:ana" already says "as admin".
        ...(event.by && event.actor !== event.by && !event.actor?.startsWith(`${event.by}:`)
          ? [`as ${event.by}`]
          : []),
        ...(event.force ? ["FORCED before the tool's grace ended"] : []),
        ...(event.share_with_owner ? ["note shown to the caller"] : []),
      ];
    case "cancellation-held":
      return [...attempt(event), event.detail ?? "the client's cancellation was held back"];
    case "receipt-attached":
      return [
        `receipt attached: retries get status ${event.status} from now on`,
        ...(event.share_with_owner ? ["note shown to the caller"] : []),
      ];
    case "released":
      return [...attempt(event), ...(event.detail ? [event.detail] : []), "the key may be sent again"];
    case "redacted":
    case "expired":
      return event.erased?.length ? [`erased: ${event.erased.join(", ")}`] : [];
    case "truncated":
      return [`${event.dropped} later probe answers were not recorded`];
    case "distinct-twin":
      return [`${event.operation} was claimed for the same request, marked as a second effect`];
    case "probe-blind":
      return [
        `the probe cannot see ${event.kind}${event.applies_to ? ` (its applies_to: ${event.applies_to})` : ""}`,
        ...(event.calibration?.sample ? [`asked about ${event.calibration.sample}, which completed`] : []),
        ...(event.detail ? [event.detail] : []),
      ];
    default:
      return Object.entries(event)
        .filter(([name]) => !SHOWN_APART.has(name))
        .map(([name, value]) => `${name}: ${typeof value === "string" ? value : JSON.stringify(value)}`);
  }
}

/** What a probe asked and read, as the history keeps it (secrets already redacted). */
function probeAsked(seen) {
  if (!seen || typeof seen !== "object") return [];
  const request = seen.request ?? {};
  const asked = request.tool
    ? `asked ${request.tool} ${JSON.stringify(request.arguments ?? {})}`
    : request.method
      ? `asked ${request.method} ${request.path}`
      : null;
  const result = seen.answer?.result === undefined ? null : `read ${JSON.stringify(seen.answer.result)}`;
  return [asked, result].filter((text) => text !== null);
}

/** A line over the history when the route's probe cannot vouch for this operation: what
 * its "not found" means here, and what to do instead. */
function renderProbeSight(op) {
  const line = $("probe-sight");
  const events = op.history ?? [];
  const blind = events.findLast((event) => event.type === "probe-blind");
  const undeclared = events.findLast((event) => event.type === "probe" && event.verdict === "not-declared");
  let text = "";
  if (op.state === "unknown" && blind) {
    text = `The route's probe is blind for ${blind.kind}: its "not found" releases nothing of this kind ` +
      "until an admin re-enables it (idempotency-gateway probes trust). Check the tool by hand, then resolve.";
  } else if (op.state === "unknown" && undeclared) {
    text = "The route's probe is not declared for this request (applies_to): its \"not found\" releases " +
      "nothing here. Check the tool by hand, then resolve.";
  }
  line.textContent = text;
  line.hidden = text === "";
}

/** An operator's own words (a note, a redaction's reason), verbatim on their own lines, or
 * a mark where a redaction erased them. */
function eventWords(event) {
  return OWN_WORDS.flatMap(([name, label]) => {
    if (event[`${name}_redacted`]) {
      return [
        el("p", { class: `note ${name} redacted` }, el("span", { class: "mark", text: "redacted" }),
          ` the ${name} was erased by a redaction`),
      ];
    }
    if (typeof event[name] !== "string" || !event[name]) return [];
    return [el("p", { class: `note ${name}` }, label ? el("span", { class: "label", text: label }) : null, event[name])];
  });
}

// --- the receipt -------------------------------------------------------------------

function renderReceipt(op) {
  const source = $("receipt-source");
  source.dataset.source = op.receipt_source ?? "";
  source.textContent = op.receipt_source
    ? `Where it came from: ${RECEIPT_SOURCES[op.receipt_source] ?? op.receipt_source}.`
    : "No receipt: nothing has answered for this operation yet.";
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
