// The package as npm ships it: `npm pack`, then the tarball installed into a CommonJS
// project and an ES module project, each with plain JavaScript and strict TypeScript, run
// with node. The tarball is packed from the build `npm test` makes first (pretest), so the
// other test files never see dist/ rewritten under them. TypeScript and @types/node are this
// package's own dev dependencies; the client has no runtime dependency, so the installs are
// offline.
import assert from "node:assert/strict";
import { execFile } from "node:child_process";
import { mkdirSync, readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { temporaryDirectory } from "./support/servers.mjs";

const PACKAGE_DIR = fileURLToPath(new URL("..", import.meta.url));
const MANIFEST = JSON.parse(readFileSync(join(PACKAGE_DIR, "package.json"), "utf8"));
const TSC = join(PACKAGE_DIR, "node_modules", "typescript", "bin", "tsc");
const TYPE_ROOTS = join(PACKAGE_DIR, "node_modules", "@types");

// What every consumer program prints: a key, the typed error a problem answer became (an
// instanceof check across the package's modules), and a FileJournal's read of no file.
const EXPECTED = "run-1:0:c1 outcome-unknown empty";
const NAMES = "deriveKey, FileJournal, GatewayClient, GatewayProblem, OutcomeUnknown, PROBLEM_BASE_URI";

/** The consumer program, after `header` (its import or require); `typed` adds TypeScript's annotations. */
function program(header, typed) {
  const type = (annotation) => (typed ? annotation : "");
  return `${header}

async function main(path${type(": string")})${type(": Promise<string>")} {
  const key = deriveKey("run-1", 0, "c1");
  const problem = { type: \`\${PROBLEM_BASE_URI}outcome-unknown\`, title: "Outcome unknown", status: 504, key };
  const gateway = new GatewayClient("http://127.0.0.1:9", {
    fetch: async () =>
      new Response(JSON.stringify(problem), { status: 504, headers: { "Content-Type": "application/problem+json" } }),
  });
  let caught = "nothing";
  try {
    await gateway.post("/tickets/v1/issues", { key, json: { title: "Printer on fire" } });
  } catch (error) {
    caught = error instanceof OutcomeUnknown && error instanceof GatewayProblem ? error.kind : String(error);
  }
  const journal = await new FileJournal(path).read();
  return \`\${key} \${caught} \${journal === null ? "empty" : "found"}\`;
}

main(process.argv[2] ?? "absent.json").then(console.log, (error${type(": unknown")}) => {
  console.error(error);
  process.exitCode = 1;
});
`;
}

const IMPORT = `import { ${NAMES} } from "idempotency-gateway-client";`;
const REQUIRE = `const { ${NAMES} } = require("idempotency-gateway-client");`;

/** Run a command to its end: its exit code and output, never a throw. */
function run(command, args, cwd) {
  return new Promise((resolve) => {
    execFile(command, args, { cwd, encoding: "utf8", timeout: 120_000 }, (error, stdout, stderr) => {
      resolve({ code: error ? (error.code ?? 1) : 0, stdout, stderr, output: `${stdout}${stderr}` });
    });
  });
}

async function succeed(command, args, cwd) {
  const result = await run(command, args, cwd);
  assert.equal(result.code, 0, `${command} ${args.join(" ")} in ${cwd} failed:\n${result.output}`);
  return result;
}

/** A project of its own, `type` its package.json's "type" (none: CommonJS). */
function project(root, name, type) {
  const directory = join(root, name);
  mkdirSync(directory);
  const manifest = { name, version: "0.0.0", private: true, ...(type ? { type } : {}) };
  writeFileSync(join(directory, "package.json"), JSON.stringify(manifest, null, 2));
  return directory;
}

/** Strict TypeScript with `module`, this package's @types/node, compiled into out-<module>/. */
function tsconfig(directory, module) {
  const compilerOptions = {
    target: "ES2022",
    lib: ["ES2022"],
    module,
    strict: true,
    skipLibCheck: false,
    types: ["node"],
    typeRoots: [TYPE_ROOTS],
    outDir: `out-${module}`,
  };
  const path = join(directory, `tsconfig.${module}.json`);
  writeFileSync(path, JSON.stringify({ compilerOptions, files: ["index.ts"] }, null, 2));
  return path;
}

let packed;
let commonjs;
let esm;

before(async () => {
  const root = temporaryDirectory("igw-package-");
  const pack = await succeed("npm", ["pack", "--json", "--ignore-scripts", "--pack-destination", root], PACKAGE_DIR);
  [packed] = JSON.parse(pack.stdout);
  const tarball = join(root, packed.filename);
  commonjs = project(root, "commonjs-consumer", null);
  esm = project(root, "esm-consumer", "module");
  const install = ["install", "--offline", "--ignore-scripts", "--no-audit", "--no-fund", "--no-package-lock", tarball];
  await Promise.all([succeed("npm", install, commonjs), succeed("npm", install, esm)]);

  writeFileSync(join(commonjs, "main.cjs"), program(REQUIRE, false));
  writeFileSync(join(commonjs, "index.ts"), program(IMPORT, true));
  writeFileSync(join(esm, "main.mjs"), program(IMPORT, false));
  writeFileSync(join(esm, "index.ts"), program(IMPORT, true));
});

test("the tarball holds README.md, LICENSE, package.json, and both builds with their types", () => {
  const files = new Set(packed.files.map((file) => file.path));
  for (const path of ["README.md", "LICENSE", "package.json", "dist/cjs/package.json"]) {
    assert.ok(files.has(path), `${path} is not packed: ${[...files].join(", ")}`);
  }
  const modules = [...files].filter((path) => /^dist\/[^/]+\.js$/.test(path));
  assert.ok(modules.includes("dist/index.js"), [...files].join(", "));
  for (const module of modules) {
    const name = module.slice("dist/".length, -".js".length);
    for (const twin of [`dist/${name}.d.ts`, `dist/cjs/${name}.js`, `dist/cjs/${name}.d.ts`]) {
      assert.ok(files.has(twin), `${module} is packed without ${twin}`);
    }
  }
  const stray = [...files].filter((path) => !path.startsWith("dist/") && !["README.md", "LICENSE", "package.json"].includes(path));
  assert.deepEqual(stray, []);
});

test("the packed package has no runtime dependency and names one version", () => {
  const installed = join(esm, "node_modules", "idempotency-gateway-client");
  const manifest = JSON.parse(readFileSync(join(installed, "package.json"), "utf8"));
  assert.equal(manifest.dependencies, undefined);
  assert.equal(manifest.version, MANIFEST.version);
  assert.deepEqual(JSON.parse(readFileSync(join(installed, "dist", "cjs", "package.json"), "utf8")), { type: "commonjs" });
});

test("the README in the tarball links nothing relative (the repository is not there)", () => {
  const readme = readFileSync(join(esm, "node_modules", "idempotency-gateway-client", "README.md"), "utf8");
  const relative = [...readme.matchAll(/\]\(([^)]+)\)/g)].map((match) => match[1]).filter((target) => !/^(https?:|#)/.test(target));
  assert.deepEqual(relative, []);
});

test("CommonJS: a .cjs script require()s it", async () => {
  const { stdout } = await succeed(process.execPath, ["main.cjs"], commonjs);
  assert.equal(stdout.trim(), EXPECTED);
});

test("CommonJS: require('idempotency-gateway-client/package.json') is exported", async () => {
  const script = "console.log(require('idempotency-gateway-client/package.json').version)";
  const { stdout } = await succeed(process.execPath, ["-e", script], commonjs);
  assert.equal(stdout.trim(), MANIFEST.version);
});

for (const module of ["commonjs", "node16"]) {
  test(`CommonJS: strict TypeScript with module ${module} type-checks, compiles to require() and runs`, async () => {
    await succeed(process.execPath, [TSC, "-p", tsconfig(commonjs, module)], commonjs);
    const compiled = readFileSync(join(commonjs, `out-${module}`, "index.js"), "utf8");
    assert.match(compiled, /require\("idempotency-gateway-client"\)/);
    const { stdout } = await succeed(process.execPath, [`out-${module}/index.js`], commonjs);
    assert.equal(stdout.trim(), EXPECTED);
  });
}

test("ES module: an .mjs script imports it", async () => {
  const { stdout } = await succeed(process.execPath, ["main.mjs"], esm);
  assert.equal(stdout.trim(), EXPECTED);
});

test("ES module: strict TypeScript with module nodenext type-checks, compiles to import and runs", async () => {
  await succeed(process.execPath, [TSC, "-p", tsconfig(esm, "nodenext")], esm);
  const compiled = readFileSync(join(esm, "out-nodenext", "index.js"), "utf8");
  assert.match(compiled, /^import .* from "idempotency-gateway-client";$/m);
  const { stdout } = await succeed(process.execPath, ["out-nodenext/index.js"], esm);
  assert.equal(stdout.trim(), EXPECTED);
});
