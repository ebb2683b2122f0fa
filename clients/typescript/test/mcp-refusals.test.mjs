// Every tool result the gateway writes itself on an MCP route (one per problem type and protocol
// version, clients/vectors/mcp-refusals.json, kept equal to the gateway's code by the Python suite),
// read by the official TypeScript SDK and by this client: the SDK accepts each as a tool result, and
// the client turns each into its typed problem, never a schema error.
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { describe, test } from "node:test";

import { CallToolResultSchema } from "@modelcontextprotocol/sdk/types.js";

import { Backoff, callToolWithKey, GatewayProblem } from "../dist/index.js";

const VECTORS = JSON.parse(readFileSync(new URL("../../vectors/mcp-refusals.json", import.meta.url), "utf-8"));
const UNKNOWN = "unknown outcome: may have happened, never call again";

/** An MCP client whose every tools/call is answered with `result`. */
const answering = (result) => ({ callTool: async () => structuredClone(result) });

for (const [version, results] of Object.entries(VECTORS.results)) {
  describe(`refusals written for protocol ${version}`, () => {
    test("there is one per problem type", () => {
      assert.deepEqual(Object.keys(results).sort(), Object.keys(VECTORS.rows).sort());
    });

    for (const [kind, result] of Object.entries(results)) {
      test(`${kind}: the SDK reads a tool result, the client a typed ${kind}`, async () => {
        const parsed = CallToolResultSchema.parse(result);
        assert.equal(parsed.isError, true);
        assert.equal(parsed.content.length, 1);
        assert.equal(parsed.content[0].type, "text");
        assert.equal(parsed._meta.idempotency.type, kind);
        if (VECTORS.rows[kind] === UNKNOWN) {
          assert.match(parsed.content[0].text, /may have done/);
          assert.doesNotMatch(parsed.content[0].text, /refused|did not happen|not made/i);
        }
        await assert.rejects(
          callToolWithKey(answering(result), { name: "create_ticket", arguments: {} }, "k-1", {
            backoff: new Backoff({ attempts: 1 }),
          }),
          (error) => {
            assert.ok(error instanceof GatewayProblem, `${kind}: ${error}`);
            assert.equal(error.kind, kind);
            if (VECTORS.rows[kind] === UNKNOWN) {
              assert.notEqual(error.safeToRetry, true);
            }
            return true;
          },
        );
      });
    }
  });
}
