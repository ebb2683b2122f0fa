/**
 * The journal lock: a short critical section shared by Python and Node writers.
 *
 * Neither language has a lock the other can see without native code (Node has no
 * `flock`), so the lock is made of files both can create atomically. It has
 * generations, `<lock>.<n>`, each a record `{"host", "pid", "nonce", "at"}`
 * hard-linked into place from a fully written staging file
 * `<lock>-staging.<pid>.<nonce>` (so it appears whole or not at all, and `link`
 * refuses a name that exists). The highest generation decides: the lock is free
 * when there is none, when it is released (a marker `<lock>.<n>.released` beside
 * it), or when its holder is dead; otherwise its holder holds the lock. A
 * `FileJournal`'s lock is `.<journal>.lock`, hidden beside the journal, so its files
 * are too. The three kinds of name end differently (a number of at most 15 digits;
 * `released`; a nonce of 16 hex digits), and staging files have a stem of their own:
 * none is taken for another, whatever the journal's name.
 *
 * - To take the lock, a writer links its record to `top + 1` once the highest
 *   generation `top` is free. `link` lets one writer win each generation. The winner
 *   then checks that no higher generation exists (a writer that looked long ago may
 *   have linked a low one); if one does, it withdraws. Then it removes the older
 *   generations.
 * - To release, the holder creates its generation's `.released` marker. It never
 *   removes its own file: the highest generation is never removed, so numbers only
 *   grow and no name is reused, and a verdict about generation `n` ("released",
 *   "dead") can never be taken for one about a newer holder of the same name.
 * - A holder is dead when it is a process of this host that no longer exists, or
 *   when its file holds no lock record. A holder on another host, or this very
 *   process, is never judged dead: after `timeout` the waiter gives up, naming it.
 *
 * The critical section is one read-check-write of the journal (milliseconds); the
 * run's lease and fencing token, checked inside it, stay the guard against a worker
 * that outlives its turn. Writers sharing a journal on one host name must share one
 * process-id namespace. The Python client's `_lock_file.py` is the same protocol,
 * and `docs/journal.md` writes it down.
 */

import { randomBytes } from "node:crypto";
import { link, readdir, readFile, stat, unlink, writeFile } from "node:fs/promises";
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
/** A staging file this old, of a pid that is not alive here, is a crashed writer's leftover. */
const STAGING_SECONDS = 600;

/** A file with no lock record in it: its holder is dead. */
const NO_RECORD = null;

export class LockFile {
  private readonly directory: string;
  private readonly name: string;
  private readonly pattern: RegExp;
  private readonly staging: RegExp;

  /**
   * `path` names the lock, not a file (`.<journal>.lock` for a `FileJournal`): the
   * generations are `<path>.<n>`.
   */
  constructor(
    readonly path: string,
    readonly timeout: number,
  ) {
    this.directory = dirname(path);
    this.name = basename(path);
    const stem = this.name.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");
    this.pattern = new RegExp(`^${stem}\\.([1-9][0-9]{0,14})$`);
    this.staging = new RegExp(`^${stem}-staging\\.([0-9]+)\\.[^.]+$`);
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
    const staging = join(this.directory, `${this.name}-staging.${process.pid}.${record.nonce}`);
    await writeFile(staging, JSON.stringify(record), { mode: 0o644 });
    const deadline = performance.now() + this.timeout * 1000;
    try {
      for (;;) {
        const seen = await this.generations();
        const top = seen.at(-1) ?? 0;
        const holder = !top || (await exists(this.marker(top))) ? NO_RECORD : await readHolder(this.file(top));
        if (holder === NO_RECORD || isDead(holder)) {
          const mine = top + 1;
          try {
            await link(staging, this.file(mine));
          } catch (error) {
            if ((error as NodeJS.ErrnoException).code === "EEXIST") {
              continue; // another writer won this generation
            }
            throw error;
          }
          try {
            if ((await this.generations()).some((generation) => generation > mine)) {
              await unlink(this.file(mine)).catch(() => undefined); // we looked too long ago
              continue;
            }
            await this.clean(seen);
          } catch (error) {
            await this.release({ generation: mine, record }); // never leave a grant nobody holds
            throw error;
          }
          return { generation: mine, record };
        }
        if (performance.now() > deadline) {
          throw new JournalError(
            `${this.file(top)} stayed locked for ${this.timeout} s by ${describe(holder)}; is that worker ` +
              `stopped (SIGSTOP) or stuck in a write? If it is gone, mark the lock released: touch ` +
              `${this.marker(top)} (never delete the file: generation numbers must only grow)`,
          );
        }
        await sleep(POLL_SECONDS);
      }
    } finally {
      await unlink(staging).catch(() => undefined);
    }
  }

  /** Give the lock up: mark the generation released (its file stays until a newer one). */
  async release(grant: LockGrant): Promise<void> {
    if (!(await exists(this.file(grant.generation)))) {
      return; // a newer generation's winner removed it: nothing is held
    }
    try {
      await writeFile(this.marker(grant.generation), "", { flag: "wx" });
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") {
        throw error;
      }
    }
  }

  private file(generation: number): string {
    return join(this.directory, `${this.name}.${generation}`);
  }

  private marker(generation: number): string {
    return join(this.directory, `${this.name}.${generation}.released`);
  }

  /** Remove older generations, their markers, and staging files of dead writers. */
  private async clean(older: readonly number[]): Promise<void> {
    const gone = (path: string) => unlink(path).catch(() => undefined);
    for (const generation of older) {
      // The marker first: a crash between leaves an old file without one, never a marker
      // that could make a later holder of that number look released.
      await gone(this.marker(generation));
      await gone(this.file(generation));
    }
    const staleBefore = Date.now() - STAGING_SECONDS * 1000;
    for (const entry of await readdir(this.directory)) {
      const pid = this.staging.exec(entry)?.[1];
      if (pid === undefined || processExists(Number(pid))) {
        continue;
      }
      // A staging name has no host: a writer on another host may share this pid number,
      // so only files older than any wait are taken for leftovers.
      const staging = join(this.directory, entry);
      const info = await stat(staging).catch(() => null);
      if (info !== null && info.mtimeMs < staleBefore) {
        await gone(staging);
      }
    }
  }
}

async function exists(path: string): Promise<boolean> {
  try {
    await stat(path);
    return true;
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      return false;
    }
    throw error;
  }
}

/** The record in `path`; null when it holds none (or is gone: a newer generation removed it). */
async function readHolder(path: string): Promise<LockRecord | null> {
  let raw: Buffer;
  try {
    raw = await readFile(path);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code === "ENOENT") {
      return NO_RECORD;
    }
    throw error;
  }
  let value: unknown;
  try {
    // A byte-order mark is kept, and refused by JSON.parse, as Python refuses it.
    value = JSON.parse(new TextDecoder("utf-8", { fatal: true, ignoreBOM: true }).decode(raw));
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

function isDead(holder: LockRecord): boolean {
  if (holder.host !== hostname() || holder.pid === process.pid) {
    return false;
  }
  return !processExists(holder.pid);
}

function describe(holder: LockRecord | null): string {
  return holder === null ? "an unreadable lock" : `pid ${holder.pid} on ${holder.host}`;
}
