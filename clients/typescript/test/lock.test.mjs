// The journal lock that Node and Python journal writers share: generations .<journal>.lock.<n>.
// Each generation is a {"host", "pid", "nonce", "at"} record hard-linked into place from a staging
// file .<journal>.lock-staging.<pid>.<nonce>, and the highest one decides: the lock is free when
// there is none, when it has its marker .<journal>.lock.<n>.released, or when its holder is dead
// (src/lock-file.ts, and _lock_file.py in the Python client; docs/journal.md). What the protocol
// promises: a release creates the marker and leaves its generation in place, so a grant leaves
// exactly its generation and marker behind and the next grant is n + 1, removing n and its marker;
// generation numbers only grow, one per grant. A dead holder (a gone process of this host, a file
// that holds no record) is succeeded at once by the next generation, its file removed only after
// that generation exists. A live holder of this host, any record of this very process (another
// async writer, a worker thread, a second copy of the module, an orphan) and any holder of another
// host are waited for, then refused with a JournalError naming them and the file; a released
// generation is free whoever holds it. Two writers that judge one generation free race for one
// link, and the loser waits; a writer that looked long ago withdraws; a writer that judged a grant
// being released, or paused before its link, never holds beside a newer grant; an error after a won
// link leaves that generation released; the winner removes staging files of dead writers only, and
// nothing else as one; processes exclude each other; FileJournal keeps its read-check-write whole
// under it, and its lock's files hidden, in both clients. Every test runs under the audit below: no
// lock file is renamed; the highest generation and its marker are never removed; a generation is
// removed only by the writer that linked it (withdrawing) or by one that holds a newer generation,
// a marker only by one that holds a newer generation, and only the writer that linked a generation
// creates its marker; a staging file of a live process other than this one is never removed.
// tests/test_journal_lock.py pins the same cases for the Python client, Python against Node
// processes, and that both clients judge odd records alike.
import assert from "node:assert/strict";
import { AsyncLocalStorage } from "node:async_hooks";
import { spawn, spawnSync } from "node:child_process";
import fs from "node:fs";
import { createRequire, syncBuiltinESMExports } from "node:module";
import os from "node:os";
import path from "node:path";
import { afterEach, after, before, describe, test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";
import { Worker } from "node:worker_threads";

// --- the audit: how the lock's files may change --------------------------------------------
// fs/promises' link, unlink, writeFile (the marker), rename and readFile are wrapped
// (syncBuiltinESMExports carries the wrappers into the client's ES imports); each acquire() and
// release() runs in an AsyncLocalStorage context naming its writer and holding the generations
// it linked, so an unlink or a marker knows whose it is.

const GENERATION = /^(.+\.lock)\.([1-9][0-9]*)$/;
const MARKER = /^(.+\.lock)\.([1-9][0-9]*)\.released$/;
const STAGING = /^(.+\.lock)-staging\.([0-9]+)\.[^.]+$/;
const audit = {
  links: [], // [file name, "made" | error code] for each link to a generation
  events: [], // ["link" | "mark" | "unlink", file name, writer label] for generations and markers
  violations: [],
  beforeLink: null, // (file name) => promise | undefined: a test's hook before each link
  afterRead: null, // (file name) => promise | undefined: a test's hook after each readFile
};
const writer = new AsyncLocalStorage(); // { label, owned: Set of generation paths }
const fsp = createRequire(import.meta.url)("node:fs/promises");
const real = {
  link: fsp.link,
  unlink: fsp.unlink,
  rename: fsp.rename,
  readFile: fsp.readFile,
  writeFile: fsp.writeFile,
};

function higherExists(directory, lock, n) {
  return fs.readdirSync(directory).some((entry) => {
    const match = GENERATION.exec(entry);
    return match !== null && match[1] === lock && Number(match[2]) > n;
  });
}

fsp.link = async function link(existing, target) {
  const file = String(target);
  const name = path.basename(file);
  const isGeneration = GENERATION.test(name);
  await audit.beforeLink?.(name);
  try {
    await real.link(existing, target);
  } catch (error) {
    if (isGeneration) audit.links.push([name, error.code]);
    throw error;
  }
  if (isGeneration) {
    const store = writer.getStore();
    audit.links.push([name, "made"]);
    audit.events.push(["link", name, store?.label]);
    store?.owned.add(file);
  }
};

fsp.unlink = async function unlink(target) {
  const file = String(target);
  const name = path.basename(file);
  const match = GENERATION.exec(name) ?? MARKER.exec(name);
  if (match !== null && fs.existsSync(file)) {
    const [, lock, n] = match;
    const store = writer.getStore();
    const owned = store?.owned ?? new Set();
    const holdsNewer = [...owned].some((other) => {
      const newer = GENERATION.exec(path.basename(other));
      return (
        path.dirname(other) === path.dirname(file) &&
        newer[1] === lock &&
        Number(newer[2]) > Number(n) &&
        fs.existsSync(other)
      );
    });
    if (!higherExists(path.dirname(file), lock, Number(n))) {
      audit.violations.push(`${name} was removed while ${n} was the highest`);
    }
    if (GENERATION.test(name) && owned.has(file)) {
      owned.delete(file); // a withdrawal
    } else if (!holdsNewer) {
      audit.violations.push(`${name} was removed by a writer that holds no newer generation`);
    }
    audit.events.push(["unlink", name, store?.label]);
  }
  const staging = STAGING.exec(name);
  if (staging !== null && fs.existsSync(file)) {
    const pid = Number(staging[2]);
    if (pid !== process.pid && exists(pid)) {
      audit.violations.push(`${name}, of a live process, was removed`);
    }
  }
  return real.unlink(target);
};

fsp.writeFile = async function writeFile(target, ...rest) {
  const name = typeof target === "string" || target instanceof URL ? path.basename(String(target)) : "";
  const marker = MARKER.exec(name);
  if (marker === null) {
    return real.writeFile(target, ...rest);
  }
  const store = writer.getStore();
  const file = path.join(path.dirname(String(target)), `${marker[1]}.${marker[2]}`);
  const problems = [];
  if (!store?.owned.has(file)) {
    problems.push(`${name} was created by a writer that did not link ${path.basename(file)}`);
  }
  // Looked at before the marker exists: once it does, a newer winner may remove the generation.
  if (!fs.existsSync(file)) {
    problems.push(`${name} was created without its generation`);
  }
  await real.writeFile(target, ...rest);
  audit.violations.push(...problems);
  audit.events.push(["mark", name, store?.label]);
};

fsp.rename = async function rename(from, to) {
  if ([from, to].some((file) => path.basename(String(file)).includes(".lock"))) {
    audit.violations.push(`${from} was renamed to ${to}`);
  }
  return real.rename(from, to);
};

fsp.readFile = async function readFile(file, ...options) {
  const content = await real.readFile(file, ...options);
  await audit.afterRead?.(path.basename(String(file)));
  return content;
};

syncBuiltinESMExports();

const { currentWorker, FileJournal, GatewayClient, HttpTool, JournalError, LockFile, Run, RunLeased, RunLeaseLost } =
  await import("../dist/index.js");

const storeOf = new WeakMap(); // grant -> its writer's context

/** Run each acquire() and release() of `LockFileClass` in its writer's audit context. */
function instrument(LockFileClass) {
  const { acquire, release } = LockFileClass.prototype;
  LockFileClass.prototype.acquire = function instrumentedAcquire() {
    const store = { label: this.label ?? "writer", owned: new Set() };
    return writer.run(store, async () => {
      const grant = await acquire.call(this);
      storeOf.set(grant, store);
      return grant;
    });
  };
  LockFileClass.prototype.release = function instrumentedRelease(grant) {
    // A release inside acquire() (of a won generation it failed to hold) is that writer's.
    const store = storeOf.get(grant) ?? writer.getStore() ?? { label: this.label ?? "writer", owned: new Set() };
    return writer.run(store, () => release.call(this, grant));
  };
}
instrument(LockFile);

/** A LockFile labelled for audit.events. */
function labelled(label, lockPath, timeout) {
  const lock = new LockFile(lockPath, timeout);
  lock.label = label;
  return lock;
}

/** A writer's events; the unlinks of one cleanup sorted (their order is not pinned). */
function by(label) {
  const events = [];
  let unlinks = [];
  for (const [what, name, who] of audit.events) {
    if (who !== label) continue;
    if (what === "unlink") {
      unlinks.push([what, name]);
    } else {
      events.push(...unlinks.sort(), [what, name]);
      unlinks = [];
    }
  }
  return [...events, ...unlinks.sort()];
}

function checkAudit() {
  const violations = audit.violations.splice(0);
  audit.links.length = 0;
  audit.events.length = 0;
  audit.beforeLink = null;
  audit.afterRead = null;
  assert.deepEqual(violations, [], "the lock renamed a file or removed another writer's");
}

// --- helpers --------------------------------------------------------------------------------

const DIST_URL = new URL("../dist/index.js", import.meta.url).href;
const HOST = os.hostname();
const OTHER_HOST = "some-other-host.invalid";
const NONCE = "feedfacecafebeef"; // a nonce no grant of this process has
const SHORT = 0.2; // seconds: the timeout of an acquire that must give up
const LONG = 5; // seconds: the timeout of an acquire that must not need it
const PROMPT_MS = 1000; // succeeding a dead or released holder takes well under this
const WINDOW_MS = 300; // how long a writer that must wait is given to (wrongly) take the lock
const CHILD_TIMEOUT_MS = 30_000;
const INCREMENTS = 40;
const TAKEOVERS = 5;
const RACE_ROUNDS = 30;
const STRESS_WRITERS = 4;
const STRESS_TURNS = 300;
const STRESS_MS = 2500; // the in-process stress stops taking turns after this

// A writer that takes the lock INCREMENTS times to add one to a counter file (read, 3 ms
// pause, write), logging its name under the lock each time. It starts when the file GO
// appears, so that every writer contends from the start (for a dead holder's generation
// first). The pause outlasts a takeover, so a writer that took a live lock would lose
// increments.
const COUNTER_WRITER = `
import { appendFileSync, existsSync, readFileSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
const { LockFile } = await import(process.env.DIST_URL);
const env = process.env;
const lock = new LockFile(env.LOCK, 20);
writeFileSync(env.READY, "");
const deadline = performance.now() + 20000;
while (!existsSync(env.GO)) {
  if (performance.now() > deadline) throw new Error("never told to go");
  await sleep(1);
}
for (let i = 0; i < Number(env.N); i++) {
  const grant = await lock.acquire();
  try {
    const text = readFileSync(env.COUNTER, "utf-8");
    if (!/^[0-9]+$/.test(text)) throw new Error(\`counter holds \${JSON.stringify(text)}\`);
    await sleep(3);
    writeFileSync(env.COUNTER, String(Number(text) + 1));
    appendFileSync(env.LOG, env.NAME + "\\n");
  } finally {
    await lock.release(grant);
  }
  await sleep(2);
}
`;

// A writer that takes the lock, says so (the file READY), and never lets it go: killed with
// SIGKILL inside its critical section.
const HOLDER = `
import { writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
const { LockFile } = await import(process.env.DIST_URL);
await new LockFile(process.env.LOCK, 10).acquire();
writeFileSync(process.env.READY, "");
await sleep(30000);
`;

// A writer that takes the lock, says so (READY), releases it when the file GO appears, and
// exits: once reaped, its pid is dead and its record judged so.
const RELEASER = `
import { existsSync, writeFileSync } from "node:fs";
import { setTimeout as sleep } from "node:timers/promises";
const { LockFile } = await import(process.env.DIST_URL);
const lock = new LockFile(process.env.LOCK, 10);
const grant = await lock.acquire();
writeFileSync(process.env.READY, "");
const deadline = performance.now() + 20000;
while (!existsSync(process.env.GO)) {
  if (performance.now() > deadline) throw new Error("never told to go");
  await sleep(1);
}
await lock.release(grant);
`;

/** Run `body(directory, lockPath, root)` in a fresh temporary directory, removed afterwards. */
async function inTemporaryDirectory(body) {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), "journal-lock-"));
  const directory = path.join(root, "journal");
  fs.mkdirSync(directory);
  try {
    return await body(directory, path.join(directory, ".run.json.lock"), root);
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
}

