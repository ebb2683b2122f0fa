/**
 * `FileJournal`: one run's journal as a JSON file, replaced atomically and fsynced.
 *
 * Every write goes to a temporary file in the same directory, is fsynced, renamed
 * over the journal, and the directory is fsynced, so a crash at any instant leaves
 * either the old journal or the new one. Writers serialize on the journal's lock,
 * hidden files `.<journal>.lock.<n>` beside it (`lock-file.ts`, the same protocol as
 * the Python client's), and re-read the journal under it to check their lease before
 * writing. Hidden, so that a runs directory lists its journals and nothing else: the
 * lock's last generation and its marker stay after a run (the highest generation is
 * never removed, see `lock-file.ts`).
 */

import { randomBytes } from "node:crypto";
import { mkdir, open, readFile, rename, unlink } from "node:fs/promises";
import { basename, dirname, join } from "node:path";

import { IncompatibleJournal } from "./errors.js";
import { fence, grant, type JournalStore, released, renewed, type Worker } from "./lease.js";
import { LockFile } from "./lock-file.js";
import { type JournalDocument, now, parseJournal, serializeJournal } from "./records.js";

export interface FileJournalOptions {
  /** Seconds to wait for another writer's lock before giving up (default 10). */
  readonly lockTimeout?: number;
}

/** A `JournalStore` holding one run in one JSON file. */
export class FileJournal implements JournalStore {
  readonly path: string;
  private readonly lock: LockFile;

  constructor(path: string, options: FileJournalOptions = {}) {
    const lockTimeout = options.lockTimeout ?? 10;
    if (!(lockTimeout > 0)) {
      throw new RangeError(`lockTimeout must be > 0 seconds, got ${lockTimeout}`);
    }
    this.path = path;
    this.lock = new LockFile(join(dirname(path), `.${basename(path)}.lock`), lockTimeout);
  }

  toString(): string {
    return `FileJournal(${JSON.stringify(this.path)})`;
  }

  /** The journal in the file, whatever run it holds; null when there is no file. */
  async read(): Promise<JournalDocument | null> {
    let raw: Buffer;
    try {
      raw = await readFile(this.path);
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code === "ENOENT") {
        return null;
      }
      throw error;
    }
    return parseJournal(raw, this.path);
  }

  async load(runId: string): Promise<JournalDocument | null> {
    const document = await this.read();
    if (document !== null && document.run_id !== runId) {
      throw new IncompatibleJournal(
        `${this.path} holds run '${document.run_id}', not '${runId}'; use one journal file per run`,
      );
    }
    return document;
  }

  async acquire(runId: string, flowVersion: string, worker: Worker, duration: number): Promise<JournalDocument> {
    return this.locked(async () => {
      const document = grant(await this.read(), runId, flowVersion, worker, { now: now(), duration });
      await this.replace(document);
      return document;
    });
  }

  async write(document: JournalDocument, duration: number): Promise<JournalDocument> {
    return this.locked(async () => {
      fence(await this.read(), document);
      const stored = renewed(document, { now: now(), duration });
      await this.replace(stored);
      return stored;
    });
  }

  async release(document: JournalDocument): Promise<void> {
    await this.locked(async () => {
      fence(await this.read(), document);
      await this.replace(released(document));
    });
  }

  private async locked<T>(critical: () => Promise<T>): Promise<T> {
    await mkdir(dirname(this.path), { recursive: true });
    const held = await this.lock.acquire();
    try {
      return await critical();
    } finally {
      await this.lock.release(held);
    }
  }

  private async replace(document: JournalDocument): Promise<void> {
    const directory = dirname(this.path);
    const temporary = join(directory, `.${basename(this.path)}.${process.pid}.${randomBytes(4).toString("hex")}.tmp`);
    const file = await open(temporary, "w", 0o644);
    try {
      await file.writeFile(serializeJournal(document), "utf-8");
      await file.sync();
    } finally {
      await file.close();
    }
    try {
      await rename(temporary, this.path);
    } catch (error) {
      await unlink(temporary).catch(() => undefined);
      throw error;
    }
    const handle = await open(directory, "r");
    try {
      await handle.sync();
    } finally {
      await handle.close();
    }
  }
}
