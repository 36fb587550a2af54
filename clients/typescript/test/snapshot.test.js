// loadSnapshot against a real worker process: a finished run's transcript
// snapshot (docs/protocol.md §2 Transcript snapshots) in one read.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { AgentfleetError, connect, RunNotFoundError } from "../src/index.js";
import { startWorker } from "./fleet.js";

/** @type {Awaited<ReturnType<typeof startWorker>>} */
let hub;
/** @type {import("../src/index.js").Client} */
let client;

before(async () => {
  hub = await startWorker(["--concurrency", "4"], { name: "snapshot" });
  client = await connect({ servers: hub.url });
});

after(async () => {
  await client?.close();
  await hub?.stop();
});

/** Submits a request and follows the run to its end. @param {any} request */
async function finished(request) {
  const { id } = await client.submit(request);
  for await (const _ of client.follow(id));
  return id;
}

test("loadSnapshot reads a finished run's transcript as its events hold it", async () => {
  const id = await finished({ prompt: "Hello, snapshot" });
  const snap = await client.loadSnapshot(id);
  assert.ok(snap, "a finished run has a snapshot");
  const res = await client.result(id);
  assert.equal(snap.header.run, id);
  assert.equal(snap.header.attempt, 1);
  assert.equal(snap.header.from, "");
  assert.equal(snap.header.messages, res.messages.length);
  assert.ok(snap.header.bytes > 0);
  assert.deepEqual(snap.messages, JSON.parse(JSON.stringify(res.messages)));

  // A continuation's snapshot holds the messages it continued from too.
  const next = await finished({ prompt: "And again", continueFrom: id });
  const cont = await client.loadSnapshot(next);
  assert.ok(cont);
  assert.equal(cont.header.from, id);
  assert.deepEqual(
    cont.messages.slice(0, snap.messages.length).map((m) => m.role),
    snap.messages.map((m) => m.role),
  );
  assert.equal(cont.messages.length, snap.messages.length + 2);

  await assert.rejects(client.loadSnapshot(id, { maxBytes: 10 }), (err) => err instanceof AgentfleetError && err.code === "snapshot_too_large");
});

test("loadSnapshot: null for a run that finished without running, an error for no run", async () => {
  const bad = await finished({ prompt: "x", tools: ["no_such_tool"] });
  assert.equal(await client.loadSnapshot(bad), null);
  await assert.rejects(client.loadSnapshot("no-such-run"), RunNotFoundError);
});