const names = (directory) => fs.readdirSync(directory).sort();
/** The names in `directory` but the staging files of writers still acquiring. */
const lockFiles = (directory) => names(directory).filter((name) => !STAGING.test(name));
const generation = (lockPath, n) => `${lockPath}.${n}`;

/**
 * The names a directory holds after the grant of generation `n` was released: that generation
 * and its marker (nothing older, no staging file), and `others`.
 */
const left = (n, others = [], lock = ".run.json.lock") => [...others, `${lock}.${n}`, `${lock}.${n}.released`].sort();

/** The generation the last grant left beside `journal`, and nothing else; its number. */
function lastGeneration(directory, journal = "run.json") {
  const entries = names(directory);
  const n = (entries[0] ?? "").slice(`.${journal}.lock.`.length);
  assert.match(n, /^[1-9][0-9]*$/, JSON.stringify(entries));
  assert.deepEqual(entries, [`.${journal}.lock.${n}`, `.${journal}.lock.${n}.released`, journal]);
  return Number(n);
}

/** Leave the marker of generation `n`, as its holder's release would have. */
function markReleased(lockPath, n) {
  fs.writeFileSync(`${lockPath}.${n}.released`, "");
}

/** A promise with its resolve function. */
function deferred() {
  let resolve;
  const promise = new Promise((settle) => (resolve = settle));
  return { promise, resolve };
}

function holderOf(file) {
  const record = JSON.parse(fs.readFileSync(file, "utf-8"));
  assert.deepEqual(Object.keys(record).sort(), ["at", "host", "nonce", "pid"]);
  return record;
}

const record = ({ host = HOST, pid, nonce = NONCE }) =>
  Buffer.from(JSON.stringify({ host, pid, nonce, at: Date.now() / 1000 }));

/** Leave generation `n` as a writer would have linked it (or a broken one); its path. */
function plant(lockPath, n, raw) {
  const file = generation(lockPath, n);
  fs.writeFileSync(file, raw);
  return file;
}

/** The file's bytes and inode: equal later means neither rewritten nor renamed over. */
function snapshot(file) {
  return { bytes: fs.readFileSync(file).toString("hex"), inode: fs.statSync(file).ino };
}

function exists(pid) {
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return error.code === "EPERM";
  }
}

/** The pid of a process of this host that has exited and been reaped. */
function deadPid() {
  const child = spawnSync("true", { timeout: CHILD_TIMEOUT_MS });
  assert.equal(child.status, 0);
  assert.equal(exists(child.pid), false);
  return child.pid;
}

/** A child process with its exit as a promise (resolved once it is reaped). */
function start(command, args, env = {}) {
  const child = spawn(command, args, {
    env: { ...process.env, DIST_URL, ...env },
    stdio: ["ignore", "pipe", "pipe"],
    timeout: CHILD_TIMEOUT_MS,
    killSignal: "SIGKILL",
  });
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  child.stdout.resume();
  const exited = new Promise((resolve, reject) => {
    child.on("error", reject);
    child.on("close", (code, signal) => resolve({ code, signal, stderr }));
  });
  return { child, exited };
}

const startNode = (script, env) => start(process.execPath, ["--input-type=module", "-e", script], env);

/** Kill a child if it still runs and wait until it is reaped. */
async function stop({ child, exited }) {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill("SIGKILL");
  }
  return exited;
}

/** Run `body(pid)` with a live process of this host (`sleep 30`), killed and reaped after. */
async function withSleeper(body) {
  const sleeper = start("sleep", ["30"]);
  try {
    return await body(sleeper.child.pid);
  } finally {
    await stop(sleeper);
  }
}

