/**
 * The journal lock: a short critical section shared by Python and Node writers.
 *
 * Neither language has a lock the other can see without native code (Node has
 * no `flock`), so the lock is a file both can make atomically: a record
 * `{"host", "pid", "nonce", "at"}` written to a temporary file, then hard-linked
 * to `<journal>.lock`. `link` fails when the lock exists, so exactly one writer
 * holds it, and it appears with its whole record or not at all. The holder
 * unlinks it when its read-check-write is done (milliseconds).
 *
 * A writer killed inside the section leaves the lock behind. It is stale when its
 * holder is a process of this host that no longer exists, or when it holds no
 * lock record at all (an empty `.lock` left by client 0.1's `flock`); a waiter
 * breaks a stale lock by renaming it aside and checking that what it moved is the
 * record it judged (if a newer writer's lock was moved instead, it is linked
 * back). A holder on another host is never judged dead: the waiter gives up after
 * `lockTimeout` naming it. The run's lease and fencing token, checked inside the
 * section, stay the guard against a worker that outlives its turn.
 */

import { randomBytes } from "node:crypto";
import { link, readFile, rename, unlink, writeFile } from "node:fs/promises";
import { hostname } from "node:os";
import { basename, dirname, join } from "node:path";

import { sleep } from "./backoff.js";
import { JournalError } from "./errors.js";
import { processExists } from "./lease.js";

/** What a lock file holds: who holds it, and a nonce naming this one grant. */
export interface LockRecord {
  readonly host: string;
  readonly pid: number;
  readonly nonce: string;
  readonly at: number;
}

const POLL_SECONDS = 0.01;

export class LockFile {
  constructor(
    readonly path: string,
    readonly timeout: number,
  ) {}

  /** Wait for the lock, breaking it when its holder is gone; the record that holds it. */
  async acquire(): Promise<LockRecord> {
    const record: LockRecord = {
      host: hostname(),
      pid: process.pid,
      nonce: randomBytes(8).toString("hex"),
      at: Date.now() / 1000,
    };
    const staging = join(dirname(this.path), `.${basename(this.path)}.${record.nonce}`);
    await writeFile(staging, JSON.stringify(record), { mode: 0o644 });
    const deadline = performance.now() + this.timeout * 1000;
    try {
      for (;;) {
        try {
          await link(staging, this.path);
          return record;
        } catch (error) {
          if ((error as NodeJS.ErrnoException).code !== "EEXIST") {
            throw error;
          }
        }
        const held = await readHolder(this.path);
        if (held === null) {
          continue; // released between our link and our read
        }
        if (isStale(held.record)) {
          await this.breakStale(held.raw, record.nonce);
          continue;
        }
        if (performance.now() > deadline) {
          throw new JournalError(
            `${this.path} stayed locked for ${this.timeout} s by ${describe(held.record)}; is a worker ` +
              "stopped (SIGSTOP) in the middle of a write? If that process is gone, delete the file",
          );
        }
        await sleep(POLL_SECONDS);
      }
    } finally {
      await unlink(staging).catch(() => undefined);
    }
  }

  /** Remove the lock if it is still this grant's (a breaker may have judged it stale). */
  async release(record: LockRecord): Promise<void> {
    const held = await readHolder(this.path);
    if (held?.record?.nonce === record.nonce) {
      await unlink(this.path).catch(() => undefined);
    }
  }

  private async breakStale(judged: string, nonce: string): Promise<void> {
    const aside = `${this.path}.stale-${nonce}`;
    try {
      await rename(this.path, aside);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") {
        return; // someone else broke or released it
      }
      throw error;
    }
    const moved = await readFile(aside, "utf-8").catch(() => null);
    if (moved !== judged) {
      // A newer writer's lock was moved, not the stale one: put it back.
      await link(aside, this.path).catch(() => undefined);
    }
    await unlink(aside).catch(() => undefined);
  }
}

async function readHolder(path: string): Promise<{ raw: string; record: LockRecord | null } | null> {
  let raw: string;
  try {
    raw = await readFile(path, "utf-8");
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      return null;
    }
    throw error;
  }
  return { raw, record: parseRecord(raw) };
}

function parseRecord(raw: string): LockRecord | null {
  try {
    const value: unknown = JSON.parse(raw);
    if (typeof value === "object" && value !== null) {
      const record = value as Record<string, unknown>;
      if (
        typeof record["host"] === "string" &&
        typeof record["pid"] === "number" &&
        typeof record["nonce"] === "string" &&
        typeof record["at"] === "number"
      ) {
        return record as unknown as LockRecord;
      }
    }
  } catch {
    // not a lock record
  }
  return null;
}

function isStale(record: LockRecord | null): boolean {
  if (record === null) {
    return true;
  }
  return record.host === hostname() && record.pid !== process.pid && !processExists(record.pid);
}

function describe(record: LockRecord | null): string {
  return record === null ? "an unreadable lock" : `pid ${record.pid} on ${record.host}`;
}
