/**
 * The `JournalStore` interface and the lease rules every store applies the same way.
 *
 * A store decides nothing about leases itself: inside its own critical section
 * (the journal's lock file) it reads the current document and calls `grant` (to
 * take the run) or `fence` (before any write), which throw when the caller may
 * not proceed. The rules are the Python client's, so a run leased by a Python
 * worker refuses a Node worker, and the other way round.
 */

import { readFileSync } from "node:fs";
import { hostname } from "node:os";

import { IncompatibleJournal, RunLeased, RunLeaseLost } from "./errors.js";
import { type JournalDocument, newDocument, type RunLease } from "./records.js";

/** Who asks for a run's lease: a name for messages, and the process that holds it. */
export interface Worker {
  readonly name: string;
  readonly host: string;
  readonly pid: number;
}

/** This process; `name` defaults to `host:pid`. */
export function currentWorker(name?: string | null): Worker {
  const host = hostname();
  return { name: name || `${host}:${process.pid}`, host, pid: process.pid };
}

/**
 * Durable storage for run journals, shared by every worker that may run a run.
 *
 * An implementation must guarantee:
 *
 * - `write` is atomic and durable when it resolves: after a crash, the store
 *   holds the previous document or the new one, never a mix, never neither;
 * - `acquire`, `write` and `release` each read the current document and apply
 *   `grant` or `fence` to it in the same critical section as their write, so no
 *   two workers (of either language) can both pass the check;
 * - `acquire` refuses with `RunLeased` while another live worker holds the run,
 *   refuses with `IncompatibleJournal` a run of another flow version, and
 *   otherwise grants a fencing token larger than any granted before.
 */
export interface JournalStore {
  /** The run's document as last written, or null when the run was never started. */
  load(runId: string): Promise<JournalDocument | null>;
  /** Take the run's lease for `duration` seconds (creating the run when it is new). */
  acquire(runId: string, flowVersion: string, worker: Worker, duration: number): Promise<JournalDocument>;
  /** Store `document` if its lease is still current, renewing it; what was stored. */
  write(document: JournalDocument, duration: number): Promise<JournalDocument>;
  /** Let the lease expire now (the token is kept, so the next grant is larger). */
  release(document: JournalDocument): Promise<void>;
}

/** A Unix time in seconds as an ISO 8601 UTC string to the second (for messages). */
export function iso(seconds: number): string {
  return new Date(Math.floor(seconds) * 1000).toISOString().replace(".000Z", "Z");
}

/** Refuse a journal of another run or another flow version, before touching it. */
export function checkCompatible(document: JournalDocument, runId: string, flowVersion: string): void {
  if (document.run_id !== runId) {
    throw new IncompatibleJournal(
      `this journal holds run '${document.run_id}', not '${runId}'; use one journal (file or row) per run`,
    );
  }
  if (document.flow_version !== flowVersion) {
    throw new IncompatibleJournal(
      `run '${runId}' was written by flow version '${document.flow_version}'; this worker runs flow ` +
        `version '${flowVersion}' and will not resume it. Resume it with flow version ` +
        `'${document.flow_version}', or start a new run`,
    );
  }
}

/** The document with `worker` holding the run, or `RunLeased` naming the live holder. */
export function grant(
  existing: JournalDocument | null,
  runId: string,
  flowVersion: string,
  worker: Worker,
  options: { now: number; duration: number },
): JournalDocument {
  const document = existing ?? newDocument(runId, flowVersion, options.now);
  checkCompatible(document, runId, flowVersion);
  const current = document.lease;
  if (current !== null && isLive(current, options.now)) {
    throw new RunLeased(
      `run '${runId}' is held by worker '${current.holder}' (pid ${current.pid} on ${current.host}, ` +
        `fencing token ${current.token}) until ${iso(current.expires_at)}; only one worker may advance ` +
        "a run. Wait for it to finish or for its lease to expire",
      { holder: current.holder, token: current.token, expiresAt: current.expires_at },
    );
  }
  const lease: RunLease = {
    holder: worker.name,
    token: (current?.token ?? 0) + 1,
    expires_at: options.now + options.duration,
    host: worker.host,
    pid: worker.pid,
  };
  return { ...document, lease };
}

/** Throw `RunLeaseLost` unless the stored lease is still the writer's (holder and token). */
export function fence(current: JournalDocument | null, mine: JournalDocument): void {
  const ours = mine.lease;
  if (ours === null) {
    throw new RunLeaseLost(`run '${mine.run_id}': a write without a lease`, { holder: null, token: null });
  }
  const stored = current?.lease ?? null;
  if (stored === null || stored.holder !== ours.holder || stored.token !== ours.token) {
    throw new RunLeaseLost(
      `run '${mine.run_id}' was taken over by worker ${stored ? `'${stored.holder}'` : "None"} (fencing ` +
        `token ${stored ? stored.token : "None"}); this worker ('${ours.holder}', token ${ours.token}) must stop`,
      { holder: stored?.holder ?? null, token: stored?.token ?? null },
    );
  }
}

/** The document with its lease extended to `now + duration`. */
export function renewed(document: JournalDocument, options: { now: number; duration: number }): JournalDocument {
  const lease = requireLease(document);
  return { ...document, lease: { ...lease, expires_at: options.now + options.duration } };
}

/** The document with its lease expired (holder and token kept for the record). */
export function released(document: JournalDocument): JournalDocument {
  const lease = requireLease(document);
  return { ...document, lease: { ...lease, expires_at: 0 } };
}

function requireLease(document: JournalDocument): RunLease {
  if (document.lease === null) {
    throw new RunLeaseLost(`run '${document.run_id}': a write without a lease`, { holder: null, token: null });
  }
  return document.lease;
}

/**
 * Unexpired, and not held by a process of this host that no longer exists.
 *
 * A worker killed with `kill -9` cannot release its lease; on its own host its
 * death is certain (no such pid), so a restart need not wait out the lease. A
 * holder on another host is trusted until its lease expires.
 */
export function isLive(lease: RunLease, at: number): boolean {
  if (lease.expires_at <= at) {
    return false;
  }
  if (lease.host !== hostname() || lease.pid === process.pid) {
    return true;
  }
  return processExists(lease.pid);
}

/**
 * Whether a process with this pid is alive on this host (a process of another user counts).
 *
 * A worker killed while its parent does not reap it stays a zombie: its pid answers
 * signals, but it runs no code and holds nothing. It is dead here, or a restart would
 * wait out the whole lease.
 */
export function processExists(pid: number): boolean {
  try {
    process.kill(pid, 0);
  } catch (error) {
    if ((error as NodeJS.ErrnoException).code !== "EPERM") {
      return false;
    }
  }
  return !exited(pid);
}

/** Whether the pid is a process that has exited and not been reaped (Linux `/proc`: state
 * `Z` or `X`); false where there is no `/proc` to tell. */
function exited(pid: number): boolean {
  let stat: string;
  try {
    stat = readFileSync(`/proc/${pid}/stat`, "latin1");
  } catch {
    return false;
  }
  const state = stat.slice(stat.lastIndexOf(")") + 1).trim().split(" ")[0];
  return state === "Z" || state === "X";
}
