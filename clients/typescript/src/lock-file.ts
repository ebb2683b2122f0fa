/**
 * The journal lock: a short critical section shared by Python and Node writers.
 *
 * Neither language has a lock the other can see without native code (Node has no
 * `flock`), so the lock is made of files both can create atomically. It has
 * generations: the writer holding the lock holds the file `<journal>.lock.<n>` with
 * the highest `n`, a record `{"host", "pid", "nonce", "at"}` hard-linked into place
 * from a fully written temporary file (so it appears whole or not at all, and
 * `link` refuses a name that exists). No such file: the lock is free.
 *
 * - To take the lock, a writer links its record to generation `top + 1`, where
 *   `top` is the highest generation it sees, once `top` is free: none, or held by a
 *   dead holder. `link` lets one writer win each generation. The winner then checks
 *   that no higher generation exists (a writer that looked long ago may have linked
 *   a low one); if one does, it withdraws. Then it removes the older generations.
 * - To release, the holder unlinks its own generation.
 * - A holder is dead when it is a process of this host that no longer exists, or a
 *   process of this one that holds no such grant, or when its file holds no lock
 *   record. A dead holder's generation is never renamed or removed before a newer
 *   one exists, and names grow, so a writer never mistakes a live lock for the stale
 *   one it judged. A holder on another host is never judged dead: after `timeout`
 *   the waiter gives up, naming it.
 *
 * The critical section is one read-check-write of the journal (milliseconds); the
 * run's lease and fencing token, checked inside it, stay the guard against a worker
 * that outlives its turn. Writers sharing a journal on one host name must share one
 * process-id namespace. The Python client's `_lock_file.py` is the same protocol,
 * and `docs/journal.md` writes it down.
 */

import { randomBytes } from "node:crypto";
import { link, readdir, readFile, unlink, writeFile } from "node:fs/promises";
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

/** A grant: the generation held, and its record. */
export interface LockGrant {
  readonly generation: number;
  readonly record: LockRecord;
}

const POLL_SECONDS = 0.01;

/** Nonces of the grants this process holds now (a record of this pid with another is dead). */
const HELD = new Set<string>();

/** A file with no lock record in it: its holder is dead. */
const NO_RECORD = null;

export class LockFile {
  private readonly directory: string;
  private readonly name: string;
  private readonly pattern: RegExp;

  /** `path` is `<journal>.lock`; the generations are `<journal>.lock.<n>`. */
  constructor(
    readonly path: string,
    readonly timeout: number,
  ) {
    this.directory = dirname(path);
    this.name = basename(path);
    this.pattern = new RegExp(`^${this.name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")}\\.([1-9][0-9]{0,14})$`);
  }

  /** The generations on disk, lowest first. */
  async generations(): Promise<number[]> {
    const found: number[] = [];
    for (const entry of await readdir(this.directory)) {
      const match = this.pattern.exec(entry);
      if (match?.[1] !== undefined) {
        found.push(Number(match[1]));
      }
    }
    return found.sort((a, b) => a - b);
  }

  /** Wait for the lock, taking over from a dead holder; the grant that holds it. */
  async acquire(): Promise<LockGrant> {
    const record: LockRecord = {
      host: hostname(),
      pid: process.pid,
      nonce: randomBytes(8).toString("hex"),
      at: Date.now() / 1000,
    };
    const staging = join(this.directory, `.${this.name}.${process.pid}.${record.nonce}`);
    await writeFile(staging, JSON.stringify(record), { mode: 0o644 });
    const deadline = performance.now() + this.timeout * 1000;
    HELD.add(record.nonce); // before the link: a record of ours is never judged dead by us
    try {
      for (;;) {
        const seen = await this.generations();
        const top = seen.at(-1) ?? 0;
        const holder = top ? await readHolder(this.file(top)) : undefined;
        if (top && holder === undefined) {
          continue; // released between the listing and the read
        }
        if (!top || isDead(holder ?? NO_RECORD)) {
          const mine = top + 1;
          try {
            await link(staging, this.file(mine));
          } catch (error) {
            if ((error as NodeJS.ErrnoException).code === "EEXIST") {
              continue; // another writer won this generation
            }
            throw error;
          }
          if ((await this.generations()).some((generation) => generation > mine)) {
            await unlink(this.file(mine)).catch(() => undefined); // we looked too long ago
            continue;
          }
          await Promise.all(seen.map((older) => unlink(this.file(older)).catch(() => undefined)));
          return { generation: mine, record };
        }
        if (performance.now() > deadline) {
          throw new JournalError(
            `${this.file(top)} stayed locked for ${this.timeout} s by ${describe(holder ?? NO_RECORD)}; is a ` +
              "worker stopped (SIGSTOP) in the middle of a write? If that process is gone, delete the file",
          );
        }
        await sleep(POLL_SECONDS);
      }
    } catch (error) {
      HELD.delete(record.nonce);
      throw error;
    } finally {
      await unlink(staging).catch(() => undefined);
    }
  }

  /** Give the lock up. */
  async release(grant: LockGrant): Promise<void> {
    HELD.delete(grant.record.nonce);
    await unlink(this.file(grant.generation)).catch(() => undefined);
  }

  private file(generation: number): string {
    return join(this.directory, `${this.name}.${generation}`);
  }
}

/** The record in `path`; null when it holds none; undefined when there is no file. */
async function readHolder(path: string): Promise<LockRecord | null | undefined> {
  let raw: Buffer;
  try {
    raw = await readFile(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      return undefined;
    }
    throw error;
  }
  let value: unknown;
  try {
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true }).decode(raw));
  } catch {
    return NO_RECORD; // not UTF-8, or not JSON
  }
  if (typeof value !== "object" || value === null || Array.isArray(value)) {
    return NO_RECORD;
  }
  const record = value as Record<string, unknown>;
  const pid = record["pid"];
  const typed =
    typeof record["host"] === "string" &&
    typeof pid === "number" &&
    Number.isInteger(pid) &&
    pid > 0 &&
    pid < 2 ** 31 &&
    typeof record["nonce"] === "string" &&
    typeof record["at"] === "number";
  return typed ? (record as unknown as LockRecord) : NO_RECORD;
}

function isDead(holder: LockRecord | null): boolean {
  if (holder === null) {
    return true;
  }
  if (holder.host !== hostname()) {
    return false;
  }
  if (holder.pid === process.pid) {
    return !HELD.has(holder.nonce);
  }
  return !processExists(holder.pid);
}

function describe(holder: LockRecord | null): string {
  return holder === null ? "an unreadable lock" : `pid ${holder.pid} on ${holder.host}`;
}
