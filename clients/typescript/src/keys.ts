/**
 * One stable key per effect: `runId:turn:callId`.
 *
 * A key names an effect, not an attempt: every retry of the same tool call, in
 * this process or after a restart, must send the same key, or the gateway sees a
 * new effect. So the key is derived from what the journal already holds (the run
 * id, the turn number, the model's call id) and never from a clock or a random
 * number. The rules are the Python client's, checked by the shared vectors in
 * `clients/vectors/keys.json`.
 */

import { KeyFormatError } from "./errors.js";

/** The gateway's limit, in characters (keys are ASCII, so also bytes). */
export const MAX_KEY_LENGTH = 255;

/** `key` if the gateway would accept it: 1 to 255 printable ASCII characters, no space at either end. */
export function validateKey(key: string): string {
  if (typeof key !== "string" || key.length === 0) {
    throw new KeyFormatError("an idempotency key may not be empty");
  }
  for (let position = 0; position < key.length; position++) {
    const code = key.charCodeAt(position);
    if (code < 0x20 || code > 0x7e) {
      throw new KeyFormatError(
        `an idempotency key is printable ASCII; ${JSON.stringify(key[position])} at position ${position} is not`,
      );
    }
  }
  if (key.length > MAX_KEY_LENGTH) {
    throw new KeyFormatError(
      `an idempotency key is at most ${MAX_KEY_LENGTH} characters; this one has ${key.length}`,
    );
  }
  if (key.startsWith(" ") || key.endsWith(" ")) {
    // HTTP strips a header value's outer whitespace: the gateway refuses such a key
    // rather than name one effect by two spellings.
    throw new KeyFormatError(
      "an idempotency key may not start or end with a space: HTTP strips it from the header, " +
        "so the gateway refuses such a key",
    );
  }
  return key;
}

/**
 * The key of one tool call: `runId:turn:callId`, the same on every retry.
 *
 * `runId` may not contain `:` (so two different triples never give the same key);
 * `callId` is the model's id for the call (`call_abc`, `toolu_01...`).
 */
export function deriveKey(runId: string, turn: number, callId: string): string {
  if (typeof runId !== "string" || runId.length === 0) {
    throw new KeyFormatError("runId may not be empty");
  }
  if (runId.includes(":")) {
    throw new KeyFormatError(`runId may not contain ':' (got ${JSON.stringify(runId)}); it separates the parts`);
  }
  if (typeof turn !== "number" || !Number.isSafeInteger(turn) || turn < 0) {
    throw new KeyFormatError(`turn must be an integer >= 0, got ${String(turn)}`);
  }
  if (typeof callId !== "string" || callId.length === 0) {
    throw new KeyFormatError("callId may not be empty");
  }
  return validateKey(`${runId}:${turn}:${callId}`);
}

/** The lookup path of a key: `/operations/` and the key as one percent-encoded segment. */
export function operationPath(key: string): string {
  return "/operations/" + percentEncode(key);
}

/** Every byte but the unreserved ones percent-encoded, as Python's `quote(key, safe="")`. */
function percentEncode(key: string): string {
  return encodeURIComponent(key).replace(
    /[!'()*]/g,
    (char) => "%" + char.charCodeAt(0).toString(16).toUpperCase(),
  );
}

/**
 * The `Idempotency-Key` value that the gateway reads back as exactly `key`.
 *
 * Bare, as most clients send it, unless the bare form would read as another key
 * (a leading `"`, or a space or tab at either end): then a Structured Field string.
 */
export function keyHeader(key: string): string {
  if (!key.startsWith('"') && key.replace(/^[ \t]+|[ \t]+$/g, "") === key) {
    return key;
  }
  return '"' + key.replace(/\\/g, "\\\\").replace(/"/g, '\\"') + '"';
}

/** The key from a response's `Idempotency-Key` (a Structured Field string when quoted). */
export function unquoteKey(value: string | null): string | null {
  if (value === null || value.length < 2 || !(value.startsWith('"') && value.endsWith('"'))) {
    return value;
  }
  let out = "";
  let escaped = false;
  for (const char of value.slice(1, -1)) {
    if (char === "\\" && !escaped) {
      escaped = true;
      continue;
    }
    out += char;
    escaped = false;
  }
  return out;
}
