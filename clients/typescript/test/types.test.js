// The generated files are what scripts/gen-types.js writes from the
// checked-in schemas (run `npm run gen` after `go generate ./protocol`), and
// the types compile: the declarations, an application using them
// (test/typecheck.ts), and the JavaScript checked against them.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { execFile } from "node:child_process";
import { promisify } from "node:util";

import { generate } from "../scripts/gen-types.js";
import { pkgDir } from "./fleet.js";

test("the generated types are up to date with protocol/*.schema.json", () => {
  for (const [path, text] of Object.entries(generate())) {
    assert.ok(readFileSync(join(pkgDir, path), "utf8") === text, `${path} is not what scripts/gen-types.js writes from protocol/*.schema.json: run npm run gen in clients/typescript`);
  }
});

test("the types compile (tsc): declarations, their use, and the implementation against them", async () => {
  const tsc = join(pkgDir, "node_modules/typescript/bin/tsc");
  const run = promisify(execFile);
  await Promise.all(
    ["tsconfig.json", "tsconfig.impl.json"].map((p) =>
      run(process.execPath, [tsc, "-p", p], { cwd: pkgDir }).catch((err) => assert.fail(`tsc -p ${p}:\n${err.stdout}${err.stderr}`)),
    ),
  );
});

test("the package as published: its exports resolve by name, and npm pack ships what they name", async () => {
  const main = await import("@agentfleet/client");
  const web = await import("@agentfleet/client/console");
  assert.equal(typeof main.connect, "function");
  assert.equal(typeof web.ConsoleClient, "function");
  assert.equal(main.PROTOCOL_VERSION, web.PROTOCOL_VERSION);
  const { stdout } = await promisify(execFile)("npm", ["pack", "--dry-run", "--json"], { cwd: pkgDir });
  const files = new Set(JSON.parse(stdout)[0].files.map((/** @type {{path: string}} */ f) => f.path));
  const pkg = JSON.parse(readFileSync(join(pkgDir, "package.json"), "utf8"));
  for (const target of Object.values(pkg.exports).flatMap((e) => (typeof e === "string" ? [e] : Object.values(e)))) {
    assert.ok(files.has(target.replace(/^\.\//, "")), `npm pack leaves out ${target}`);
  }
  for (const f of files) assert.ok(!/^(test|scripts)\//.test(f) && !f.includes("node_modules"), `npm pack ships ${f}`);
});
