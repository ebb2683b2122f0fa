// A lease held by a worker of this host that is dead: a restart takes it over at once.
//
// A worker killed while its parent has not reaped it is a zombie: its pid answers
// `kill(pid, 0)`, and the check counted it alive, so a restart waited out the whole lease
// (RunLeased). It runs no code and holds nothing: it is dead here.

import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { hostname } from "node:os";
import { createInterface } from "node:readline";
import { test } from "node:test";
import { setTimeout as sleep } from "node:timers/promises";

import { isLive } from "../dist/index.js";

function state(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, "latin1");
  return stat.slice(stat.lastIndexOf(")") + 1).trim().split(" ")[0];
}

test("a zombie worker's lease is not live", { skip: process.platform !== "linux" }, async () => {
  // `sh` starts a child in the background and becomes `sleep`, which never reaps it. The
  // child outlives the exec by a second: a `true` could exit first, and sh reap it.
  const parent = spawn("sh", ["-c", "sleep 1 & echo $!; exec sleep 30"], { stdio: ["ignore", "pipe", "inherit"] });
  try {
    const [line] = await createInterface({ input: parent.stdout })[Symbol.asyncIterator]().next().then((r) => [r.value]);
    const pid = Number(line);
    const deadline = Date.now() + 30_000;
    while (state(pid) !== "Z") {
      assert.ok(Date.now() < deadline, "the child did not exit");
      await sleep(10);
    }
    const lease = { holder: "ghost", host: hostname(), pid, token: 1, expires_at: Date.now() / 1000 + 3600 };
    assert.equal(isLive(lease, Date.now() / 1000), false);
    assert.equal(isLive({ ...lease, pid: process.pid }, Date.now() / 1000), true);
  } finally {
    parent.kill("SIGKILL");
  }
});