/** Wait (bounded) until a child creates `file`; fail early if a child exits first. */
async function waitFor(file, children) {
  const deadline = performance.now() + CHILD_TIMEOUT_MS;
  let early = null;
  for (const { child, exited } of children) {
    exited.then(
      (result) => (early ??= { pid: child.pid, ...result }),
      (error) => (early ??= { pid: child.pid, code: String(error), stderr: "" }),
    );
  }
  while (!fs.existsSync(file)) {
    if (early !== null) {
      assert.fail(`child ${early.pid} exited early (${early.code ?? early.signal}): ${early.stderr}`);
    }
    assert.ok(performance.now() < deadline, `no ${path.basename(file)} after ${CHILD_TIMEOUT_MS} ms`);
    await sleep(5);
  }
}

const escape = (text) => text.replace(/[.*+?^${}()|[\]\\]/g, "\\$&");

/** Assert that `lock.acquire()` gives up with a JournalError naming `pid on host` and `file`. */
async function assertRefused(lock, file, pid, host) {
  const started = performance.now();
  await assert.rejects(lock.acquire(), (error) => {
    assert.ok(error instanceof JournalError, `not a JournalError: ${error}`);
    assert.match(error.message, new RegExp(`\\bpid ${pid} on ${escape(host)}\\b`));
    assert.ok(error.message.includes(file), `${error.message} does not name ${file}`);
    return true;
  });
  return (performance.now() - started) / 1000;
}

/** `promise`, or a failure after `ms` (its timer keeps the test alive until then). */
async function within(promise, ms, message) {
  const timer = new AbortController();
  const late = sleep(ms, undefined, { signal: timer.signal }).then(() => {
    throw new Error(message);
  });
  late.catch(() => undefined); // aborted once `promise` settles
  try {
    return await Promise.race([promise, late]);
  } finally {
    timer.abort();
  }
}

/** A gate for two: each caller waits until both arrived (or fails after `ms`). */
function gateForTwo(ms) {
  let arrived = 0;
  let open;
  const opened = new Promise((resolve) => (open = resolve));
  return () => {
    if (++arrived === 2) open();
    return within(opened, ms, "the other writer never got to its link");
  };
}

/** Release `lock`'s grant once `pending` gives it; nothing when it failed. */
async function releaseWhenGranted(lock, pending) {
  const grant = await within(pending, CHILD_TIMEOUT_MS, "an acquire never settled").catch(() => null);
  if (grant !== null) await lock.release(grant);
}

/**
 * One round: two writers take the lock; the generations on disk at each grant, in grant order.
 * Holding, the first holds on until the other has looked twice more. Fails on two holders at
 * once.
 */
async function raceOnce(lockPath) {
  const looks = [0, 0];
  const grants = [];
  const inside = [];
  const locks = [0, 1].map((index) => {
    const lock = new LockFile(lockPath, 2);
    lock.generations = function generations() {
      looks[index]++;
      return LockFile.prototype.generations.call(this);
    };
    return lock;
  });
  await Promise.all(
    locks.map(async (lock, index) => {
      const grant = await lock.acquire();
      try {
        inside.push(index);
        assert.deepEqual(inside, [index], `two holders at once: ${inside}`);
        grants.push(await LockFile.prototype.generations.call(lock));
        if (grants.length === 1) {
          // hold on until the other writer has looked at least twice more
          const other = looks[1 - index];
          const deadline = performance.now() + LONG * 1000;
          while (looks[1 - index] < other + 2 && performance.now() < deadline) {
            await sleep(1);
          }
        }
        inside.splice(inside.indexOf(index), 1);
      } finally {
        await lock.release(grant);
      }
    }),
  );
  return grants;
}

const linked = (name) => audit.links.filter(([file]) => file === name).map(([, outcome]) => outcome);

// --- odd lock records -------------------------------------------------------------------------

const H = JSON.stringify(HOST);
const fields =
  (members = {}) =>
  ({ live }) =>
    Buffer.from(JSON.stringify({ host: HOST, pid: live, nonce: NONCE, at: 1764583200.25, ...members }));
const text = (build) => (pids) => Buffer.from(build(pids));

// [case, expected verdict, the record]: the same table as tests/test_journal_lock.py
const ODD_RECORDS = [
  ["a live pid of this host", "waited", fields()],
  [
    "pid 42.0, an integer written as a float",
    "waited",
    text(({ live }) => `{"host": ${H}, "pid": ${live}.0, "nonce": "${NONCE}", "at": 1.5}`),
  ],
  [
    "another host, a pid dead here",
    "waited",
    text(({ dead }) => `{"host": "${OTHER_HOST}", "pid": ${dead}, "nonce": "${NONCE}", "at": 1.5}`),
  ],
  ["pid true", "dead", fields({ pid: true })],
  ["pid 2**40", "dead", fields({ pid: 1099511627776 })],
  ["pid 2**31", "dead", fields({ pid: 2 ** 31 })],
  ["pid 0", "dead", fields({ pid: 0 })],
  ["pid -1", "dead", fields({ pid: -1 })],
  ["pid 42.5", "dead", text(({ live }) => `{"host": ${H}, "pid": ${live}.5, "nonce": "x", "at": 1.5}`)],
  ["pid a string", "dead", (pids) => fields({ pid: String(pids.live) })(pids)],
  [
    "not UTF-8",
    "dead",
    ({ live }) =>
      Buffer.concat([
        Buffer.from(`{"host": ${H}, "pid": ${live}, "nonce": "`),
        Buffer.from([0xff]), // a live record, but for this byte
        Buffer.from(`", "at": 1.5}`),
      ]),
  ],
  ["not JSON", "dead", text(({ live }) => `{"host": ${H}, "pid": ${live},`)],
  ["an empty file", "dead", () => Buffer.alloc(0)],
  ["a JSON array", "dead", text(({ live }) => `[${H}, ${live}, "${NONCE}", 1.5]`)],
  ["no nonce", "dead", fields({ nonce: undefined })],
  ["host null", "dead", fields({ host: null })],
  ["at true", "dead", fields({ at: true })],
  ["at NaN", "dead", text(({ live }) => `{"host": ${H}, "pid": ${live}, "nonce": "${NONCE}", "at": NaN}`)],
  ["at -Infinity", "dead", text(({ live }) => `{"host": ${H}, "pid": ${live}, "nonce": "${NONCE}", "at": -Infinity}`)],
  [
    "at 1e999, a number too large for a double",
    "waited",
    text(({ live }) => `{"host": ${H}, "pid": ${live}, "nonce": "${NONCE}", "at": 1e999}`),
  ],
  ["a UTF-8 byte order mark", "dead", (pids) => Buffer.concat([Buffer.from([0xef, 0xbb, 0xbf]), fields()(pids)])],
  ["a JSON array nested 10000 deep", "dead", () => Buffer.from("[".repeat(10_000) + "]".repeat(10_000))],
];
const PLANTED = 3;

