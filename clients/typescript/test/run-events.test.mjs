// A finished run started again did nothing and reported nothing, so its observer printed
// nothing: it now reports `finished` when it opens, and plans nothing.

import assert from "node:assert/strict";
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { test } from "node:test";

import { FileJournal, GatewayClient, HttpTool, Run } from "../dist/index.js";

test("rerunning a finished run says it is finished", async () => {
  const directory = mkdtempSync(join(tmpdir(), "run-events-"));
  try {
    const options = {
      client: new GatewayClient("http://127.0.0.1:9"), // never called: the plans are empty
      runId: "run-done",
      flowVersion: "v1",
      tools: { create_ticket: new HttpTool("POST", "/tickets/v1/issues") },
    };
    const journal = new FileJournal(join(directory, "run-done.json"));
    await Run.with(journal, options, async (run) => {
      while (!run.finished) await run.step(() => []);
    });
    const seen = [];
    let asked = 0;
    await Run.with(journal, { ...options, onEvent: (event) => seen.push(event.kind) }, async (run) => {
      assert.equal(run.finished, true);
      assert.equal(await run.step(() => (asked += 1, [])), null);
    });
    assert.deepEqual(seen, ["finished"]);
    assert.equal(asked, 0);
  } finally {
    rmSync(directory, { recursive: true, force: true });
  }
});
