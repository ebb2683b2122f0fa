/**
 * Canonical JSON (RFC 8785, the JSON Canonicalization Scheme) for request bodies.
 *
 * The gateway fingerprints the body bytes, so a retry, from this process or from
 * a Python worker resuming the same journal, must serialize the arguments to the
 * same bytes as the first attempt. RFC 8785 fixes those bytes for every language:
 * object members sorted by UTF-16 code units, no whitespace, strings escaped as
 * little as JSON allows, numbers as ECMAScript prints them (which is why this is
 * `JSON.stringify` with sorted members here, and the `rfc8785` package in Python).
 */

/**
 * The RFC 8785 form of `value`; a TypeError for what JSON cannot hold (NaN, a function, a Map).
 *
 * Every JavaScript number is a double and prints one way, so every number has one
 * canonical form here. (The Python client refuses an integer beyond 2^53 instead:
 * this client could only read it back as the nearest double.)
 */
export function canonicalJson(value: unknown): string {
  return serialize(value, "$");
}

function serialize(value: unknown, where: string): string {
  if (value === null) {
    return "null";
  }
  switch (typeof value) {
    case "boolean":
      return value ? "true" : "false";
    case "string":
      return JSON.stringify(value);
    case "number":
      if (!Number.isFinite(value)) {
        throw new TypeError(`${where}: ${value} has no JSON form`);
      }
      return JSON.stringify(value);
    case "object": {
      if (Array.isArray(value)) {
        return "[" + value.map((item, index) => serialize(item, `${where}[${index}]`)).join(",") + "]";
      }
      const prototype: unknown = Object.getPrototypeOf(value);
      if (prototype !== Object.prototype && prototype !== null) {
        throw new TypeError(`${where}: a ${(value as object).constructor.name} is not plain JSON`);
      }
      const record = value as Record<string, unknown>;
      const members = Object.keys(record)
        .filter((name) => record[name] !== undefined)
        .sort()
        .map((name) => JSON.stringify(name) + ":" + serialize(record[name], `${where}.${name}`));
      return "{" + members.join(",") + "}";
    }
    default:
      throw new TypeError(`${where}: a ${typeof value} is not JSON`);
  }
}
