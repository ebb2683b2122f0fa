// The TypeScript SDK's 2.x line (`@modelcontextprotocol/client`) through the gateway's MCP
// route, in both protocol generations: by default it speaks 2025-11-25 (initialize, a
// session); with `versionNegotiation: { mode: "auto" }` it lands on 2026-07-28 against a
// server that speaks it. Either way a keyed call runs once, its retry is replayed, and a
// key reused for other arguments is refused as a tool result the SDK hands over.
import assert from "node:assert/strict";
import { after, before, describe, test } from "node:test";

import { Client, StreamableHTTPClientTransport } from "@modelcontextprotocol/client";

import { deriveKey } from "../dist/index.js";
import { mcpRoute, startGateway, startMcpServer, startToolApi } from "./support/servers.mjs";

let server;
let tools;
let gateway;

before(async () => {
  [server, tools] = await Promise.all([startMcpServer(), startToolApi()]);
  gateway = await startGateway({ upstream: tools.url, extraRoutes: [mcpRoute(server.url)] });
});

after(async () => {
  await Promise.all([gateway?.stop(), server?.stop(), tools?.stop()]);
});

const GENERATIONS = [
  ["the default (legacy)", {}, "2025-11-25"],
  ["versionNegotiation auto", { versionNegotiation: { mode: "auto" } }, "2026-07-28"],
];

async function connected(options) {
  const client = new Client({ name: "node-tests-2x", version: "1.0.0" }, options);
  await client.connect(new StreamableHTTPClientTransport(new URL(`${gateway.url}/mcp`)));
  return client;
}

const call = (client, title, key) =>
  client.callTool({ name: "create_ticket", arguments: { title }, _meta: { idempotencyKey: key } });

for (const [name, options, version] of GENERATIONS) {
  describe(`@modelcontextprotocol/client 2.x, ${name}`, () => {
    test(`lands on ${version}; a keyed call runs once and its retry is replayed`, async () => {
      const key = deriveKey(`ts2-${version}`, 0, "c1");
      const first = await connected(options);
      assert.equal(first.getNegotiatedProtocolVersion(), version);
      const made = await call(first, "Printer on fire", key);
      await first.close();
      const second = await connected(options); // a new connection: the agent restarted
      const again = await call(second, "Printer on fire", key);
      const listed = await second.callTool({ name: "list_tickets", arguments: {} });
      await second.close();
      assert.equal(made.isError ?? false, false);
      assert.deepEqual(again.structuredContent, made.structuredContent);
      assert.equal(again._meta?.idempotencyReplayed, true);
      const ours = listed.structuredContent.items.filter((ticket) => ticket.title === "Printer on fire");
      assert.equal(ours.filter((ticket) => ticket.id === made.structuredContent.id).length, 1);
    });

    test("a key reused for other arguments is an isError result naming key-mismatch", async () => {
      const key = deriveKey(`ts2-mismatch-${version}`, 0, "c1");
      const client = await connected(options);
      await call(client, "one", key);
      const refused = await call(client, "two", key);
      await client.close();
      assert.equal(refused.isError, true);
      assert.equal(refused._meta?.idempotency?.type, "key-mismatch");
      assert.match(refused.content[0].text, /already used for a different tool call/);
    });
  });
}
