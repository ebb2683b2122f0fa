// Real servers for the Node tests, all on 127.0.0.1 with ports the OS picks:
// the project's gateway (`python -m gateway serve`, from the project's .venv, as
// production runs it), the example ticket tool API, and a slow upstream of our own.
import { spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { createServer } from "node:http";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { fileURLToPath } from "node:url";

export const ROOT = fileURLToPath(new URL("../../../../", import.meta.url));

/** The project's Python (the gateway and the tool API run from the project's .venv). */
export function python() {
  const interpreter = process.env.GATEWAY_PYTHON ?? join(ROOT, ".venv", "bin", "python");
  if (!existsSync(interpreter)) {
    throw new Error(`${interpreter} is missing: run \`make .venv/.installed\` in ${ROOT} first (make test does)`);
  }
  return interpreter;
}

/** A temporary directory removed when the test process ends. */
export function temporaryDirectory(prefix = "igw-") {
  const directory = mkdtempSync(join(tmpdir(), prefix));
  process.once("exit", () => rmSync(directory, { recursive: true, force: true }));
  return directory;
}

/**
 * Start `command`, resolve with its first stdout line matching `ready`. `seconds` only bounds
 * a start that hangs: generous, since a loaded machine may take many seconds to start Python.
 */
export function startProcess(command, args, { ready, seconds = 120, env = {}, cwd = ROOT } = {}) {
  const child = spawn(command, args, { cwd, env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
  // Whatever ends this test file (a failed before(), an uncaught error), its servers end too.
  const orphaned = () => child.kill("SIGKILL");
  process.once("exit", orphaned);
  child.once("exit", () => process.off("exit", orphaned));
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  const lines = createInterface({ input: child.stdout });
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => {
      child.kill("SIGKILL");
      reject(new Error(`${command} ${args.join(" ")}: no ready line in ${seconds} s\n${stderr}`));
    }, seconds * 1000);
    child.once("exit", (code) => {
      clearTimeout(timer);
      reject(new Error(`${command} ${args.join(" ")} exited with ${code} before it was ready\n${stderr}`));
    });
    lines.on("line", (line) => {
      if (ready.test(line)) {
        clearTimeout(timer);
        child.removeAllListeners("exit");
        resolve({ child, line, stderr: () => stderr });
      }
    });
  });
}

/** Stop a started process: SIGTERM, then SIGKILL after `seconds`. */
export async function stopProcess(child, seconds = 10) {
  if (child.exitCode !== null || child.signalCode !== null) {
    return;
  }
  const exited = new Promise((resolve) => child.once("exit", resolve));
  child.kill("SIGTERM");
  const timer = setTimeout(() => child.kill("SIGKILL"), seconds * 1000);
  await exited;
  clearTimeout(timer);
}

/** The example ticket API (`python -m examples.tool_api --port 0`); `stats()` counts its effects. */
export async function startToolApi() {
  const { child, line } = await startProcess(python(), ["-m", "examples.tool_api", "--port", "0"], {
    ready: /tool API listening on /,
  });
  const url = line.trim().split(" ").at(-1);
  return {
    url,
    async stats() {
      const response = await fetch(`${url}/v1/stats`);
      return response.json();
    },
    async issues() {
      const response = await fetch(`${url}/v1/issues`);
      return (await response.json()).items;
    },
    stop: () => stopProcess(child),
  };
}

/**
 * An upstream that holds every `POST /hold/<name>` until the test calls `release(name)` (or
 * stops it), and counts the effects it applied. How long a request takes is an event the
 * test controls, never a delay that load can stretch past a route's timeout or shrink below
 * it. `arrived(name)` resolves once the gateway has forwarded a request for `name`.
 */
