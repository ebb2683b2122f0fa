// Run an agent process to its end, or kill -9 it at the step boundary it pauses at.
import { spawn } from "node:child_process";
import { createInterface } from "node:readline";

import { python, ROOT } from "./servers.mjs";

export const NODE_AGENT = new URL("./agent.mjs", import.meta.url).pathname;
export const PYTHON_AGENT = `${ROOT}tests/agent_script.py`;

/**
 * Run `command args`; with `pauseAt`, SIGKILL it as soon as it prints `PAUSED <pauseAt>`.
 * Resolves once the process is reaped (a zombie's pid would still look alive to the
 * next worker) with its exit code, signal, stdout and stderr. Bounded by `seconds`, which
 * only ends a hung agent: generous, since a loaded machine may take many seconds to start one.
 */
export function runAgent(command, args, { pauseAt, seconds = 180, env = process.env } = {}) {
  const child = spawn(command, [...args, ...(pauseAt ? ["--pause-at", pauseAt] : [])], {
    cwd: ROOT,
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  let stdout = "";
  let stderr = "";
  child.stderr.on("data", (chunk) => (stderr += chunk));
  createInterface({ input: child.stdout }).on("line", (line) => {
    stdout += line + "\n";
    if (pauseAt && line.trim() === `PAUSED ${pauseAt}`) {
      child.kill("SIGKILL");
    }
  });
  const timer = setTimeout(() => child.kill("SIGKILL"), seconds * 1000);
  return new Promise((resolve) => {
    child.once("close", (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, pid: child.pid });
    });
  });
}

export const nodeAgent = (args, options) => runAgent(process.execPath, [NODE_AGENT, ...args], options);
export const pythonAgent = (args, options) => runAgent(python(), [PYTHON_AGENT, ...args], options);
