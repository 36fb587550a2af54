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