describe("journal lock", () => {
  afterEach(checkAudit);

  test("a release leaves its generation and marker, and the next grant is n + 1", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // While held: the journal and .lock.n, this grant's record. Released: its marker
      // .lock.n.released beside it, the file itself as it was (same bytes, same inode), no
      // staging file .run.json.lock-staging.<pid>.<nonce>. The next grant is n + 1 and removes n
      // and its marker, so generations only grow: 1, 2, 3, and a FileJournal's three grants leave 3.
      fs.writeFileSync(path.join(directory, "run.json"), "{}");
      const lock = labelled("L", lockPath, LONG);
      for (const n of [1, 2, 3]) {
        const grant = await lock.acquire();
        assert.equal(grant.generation, n);
        assert.deepEqual(names(directory), [`.run.json.lock.${n}`, "run.json"]);
        assert.deepEqual(await lock.generations(), [n]);
        assert.deepEqual(holderOf(generation(lockPath, n)), grant.record);
        assert.deepEqual([grant.record.host, grant.record.pid], [HOST, process.pid]);
        const before = snapshot(generation(lockPath, n));
        await lock.release(grant);
        assert.deepEqual(names(directory), left(n, ["run.json"]));
        assert.deepEqual(snapshot(generation(lockPath, n)), before);
        assert.deepEqual(await lock.generations(), [n]);
      }
      const removed = (n) => [
        ["unlink", `.run.json.lock.${n}`],
        ["unlink", `.run.json.lock.${n}.released`],
      ];
      assert.deepEqual(by("L"), [
        ["link", ".run.json.lock.1"],
        ["mark", ".run.json.lock.1.released"],
        ["link", ".run.json.lock.2"],
        ...removed(1),
        ["mark", ".run.json.lock.2.released"],
        ["link", ".run.json.lock.3"],
        ...removed(2),
        ["mark", ".run.json.lock.3.released"],
      ]);
      const journal = new FileJournal(path.join(directory, "other.json"), { lockTimeout: LONG });
      const document = await journal.acquire("run-1", "v1", currentWorker("w1"), 60);
      await journal.write(document, 60);
      await journal.release(document);
      const both = [...left(3, ["run.json"]), ...left(3, ["other.json"], ".other.json.lock")];
      assert.deepEqual(names(directory), both.sort());
    }));

  test("after a release, a waiter takes n + 1 and only then removes n", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // H holds 1; W waits on it (looks again and again). H releases: the highest generation,
      // 1, is still there, unchanged, with its marker beside it. W then takes 2, and only after
      // linking 2 removes 1 and its marker; released, it leaves 2 and its marker.
      const h = labelled("H", lockPath, LONG);
      const hGrant = await h.acquire();
      let hHolds = true;
      const before = snapshot(generation(lockPath, 1));
      const w = labelled("W", lockPath, LONG);
      let looks = 0;
      const proceed = deferred();
      w.generations = async function generations() {
        looks++;
        return LockFile.prototype.generations.call(this);
      };
      audit.beforeLink = (name) => (name === ".run.json.lock.2" ? proceed.promise : undefined); // the test looks first
      let inside = null;
      const wDone = w.acquire().then(async (grant) => {
        inside = names(directory);
        await w.release(grant);
      });
      try {
        const deadline = performance.now() + LONG * 1000;
        while (looks < 3) {
          assert.ok(performance.now() < deadline, "W never looked");
          await sleep(1);
        }
        assert.equal(inside, null, "W took a held lock");
        hHolds = false;
        await h.release(hGrant);
        assert.deepEqual(lockFiles(directory), left(1));
        assert.deepEqual(snapshot(generation(lockPath, 1)), before);
        proceed.resolve();
      } finally {
        if (hHolds) await h.release(hGrant);
        proceed.resolve();
        await within(wDone, CHILD_TIMEOUT_MS, "W never took the lock");
      }
      assert.deepEqual(inside, [".run.json.lock.2"]);
      assert.deepEqual(names(directory), left(2));
      assert.deepEqual(by("H"), [
        ["link", ".run.json.lock.1"],
        ["mark", ".run.json.lock.1.released"],
      ]);
      assert.deepEqual(by("W"), [
        ["link", ".run.json.lock.2"],
        ["unlink", ".run.json.lock.1"],
        ["unlink", ".run.json.lock.1.released"],
        ["mark", ".run.json.lock.2.released"],
      ]);
    }));

  test("a dead holder at generation 7 is succeeded by generation 8", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // A writer killed in its section left generation 7; its pid is gone. The next writer
      // links 8 at once, then removes 7 (never before 8 exists). Released, 8 and its marker
      // stay; the next grant is 9, and removes them.
      plant(lockPath, 7, record({ pid: deadPid() }));
      const lock = new LockFile(lockPath, LONG);
      assert.deepEqual(await lock.generations(), [7]);
      const started = performance.now();
      const grant = await lock.acquire();
      assert.ok(performance.now() - started < PROMPT_MS, "succeeding a dead holder took too long");
      assert.equal(grant.generation, 8);
      assert.deepEqual(await lock.generations(), [8]);
      assert.deepEqual(holderOf(generation(lockPath, 8)), grant.record);
      assert.deepEqual(names(directory), [".run.json.lock.8"]);
      assert.deepEqual(audit.links, [[".run.json.lock.8", "made"]]);
      await lock.release(grant);
      assert.deepEqual(
        audit.events.map(([what]) => what),
        ["link", "unlink", "mark"],
      );
      assert.deepEqual(names(directory), left(8));
      const next = await lock.acquire();
      assert.equal(next.generation, 9);
      assert.deepEqual(names(directory), [".run.json.lock.9"]);
      await lock.release(next);
      assert.deepEqual(names(directory), left(9));
    }));

  test("a live holder of this host is waited for", () =>
    inTemporaryDirectory((directory, lockPath) =>
      withSleeper(async (pid) => {
        // A live pid of this host is never judged dead: the waiter gives up after its timeout,
        // naming the holder and the file, and leaves that file as it was, and nothing else.
        const held = plant(lockPath, 3, record({ pid }));
        const before = snapshot(held);
        const waited = await assertRefused(new LockFile(lockPath, SHORT), held, pid, HOST);
        assert.ok(waited >= SHORT && waited < SHORT + 60, `gave up after ${waited} s`); // gives up; how soon after is the load's
        assert.deepEqual(snapshot(held), before);
        assert.deepEqual(names(directory), [".run.json.lock.3"]);
      }),
    ));

  test("a holder on another host is waited for, even with a pid dead here", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      const pid = deadPid();
      const held = plant(lockPath, 3, record({ host: OTHER_HOST, pid }));
      const before = snapshot(held);
      const waited = await assertRefused(new LockFile(lockPath, SHORT), held, pid, OTHER_HOST);
      assert.ok(waited >= SHORT, `gave up after ${waited} s`);
      assert.deepEqual(snapshot(held), before);
      assert.deepEqual(names(directory), [".run.json.lock.3"]);
    }));

  test("an orphan record of this process is waited for", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // A record of this very process that no grant of the caller made (another async
      // writer's, a worker thread's, another copy of the client's, or one never released) is
      // never judged dead: waited for, named and left alone. Its marker frees it: the next
      // grant is 5, at once.
      const held = plant(lockPath, 4, record({ pid: process.pid, nonce: "0123456789abcdef" }));
      const before = snapshot(held);
      const waited = await assertRefused(new LockFile(lockPath, SHORT), held, process.pid, HOST);
      assert.ok(waited >= SHORT, `gave up after ${waited} s`);
      assert.deepEqual(snapshot(held), before);
      assert.deepEqual(names(directory), [".run.json.lock.4"]);
      markReleased(lockPath, 4);
      const lock = new LockFile(lockPath, SHORT);
      const started = performance.now();
      const grant = await lock.acquire();
      assert.ok(performance.now() - started < PROMPT_MS, "a released generation was waited for");
      assert.equal(grant.generation, 5);
      assert.deepEqual(names(directory), [".run.json.lock.5"]);
      await lock.release(grant);
      assert.deepEqual(names(directory), left(5));
    }));

  for (const whose of ["a live process of this host", "this process", "another host"]) {
    test(`a released generation is free whoever holds it: ${whose}`, () =>
      inTemporaryDirectory((directory, lockPath) =>
        withSleeper(async (live) => {
          // A top generation with its .released marker is free, though its holder would be
          // waited for without it: the next grant links 4 at once and removes 3 and its marker.
          const [pid, host] = {
            "a live process of this host": [live, HOST],
            "this process": [process.pid, HOST],
            "another host": [live, OTHER_HOST],
          }[whose];
          plant(lockPath, 3, record({ host, pid }));
          markReleased(lockPath, 3);
          const lock = new LockFile(lockPath, SHORT);
          const started = performance.now();
          const grant = await lock.acquire();
          assert.ok(performance.now() - started < PROMPT_MS, "a released generation was waited for");
          assert.equal(grant.generation, 4);
          assert.deepEqual(names(directory), [".run.json.lock.4"]);
          await lock.release(grant);
          assert.deepEqual(names(directory), left(4));
        }),
      ));
  }

  for (const source of ["this module", "a second copy of the module"]) {
    test(`another grant of this process is waited for (${source})`, () =>
      inTemporaryDirectory(async (directory, lockPath) => {
        // A grant of another async writer of this process, through this module or a second
        // copy of lock-file.js (which shares no state with this one), is live: waited for,
        // named, and left alone; once released, the next grant is 2.
        let Holder = LockFile;
        if (source !== "this module") {
          ({ LockFile: Holder } = await import(new URL("../dist/lock-file.js?copy", import.meta.url).href));
          assert.notEqual(Holder, LockFile);
          if (!Holder.instrumented) {
            instrument(Holder);
            Holder.instrumented = true;
          }
        }
        const first = new Holder(lockPath, LONG);
        const grant = await first.acquire();
        const held = generation(lockPath, 1);
        const before = snapshot(held);
        const waited = await assertRefused(new LockFile(lockPath, SHORT), held, process.pid, HOST);
        assert.ok(waited >= SHORT, `gave up after ${waited} s`);
        assert.deepEqual(snapshot(held), before);
        await first.release(grant);
        const second = new LockFile(lockPath, LONG);
        const next = await second.acquire();
        assert.equal(next.generation, 2);
        assert.deepEqual(names(directory), [".run.json.lock.2"]);
        await second.release(next);
        assert.deepEqual(names(directory), left(2));
      }));
  }

  test("a grant held by a worker thread of this process is waited for", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // A worker thread shares this process's pid but not its module state: its grant is
      // waited for like any other live grant of this process; once released, the next is 2.
      const thread = new Worker(
        `const { parentPort, workerData } = require("node:worker_threads");
         import(workerData.dist).then(async ({ LockFile }) => {
           const lock = new LockFile(workerData.lock, 5);
           const grant = await lock.acquire();
           parentPort.postMessage(grant.generation);
           parentPort.once("message", async () => {
             await lock.release(grant);
             parentPort.postMessage("released");
             parentPort.close();
           });
         });`,
        { eval: true, workerData: { dist: DIST_URL, lock: lockPath } },
      );
      const exited = new Promise((resolve) => thread.once("exit", resolve));
      const message = () =>
        new Promise((resolve, reject) => {
          thread.once("message", resolve);
          thread.once("error", reject);
        });
      try {
        const held = await within(message(), CHILD_TIMEOUT_MS, "the worker thread never took the lock");
        assert.equal(held, 1);
        const file = generation(lockPath, 1);
        const before = snapshot(file);
        const waited = await assertRefused(new LockFile(lockPath, SHORT), file, process.pid, HOST);
        assert.ok(waited >= SHORT, `gave up after ${waited} s`);
        assert.deepEqual(snapshot(file), before);
        const released = message();
        thread.postMessage("release");
        assert.equal(await within(released, CHILD_TIMEOUT_MS, "the worker thread never released"), "released");
      } finally {
        thread.postMessage("release");
        await within(exited, 2000, "the worker thread did not exit").catch(() => undefined);
        await thread.terminate();
      }
      assert.deepEqual(names(directory), left(1));
      const lock = new LockFile(lockPath, SHORT);
      const grant = await lock.acquire();
      assert.equal(grant.generation, 2);
      await lock.release(grant);
      assert.deepEqual(names(directory), left(2));
    }));

  test("files that are not generations are ignored", () =>
    inTemporaryDirectory((directory, lockPath) =>
      withSleeper(async (pid) => {
        // The legacy <journal>.lock (no generation), even with a live record, another journal's
        // lock, .lock.0 and .lock.01, a live writer's staging file: none is the lock, none is
        // touched.
        const others = [
          lockPath,
          path.join(directory, ".other.json.lock.5"),
          path.join(directory, ".run.json.lock.0"),
          path.join(directory, ".run.json.lock.01"),
          path.join(directory, `.run.json.lock-staging.${pid}.${NONCE}`),
        ];
        for (const file of others) fs.writeFileSync(file, record({ pid }));
        const before = others.map(snapshot);
        const lock = new LockFile(lockPath, LONG);
        assert.deepEqual(await lock.generations(), []);
        const started = performance.now();
        const grant = await lock.acquire();
        assert.ok(performance.now() - started < PROMPT_MS, "the legacy lock was waited for");
        assert.equal(grant.generation, 1);
        await lock.release(grant);
        assert.deepEqual(others.map(snapshot), before);
        assert.deepEqual(names(directory), left(1, others.map((file) => path.basename(file))));
      }),
    ));

  test("the winner removes staging files of dead writers only", () =>
    inTemporaryDirectory((directory, lockPath) =>
      withSleeper(async (live) => {
        // Staging files .run.json.lock-staging.<pid>.<nonce> of writers that died before their
        // link stay while the lock is waited for; the next writer to win a generation removes those
        // whose pid is no process, and keeps those of a live process (this one included) and
        // every other file (a non-ASCII digit is no pid).
        // Only those older than any wait (ten minutes): a staging name has no host, and a fresh
        // one may be a writer's on another host with that pid.
        const dead = deadPid();
        const doomed = [`.run.json.lock-staging.${dead}.${NONCE}`, `.run.json.lock-staging.${dead}.0`];
        const kept = [
          `.run.json.lock-staging.${dead}.fresh`,
          `.run.json.lock-staging.${live}.${NONCE}`,
          `.run.json.lock-staging.${process.pid}.${NONCE}`,
          `.other.json.lock-staging.${dead}.${NONCE}`,
          `.run.json.lock-staging.x${dead}.${NONCE}`,
          ".run.json.lock-staging.\u00b2.x",
        ];
        for (const name of [...doomed, ...kept]) fs.writeFileSync(path.join(directory, name), record({ pid: dead }));
        const anHourAgo = Date.now() / 1000 - 3600;
        for (const name of doomed) fs.utimesSync(path.join(directory, name), anHourAgo, anHourAgo);
        const before = kept.map((name) => snapshot(path.join(directory, name)));
        await withSleeper(async (holder) => {
          const held = plant(lockPath, 3, record({ pid: holder }));
          await assertRefused(new LockFile(lockPath, SHORT), held, holder, HOST);
          for (const name of doomed) {
            assert.ok(fs.existsSync(path.join(directory, name)), "a waiter that never won removed files");
          }
        });
        const lock = new LockFile(lockPath, LONG);
        const grant = await lock.acquire();
        assert.equal(grant.generation, 4);
        assert.deepEqual(names(directory), [...kept, ".run.json.lock.4"].sort());
        await lock.release(grant);
        assert.deepEqual(
          kept.map((name) => snapshot(path.join(directory, name))),
          before,
        );
      }),
    ));

  test("no generation or marker is taken for a staging file, however old", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // The staging files have a stem of their own (-staging), and a name of exactly one more
      // part after the pid: the lock of a journal named run.json.lock-staging.<pid>, its
      // generation and marker an hour old with that pid dead, is not this lock's staging file,
      // nor is a staging file of the earlier naming (.run.json.lock.<pid>.<nonce>, which a
      // hidden generation .run.json.lock.<n> would have looked like).
      const dead = deadPid();
      const kept = [
        `.run.json.lock-staging.${dead}.lock.7`,
        `.run.json.lock-staging.${dead}.lock.7.released`,
        `.run.json.lock.${dead}.${NONCE}`,
      ];
      const anHourAgo = Date.now() / 1000 - 3600;
      for (const name of kept) {
        fs.writeFileSync(path.join(directory, name), record({ pid: dead }));
        fs.utimesSync(path.join(directory, name), anHourAgo, anHourAgo);
      }
      const before = kept.map((name) => snapshot(path.join(directory, name)));
      const lock = new LockFile(lockPath, LONG);
      await lock.release(await lock.acquire());
      assert.deepEqual(
        kept.map((name) => snapshot(path.join(directory, name))),
        before,
      );
      assert.deepEqual(names(directory), left(1, kept));
    }));

  for (const where of ["the look above its link", "the cleanup"]) {
    test(`an error after a won link leaves that generation released (${where})`, () =>
      inTemporaryDirectory(async (directory, lockPath) => {
        // A writer that won generation 5 fails before it holds (its second look for higher
        // generations, or its removal of the older ones, throws). It never leaves a grant
        // nobody holds: 5 gets its marker, the error reaches the caller, and the next writer
        // takes 6 at once.
        plant(lockPath, 4, record({ pid: deadPid() }));
        const lock = new LockFile(lockPath, LONG);
        const realGenerations = LockFile.prototype.generations;
        let calls = 0;
        if (where === "the look above its link") {
          LockFile.prototype.generations = function generations() {
            if (this === lock && ++calls === 2) {
              return Promise.reject(new Error("injected after the link"));
            }
            return realGenerations.call(this);
          };
        } else {
          lock.clean = async () => {
            throw new Error("injected after the link");
          };
        }
        try {
          await assert.rejects(lock.acquire(), /injected after the link/);
        } finally {
          LockFile.prototype.generations = realGenerations;
        }
        assert.deepEqual(audit.links, [[".run.json.lock.5", "made"]]);
        assert.deepEqual(names(directory), [".run.json.lock.4", ...left(5)]);
        const next = new LockFile(lockPath, SHORT);
        const started = performance.now();
        const grant = await next.acquire();
        assert.ok(performance.now() - started < PROMPT_MS, "a released generation was waited for");
        assert.equal(grant.generation, 6);
        assert.deepEqual(names(directory), [".run.json.lock.6"]);
        await next.release(grant);
        assert.deepEqual(names(directory), left(6));
      }));
  }

  test("two writers that judge one dead generation race for one link", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // Both judge generation d dead and both link d + 1: each is held at its link until both
      // got there. Exactly one link is made; the other writer finds d + 1 live (a grant of this
      // process) and waits on it, never beside it, and takes d + 2 once the winner marked it
      // released. Many rounds, each planting a dead generation above the last one left.
      const dead = deadPid();
      for (let round = 0; round < RACE_ROUNDS; round++) {
        const d = 5 + 3 * round;
        const contested = `.run.json.lock.${d + 1}`;
        plant(lockPath, d, record({ pid: dead }));
        audit.links.length = 0;
        const gate = gateForTwo(2000);
        let arrivals = 0;
        audit.beforeLink = (name) => (name === contested && ++arrivals <= 2 ? gate() : undefined);
        const grants = await raceOnce(lockPath);
        assert.deepEqual(linked(contested).sort(), ["EEXIST", "made"], `round ${round}`);
        assert.deepEqual(grants, [[d + 1], [d + 2]], `round ${round}: ${JSON.stringify(grants)}`);
        assert.deepEqual(names(directory), left(d + 2));
      }
    }));

  for (const [label, staleView] of [
    ["nothing", []],
    ["a dead generation 3", [3]],
  ]) {
    test(`a writer that looked long ago (it saw ${label}) withdraws from its low generation`, () =>
      inTemporaryDirectory(async (directory, lockPath) => {
        // It links the next generation while a live holder holds 9: it wins that link, sees 9
        // above it, removes its own file, and waits on 9, naming it; 9 is never renamed or
        // removed, 3 is left to the winner. Once 9's holder is gone, 10 succeeds it.
        await withSleeper(async (pid) => {
          plant(lockPath, 3, record({ pid: deadPid() }));
          const top = plant(lockPath, 9, record({ pid }));
          const before = snapshot(top);
          const lock = new LockFile(lockPath, SHORT);
          let looks = 0;
          lock.generations = async function generations() {
            return ++looks === 1 ? [...staleView] : LockFile.prototype.generations.call(this);
          };
          await assertRefused(lock, top, pid, HOST);
          assert.deepEqual(audit.links, [[`.run.json.lock.${(staleView.at(-1) ?? 0) + 1}`, "made"]]);
          assert.deepEqual(snapshot(top), before);
          assert.deepEqual(names(directory), [".run.json.lock.3", ".run.json.lock.9"]);
        });
        const lock = new LockFile(lockPath, LONG);
        const grant = await lock.acquire();
        assert.equal(grant.generation, 10);
        assert.deepEqual(names(directory), [".run.json.lock.10"]);
        await lock.release(grant);
        assert.deepEqual(names(directory), left(10));
      }));
  }

  test("a writer paused between its look and its link never holds beside another", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // Writer B judges generation 5 dead and is paused before linking 6. Meanwhile A succeeds
      // 5 at 6 and releases it (6 stays, marked), and C takes the free lock at 7, removing 6.
      // When B links 6, C still holds: B wins 6 but sees 7 above it (no number is reused),
      // withdraws, waits on C, and takes 8 once C released. Were 6 unlinked on release, C would
      // take 1 and B would hold 6 beside it.
      plant(lockPath, 5, record({ pid: deadPid() }));
      const reached = deferred();
      const resumed = deferred();
      let pauses = 0;
      audit.beforeLink = (name) => {
        if (name === ".run.json.lock.6" && ++pauses === 1) {
          reached.resolve();
          return resumed.promise;
        }
      };
      const b = labelled("B", lockPath, LONG);
      let cHolds = true;
      let bHeldBesideC = null;
      const granted = {};
      const bGrant = b.acquire().then((grant) => {
        bHeldBesideC = cHolds;
        granted.B = grant.generation;
        return grant;
      });
      bGrant.catch(() => undefined); // awaited below
      try {
        await within(reached.promise, LONG * 1000, "B never got to its link to 6");
        const a = new LockFile(lockPath, LONG);
        const aGrant = await a.acquire();
        granted.A = aGrant.generation;
        await a.release(aGrant);
        const c = new LockFile(lockPath, LONG);
        const cGrant = await c.acquire();
        granted.C = cGrant.generation;
        resumed.resolve();
        await within(bGrant, WINDOW_MS, "B waits").catch(() => undefined);
        cHolds = false;
        await c.release(cGrant);
      } finally {
        resumed.resolve();
        await releaseWhenGranted(b, bGrant);
      }
      assert.equal(bHeldBesideC, false, `B held the lock while C held it: ${JSON.stringify(granted)}`);
      assert.deepEqual(granted, { A: 6, C: 7, B: 8 });
      // 6 was gone (C removed it): B won it, saw 7, withdrew.
      assert.deepEqual(by("B").slice(0, 3), [
        ["link", ".run.json.lock.6"],
        ["unlink", ".run.json.lock.6"],
        ["link", ".run.json.lock.8"],
      ]);
      assert.deepEqual(linked(".run.json.lock.6"), ["made", "made"]);
      assert.deepEqual(names(directory), left(8));
    }));

  for (const holder of ["another process", "this process"]) {
    test(`a writer that judges a just-released grant never holds beside the next (${holder})`, () =>
      inTemporaryDirectory(async (directory, lockPath, root) => {
        // Writer W reads generation 1, held by H, and is slow to judge it. H releases (1 stays,
        // marked) and, as another process, exits; C takes the free lock at 2. W then judges
        // H's record: a gone process is dead, so W links 2, which exists (no name is reused):
        // W waits on C, never beside it, and takes 3 once C released. A record of this process
        // is never dead: W waits on it, then on C. Were 1 unlinked on release, C would take 1
        // again and W, judging the gone H dead, would win 2 beside it.
        let releaseH;
        let h = null;
        if (holder === "another process") {
          const ready = path.join(root, "ready");
          const go = path.join(root, "go");
          h = startNode(RELEASER, { LOCK: lockPath, READY: ready, GO: go });
          await waitFor(ready, [h]);
          releaseH = async () => {
            fs.writeFileSync(go, "");
            const result = await within(h.exited, CHILD_TIMEOUT_MS, "H never exited");
            assert.equal(result.code, 0, result.stderr);
            assert.equal(exists(h.child.pid), false);
          };
        } else {
          const lock = labelled("H", lockPath, LONG);
          const grant = await lock.acquire();
          releaseH = () => lock.release(grant);
        }
        const reached = deferred();
        const resumed = deferred();
        let reads = 0;
        audit.afterRead = (name) => {
          if (name === ".run.json.lock.1" && ++reads === 1) {
            reached.resolve();
            return resumed.promise;
          }
        };
        const w = labelled("W", lockPath, LONG);
        let afterRelease = null;
        let cHolds = true;
        let wHeldBesideC = null;
        const granted = {};
        const wGrant = w.acquire().then((grant) => {
          wHeldBesideC = cHolds;
          granted.W = grant.generation;
          return grant;
        });
        wGrant.catch(() => undefined); // awaited below
        try {
          await within(reached.promise, LONG * 1000, "W never read generation 1");
          await releaseH();
          afterRelease = lockFiles(directory);
          const c = new LockFile(lockPath, LONG);
          const cGrant = await c.acquire();
          granted.C = cGrant.generation;
          resumed.resolve();
          await within(wGrant, WINDOW_MS, "W waits").catch(() => undefined);
          cHolds = false;
          await c.release(cGrant);
        } finally {
          resumed.resolve();
          if (h !== null) await stop(h);
          await releaseWhenGranted(w, wGrant);
        }
        assert.equal(wHeldBesideC, false, `W held the lock while C held it: ${JSON.stringify(granted)}`);
        assert.deepEqual(afterRelease, left(1));
        assert.deepEqual(granted, { C: 2, W: 3 });
        // The gone holder was judged dead: W linked 2 after C had.
        assert.deepEqual(linked(".run.json.lock.2"), holder === "another process" ? ["made", "EEXIST"] : ["made"]);
        assert.deepEqual(names(directory), left(3));
      }));
  }

  test("a waiter whose top vanished after its look finds the next taken", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // W lists the generations (1, held by H) and is paused before it reads 1. H releases, C
      // takes 2 and removes 1 and its marker. W then finds 1 gone (no record: free), links 2,
      // which exists, and waits on C, never beside it, then takes 3.
      const h = new LockFile(lockPath, LONG);
      const hGrant = await h.acquire();
      const looked = deferred();
      const resumed = deferred();
      let looks = 0;
      let oneIsGone = null;
      const w = new LockFile(lockPath, LONG);
      w.generations = async function generations() {
        const found = await LockFile.prototype.generations.call(this);
        if (++looks === 1) {
          looked.resolve();
          await resumed.promise;
        }
        return found;
      };
      let cHolds = true;
      let wHeldBesideC = null;
      const granted = {};
      const wGrant = w.acquire().then((grant) => {
        wHeldBesideC = cHolds;
        granted.W = grant.generation;
        return grant;
      });
      wGrant.catch(() => undefined); // awaited below
      try {
        await within(looked.promise, LONG * 1000, "W never looked");
        await h.release(hGrant);
        const c = new LockFile(lockPath, LONG);
        const cGrant = await c.acquire();
        granted.C = cGrant.generation;
        oneIsGone = !fs.existsSync(generation(lockPath, 1));
        resumed.resolve();
        await within(wGrant, WINDOW_MS, "W waits").catch(() => undefined);
        cHolds = false;
        await c.release(cGrant);
      } finally {
        resumed.resolve();
        await releaseWhenGranted(w, wGrant);
      }
      assert.equal(wHeldBesideC, false, `W held the lock while C held it: ${JSON.stringify(granted)}`);
      assert.equal(oneIsGone, true);
      assert.deepEqual(granted, { C: 2, W: 3 });
      assert.deepEqual(linked(".run.json.lock.2"), ["made", "EEXIST"]);
      assert.deepEqual(names(directory), left(3));
    }));

  test("async writers in one process take turns one at a time", () =>
    inTemporaryDirectory(async (directory, lockPath) => {
      // 4 async writers take the lock up to 300 times each (for at most a few seconds), each
      // turn a read-modify-write of a shared counter that yields in the middle: no two turns
      // overlap, no increment is lost, every writer gets turns, and the generations are
      // consecutive, one per grant: after T grants exactly .lock.T and its marker are left.
      let counter = 0;
      const turns = Array(STRESS_WRITERS).fill(0);
      const inside = [];
      const overlaps = [];
      const deadline = performance.now() + STRESS_MS;
      await Promise.all(
        turns.map(async (_, index) => {
          const lock = new LockFile(lockPath, LONG);
          for (let turn = 0; turn < STRESS_TURNS && performance.now() < deadline; turn++) {
            const grant = await lock.acquire();
            try {
              inside.push(index);
              if (inside.length !== 1) overlaps.push([...inside]);
              const value = counter;
              await new Promise((resolve) => setImmediate(resolve));
              counter = value + 1;
              inside.splice(inside.indexOf(index), 1);
            } finally {
              await lock.release(grant);
            }
            turns[index]++;
            await new Promise((resolve) => setImmediate(resolve));
          }
        }),
      );
      assert.deepEqual(overlaps.slice(0, 5), []);
      const total = turns.reduce((a, b) => a + b, 0);
      assert.equal(counter, total, JSON.stringify(turns));
      assert.ok(turns.every((n) => n > 0), JSON.stringify(turns));
      assert.deepEqual(names(directory), left(total));
    }));

  describe("odd lock records", () => {
    // Each record as the top generation: dead (a file that holds no valid record, NaN and a
    // byte-order mark included: taken over at once by the next generation, which removes it)
    // or waited for (a JournalError naming the holder's pid, as an integer, its host, and the
    // file).
    let sleeper;
    const pids = {};
    before(() => {
      sleeper = start("sleep", ["30"]);
      pids.live = sleeper.child.pid;
      pids.dead = deadPid();
    });
    after(() => stop(sleeper));
    afterEach(checkAudit);

    for (const [label, expected, build] of ODD_RECORDS) {
      test(`${label}: ${expected === "dead" ? "dead" : "waited for"}`, () =>
        inTemporaryDirectory(async (directory, lockPath) => {
          const planted = plant(lockPath, PLANTED, build(pids));
          const before = snapshot(planted);
          const lock = new LockFile(lockPath, SHORT);
          const started = performance.now();
          if (expected === "dead") {
            const grant = await lock.acquire();
            assert.ok(performance.now() - started < PROMPT_MS, "succeeding a dead holder took too long");
            assert.equal(grant.generation, PLANTED + 1);
            assert.deepEqual(await lock.generations(), [PLANTED + 1]);
            await lock.release(grant);
            assert.deepEqual(names(directory), left(PLANTED + 1));
          } else {
            const holder = JSON.parse(Buffer.from(before.bytes, "hex").toString("utf-8"));
            const waited = await assertRefused(lock, planted, holder.pid, holder.host);
            assert.ok(waited >= SHORT, `gave up after ${waited} s`);
            assert.deepEqual(snapshot(planted), before);
            assert.deepEqual(names(directory), [path.basename(planted)]);
          }
        }));
    }
  });

  test("a writer killed in its section is waited for while it lives, then succeeded", () =>
    inTemporaryDirectory(async (directory, lockPath, root) => {
      const ready = path.join(root, "ready");
      const holder = startNode(HOLDER, { LOCK: lockPath, READY: ready });
      const first = generation(lockPath, 1);
      let result;
      try {
        await waitFor(ready, [holder]);
        assert.deepEqual(names(directory), [".run.json.lock.1"]);
        assert.equal(holderOf(first).pid, holder.child.pid);
        const before = snapshot(first);
        const waited = await assertRefused(new LockFile(lockPath, SHORT), first, holder.child.pid, HOST);
        assert.ok(waited >= SHORT && waited < SHORT + 60, `gave up after ${waited} s`); // gives up; how soon after is the load's
        assert.deepEqual(snapshot(first), before);
      } finally {
        result = await stop(holder);
      }
      assert.equal(result.signal, "SIGKILL");
      const lock = new LockFile(lockPath, LONG);
      const started = performance.now();
      const grant = await lock.acquire();
      assert.ok(performance.now() - started < PROMPT_MS, "succeeding a killed writer took too long");
      assert.equal(grant.generation, 2);
      assert.deepEqual(names(directory), [".run.json.lock.2"]);
      await lock.release(grant);
      assert.deepEqual(names(directory), left(2));
    }));

  test("two Node processes exclude each other", () =>
    inTemporaryDirectory(async (directory, lockPath, root) => {
      // Told to go at once, they first race to succeed a dead holder's generation 3, then do 40
      // read-modify-writes each under the lock: no increment is lost, their turns interleave,
      // and the 80 grants took 4 to 83, one each: 83 and its marker are left.
      const counter = path.join(root, "counter");
      const log = path.join(root, "log");
      const go = path.join(root, "go");
      fs.writeFileSync(counter, "0");
      fs.writeFileSync(log, "");
      plant(lockPath, 3, record({ pid: deadPid() }));
      const writers = ["a", "b"];
      const children = writers.map((name) =>
        startNode(COUNTER_WRITER, {
          LOCK: lockPath,
          COUNTER: counter,
          LOG: log,
          GO: go,
          READY: path.join(root, `ready-${name}`),
          N: String(INCREMENTS),
          NAME: name,
        }),
      );
      try {
        for (const name of writers) {
          await waitFor(path.join(root, `ready-${name}`), children);
        }
        fs.writeFileSync(go, "");
        for (const { exited } of children) {
          const result = await exited;
          assert.equal(result.code, 0, result.stderr);
        }
      } finally {
        await Promise.all(children.map(stop));
      }
      assert.equal(fs.readFileSync(counter, "utf-8"), String(2 * INCREMENTS));
      const order = fs.readFileSync(log, "utf-8").split("\n").filter(Boolean);
      assert.deepEqual([...order].sort(), [...Array(INCREMENTS).fill("a"), ...Array(INCREMENTS).fill("b")]);
      const switches = order.filter((name, i) => i > 0 && name !== order[i - 1]).length;
      assert.ok(switches >= 2, `the writers never interleaved: ${order.join(" ")}`);
      assert.deepEqual(names(directory), left(3 + 2 * INCREMENTS));
    }));
});