export async function startHeldUpstream() {
  let effects = 0;
  const holds = new Map();
  const hold = (name) => {
    if (!holds.has(name)) {
      const entry = {};
      entry.arrived = new Promise((resolve) => (entry.arrive = resolve));
      entry.released = new Promise((resolve) => (entry.release = resolve));
      holds.set(name, entry);
    }
    return holds.get(name);
  };
  const server = createServer((request, response) => {
    const name = /\/hold\/([^/?]+)/.exec(request.url ?? "")?.[1] ?? "";
    request.resume();
    request.on("end", () => {
      effects += 1;
      const id = `S-${effects}`;
      const entry = hold(name);
      entry.arrive();
      entry.released.then(() => {
        if (!response.destroyed) {
          response.writeHead(201, { "Content-Type": "application/json" });
          response.end(JSON.stringify({ id }));
        }
      });
    });
  });
  await new Promise((resolve) => server.listen(0, "127.0.0.1", resolve));
  const { port } = server.address();
  return {
    url: `http://127.0.0.1:${port}`,
    effects: () => effects,
    arrived: (name) => hold(name).arrived,
    release: (name) => hold(name).release(),
    stop: () =>
      new Promise((resolve) => {
        server.close(resolve);
        server.closeAllConnections();
      }),
  };
}

const toml = (value) => JSON.stringify(value);

/**
 * The gateway, as production runs it, with route /tickets in front of `upstream`. With a
 * `heldUpstream` (`startHeldUpstream`), two routes in front of it: /slow with a short timeout
 * (its requests are never released: each times out) and /held with a timeout no test reaches
 * (its requests answer when the test releases them). `lease` sets `[idempotency] lease`.
 */
export async function startGateway({
  upstream,
  heldUpstream,
  directory = temporaryDirectory(),
  extraRoutes = [],
  lease = null,
}) {
  const config = join(directory, "gateway.toml");
  // The route timeouts are not what these tests are about (but /slow's): generous, so load
  // never turns a slow answer into a 504.
  const routes = [
    `[[routes]]\nname = "tickets"\nprefix = "/tickets"\nupstream = ${toml(upstream)}\ntimeout = "60s"\n`,
  ];
  if (heldUpstream) {
    routes.push(`[[routes]]\nname = "slow"\nprefix = "/slow"\nupstream = ${toml(heldUpstream)}\ntimeout = "300ms"\n`);
    routes.push(`[[routes]]\nname = "held"\nprefix = "/held"\nupstream = ${toml(heldUpstream)}\ntimeout = "10m"\n`);
  }
  routes.push(...extraRoutes);
  writeFileSync(
    config,
    [
      `[server]\nhost = "127.0.0.1"\nport = 0\n`,
      `[store]\nurl = ${toml(`sqlite:///${join(directory, "gateway.db")}`)}\n`,
      // One agent without credentials, as most tests here: callers share one scope.
      `[idempotency]\nshared_scope = true\n${lease === null ? "" : `lease = ${toml(lease)}\n`}`,
      `[logging]\nlevel = "warning"\nformat = "text"\n`,
      ...routes,
    ].join("\n"),
  );
  const { child, line, stderr } = await startProcess(python(), ["-m", "gateway", "serve", "--config", config], {
    ready: /idempotency gateway listening on /,
  });
  return { url: line.trim().split(" ").at(-1), directory, stderr, stop: () => stopProcess(child) };
}

/** The example MCP server (`python -m examples.mcp_server --port 0`): its endpoint URL. */
export async function startMcpServer() {
  const { child, line } = await startProcess(python(), ["-m", "examples.mcp_server", "--port", "0"], {
    ready: /MCP server listening on /,
  });
  return { url: line.trim().split(" ").at(-1), stop: () => stopProcess(child) };
}

/** The gateway's MCP route `/mcp` in front of an MCP server's endpoint (as config/gateway.toml has it). */
export function mcpRoute(endpoint) {
  return `[[routes]]\nname = "mcp-tools"\nkind = "mcp"\nprefix = "/mcp"\nupstream = ${toml(endpoint)}\ntimeout = "60s"\n`;
}
