// Writes dist/cjs/package.json ({"type": "commonjs"}) after `tsc -p tsconfig.cjs.json`: inside
// this "type": "module" package, it makes Node and TypeScript read the CommonJS build's .js
// and .d.ts files as CommonJS (`npm run build` runs it).
import { writeFileSync } from "node:fs";

writeFileSync(new URL("../dist/cjs/package.json", import.meta.url), `${JSON.stringify({ type: "commonjs" }, null, 2)}\n`);