describe("FileJournal under the lock", () => {
  afterEach(checkAudit);

  test("after runs, their directory lists only the journals: the lock's files are hidden", () =>
    inTemporaryDirectory(async (directory) => {
      // What stays of each lock (its last generation, released) has a leading dot, as the
      // lock's staging files and the journal's temporary files do: `ls runs/` shows the runs.
      const headers = { "Content-Type": "application/json" };
      const fetch = async () => new Response('{"id":"T-1"}', { status: 201, headers });
      const client = new GatewayClient("http://127.0.0.1:9", { fetch }); // never contacted
      const tools = { ticket: new HttpTool("POST", "/tickets/v1/issues") };
      const plan = (turns) => (turns.length > 0 ? [] : [{ call_id: "c1", name: "ticket", arguments: { title: "t" } }]);
      for (const runId of ["run-1", "run-2"]) {
        const journal = new FileJournal(path.join(directory, `${runId}.json`), { lockTimeout: LONG });
        await Run.with(journal, { client, runId, flowVersion: "v1", tools }, async (run) => {
          while (!run.finished) await run.step(plan);
        });
      }
      assert.deepEqual(
        names(directory).filter((name) => !name.startsWith(".")),
        ["run-1.json", "run-2.json"],
      );
      assert.deepEqual(
        names(directory)
          .filter((name) => name.startsWith("."))
          .map((name) => name.replace(/\.lock\.[0-9]+/, ".lock.N")),
        [".run-1.json.lock.N", ".run-1.json.lock.N.released", ".run-2.json.lock.N", ".run-2.json.lock.N.released"],
      );
    }));

  test("concurrent writes through two FileJournals keep the JSON whole", () =>
    inTemporaryDirectory(async (directory) => {
      const file = path.join(directory, "run.json");
      const journals = [new FileJournal(file, { lockTimeout: LONG }), new FileJournal(file, { lockTimeout: LONG })];
      const document = await journals[0].acquire("run-1", "v1", currentWorker("w1"), 60);
      const outcomes = [];
      let done = false;
      const write = async (journal) => {
        for (let i = 0; i < 20; i++) {
          try {
            await journal.write(document, 60);
            outcomes.push("ok");
          } catch (error) {
            if (!(error instanceof RunLeaseLost)) throw error;
            outcomes.push("lost");
          }
        }
      };
      const read = async () => {
        let reads = 0;
        while (!done) {
          JSON.parse(await fs.promises.readFile(file, "utf-8"));
          assert.notEqual(await journals[1].read(), null);
          reads++;
        }
        return reads;
      };
      const reading = read();
      reading.catch(() => undefined); // awaited below
      try {
        await Promise.all(journals.map(write));
      } finally {
        done = true;
      }
      assert.ok((await reading) > 0);
      // Nobody else took the run, so every write passed the fence.
      assert.deepEqual(outcomes, Array(40).fill("ok"));
      const stored = await journals[0].read();
      assert.deepEqual([stored.lease.holder, stored.lease.token], ["w1", document.lease.token]);
      // The journal, and the generation of the 41st grant (one acquire, 40 writes) and its
      // marker: no older generation, no staging or temporary file.
      assert.equal(lastGeneration(directory), 41);
    }));

  test("a takeover is never overwritten by an old holder", () =>
    inTemporaryDirectory(async (directory) => {
      // The fence and the write are one critical section: once a new worker holds the run, no
      // write of an old one lands, not even one begun before the takeover; tokens never go back.
      const file = path.join(directory, "run.json");
      const taker = new FileJournal(file, { lockTimeout: LONG });
      let current = await taker.acquire("run-1", "v1", currentWorker("w0"), 60);
      const firstToken = current.lease.token;
      const outcomes = {};
      const tokens = [];
      let stopped = false;

      const startWriter = (name, document) => {
        const state = { takenOver: false, outcomes: [] };
        outcomes[name] = state.outcomes;
        const journal = new FileJournal(file, { lockTimeout: LONG });
        state.done = (async () => {
          for (let i = 0; i < 400; i++) {
            const after = state.takenOver;
            try {
              await journal.write(document, 60);
              state.outcomes.push([after, "ok"]);
            } catch (error) {
              if (!(error instanceof RunLeaseLost)) throw error;
              state.outcomes.push([after, "lost"]);
            }
            if (stopped || state.outcomes.filter(([seen]) => seen).length >= 5) {
              return;
            }
            await sleep(1);
          }
        })();
        state.done.catch(() => undefined); // awaited below; no unhandled rejection meanwhile
        return state;
      };
      const reading = (async () => {
        const journal = new FileJournal(file);
        while (!stopped) {
          tokens.push((await journal.read()).lease.token);
          await sleep(0);
        }
      })();
      reading.catch(() => undefined); // awaited below

      const writers = [startWriter("w0", current)];
      try {
        for (let round = 1; round <= TAKEOVERS; round++) {
          const deadline = performance.now() + CHILD_TIMEOUT_MS;
          while (outcomes[`w${round - 1}`].length < 3) {
            assert.ok(performance.now() < deadline);
            await sleep(1);
          }
          let taken = null;
          for (let attempt = 0; attempt < 200 && taken === null; attempt++) {
            // The lease ends (as when its worker lets go); its writer may renew it before the
            // next worker asks, so ask until the run is free.
            await taker.release(current);
            try {
              taken = await taker.acquire("run-1", "v1", currentWorker(`w${round}`), 60);
            } catch (error) {
              if (!(error instanceof RunLeased)) throw error;
            }
          }
          assert.ok(taken !== null, "the run was never free");
          writers.at(-1).takenOver = true;
          current = taken;
          writers.push(startWriter(`w${round}`, current));
        }
      } finally {
        for (const writer of writers.slice(0, -1)) {
          writer.takenOver = true;
        }
        await Promise.allSettled(writers.slice(0, -1).map((writer) => writer.done));
        stopped = true;
        await Promise.allSettled([writers.at(-1).done, reading]);
      }
      await Promise.all([...writers.map((writer) => writer.done), reading]);
      for (let round = 0; round < TAKEOVERS; round++) {
        const seen = outcomes[`w${round}`];
        assert.ok(seen.some(([after, outcome]) => !after && outcome === "ok"), JSON.stringify(seen));
        const after = seen.filter(([taken]) => taken).map(([, outcome]) => outcome);
        assert.ok(after.length > 0, JSON.stringify(seen));
        const message = `w${round} wrote after its run was taken: ${JSON.stringify(seen)}`;
        assert.deepEqual(new Set(after), new Set(["lost"]), message);
      }
      assert.deepEqual(tokens, [...tokens].sort((a, b) => a - b), "a fencing token went back");
      const stored = await taker.read();
      assert.deepEqual([stored.lease.holder, stored.lease.token], [`w${TAKEOVERS}`, firstToken + TAKEOVERS]);
      lastGeneration(directory);
    }));
});
