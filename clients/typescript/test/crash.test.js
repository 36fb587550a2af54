// Following a run across failures: its worker killed (kill -9) while the
// run sleeps in a tool, another worker resuming it; and the NATS server
// itself killed and restarted under a follower. The follow goes on to the
// end with no gap, and reads what a replay and `submit follow --json` read.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";

import { connect, formatEnvelope, Transcript } from "../src/index.js";
import { startWorker, submit, freePort, tempDir, sleeper } from "./fleet.js";

/** @type {Array<{stop(): Promise<void>}>} */
const procs = [];
after(async () => {
  for (const p of procs.reverse()) await p.stop();
});

/**
 * Follows a run in the background: resolves `started` at the first
 * tool_execution_start, `done` with the envelopes at the end.
 * @param {import("../src/index.js").Client} client @param {string} run
 */
function background(client, run) {
  /** @type {Error[]} */
  const warnings = [];
  /** @type {(v?: unknown) => void} */
  let onStart = () => {};
  const started = new Promise((r) => (onStart = r));
  const done = (async () => {
    const envs = [];
    for await (const env of client.follow(run, { onWarning: (w) => warnings.push(w) })) {
      envs.push(env);
      if (env.event.type === "tool_execution_start") onStart();
    }
    return envs;
  })();
  done.catch(() => onStart());
  return { started, done, warnings };
}

/** Checks the readers' view: each attempt's seqs 1..n without gaps, one run_finished at the end. @param {any[]} envs */
function checkGapless(envs) {
  /** @type {Map<number, number>} */
  const last = new Map();
  for (const e of envs) {
    assert.equal(e.seq, (last.get(e.attempt) ?? 0) + 1, `attempt ${e.attempt}: seq ${e.seq} after ${last.get(e.attempt) ?? 0}`);
    last.set(e.attempt, e.seq);
  }
  assert.equal(envs.filter((e) => e.event.type === "run_finished").length, 1);
  assert.equal(envs.at(-1).event.type, "run_finished");
  for (let i = 1; i < envs.length; i++) assert.ok(envs[i].streamSeq > envs[i - 1].streamSeq);
}

test("a follow goes on across a worker killed with kill -9 and another resuming the run", async () => {
  const hub = await startWorker([], { name: "hub" });
  procs.push(hub);
  const crashArgs = ["--nats", hub.url, "--queue", "crash", "--ack-wait", "3s"];
  const a = await startWorker(crashArgs, { name: "a" });
  procs.push(a);
  const client = await connect({ servers: hub.url });
  try {
    const { id } = await client.submit(sleeper(60), { queue: "crash" });
    const f = background(client, id);
    await f.started;
    await a.kill();
    const b = await startWorker(crashArgs, { name: "b" });
    procs.push(b);
    const envs = await f.done;
    assert.deepEqual(f.warnings, []);
    checkGapless(envs);
    const attempts = [...new Set(envs.map((e) => e.attempt))];
    assert.ok(attempts.length >= 2, `attempts ${attempts}`);
    const resumed = envs.find((e) => e.event.type === "run_resumed");
    assert.ok(resumed && resumed.attempt >= 2);
    const fin = envs.at(-1).event;
    assert.equal(fin.type, "run_finished");
    assert.equal(fin.status, "succeeded");
    const t = new Transcript();
    for (const e of envs) t.apply(e);
    const result = t.messages.find((m) => m.role === "toolResult");
    assert.ok(result && result.role === "toolResult" && result.isError);
    assert.match(JSON.stringify(result.content), /worker stopped before the result of this tool call was recorded/);
    assert.equal(t.finalText(), "One, two, three.");
    // What a replay and submit follow --json read.
    const replay = [];
    for await (const env of client.follow(id, { includeUnknown: true })) replay.push(formatEnvelope(env) + "\n");
    assert.deepEqual(replay, envs.map((e) => formatEnvelope(e) + "\n"));
    const go = await submit(hub.url, ["follow", "--json", id]);
    assert.equal(go.stdout, replay.join(""));
  } finally {
    await client.close();
  }
});

test("a follow goes on across the NATS server killed with kill -9 and restarted", async () => {
  const port = await freePort();
  const dataDir = tempDir("nats");
  let hub = await startWorker([], { name: "hub2", port, dataDir });
  procs.push(hub);
  const w = await startWorker(["--nats", hub.url, "--queue", "crash2", "--ack-wait", "20s"], { name: "w" });
  procs.push(w);
  // A short stall interval: the follower checks the stream after 1 s without news.
  const client = await connect({ servers: hub.url, followStallMs: 500 });
  try {
    const { id } = await client.submit(sleeper(3), { queue: "crash2" });
    const f = background(client, id);
    await f.started;
    await hub.kill();
    hub = await startWorker([], { name: "hub2", port, dataDir });
    procs.push(hub);
    const envs = await f.done;
    assert.deepEqual(f.warnings, []);
    checkGapless(envs);
    assert.equal(envs.at(-1).event.type, "run_finished");
    assert.equal(/** @type {any} */ (envs.at(-1).event).status, "succeeded");
    const replay = [];
    for await (const env of client.follow(id)) replay.push(formatEnvelope(env));
    assert.deepEqual(
      replay,
      envs.map((e) => formatEnvelope(e)),
    );
  } finally {
    await client.close();
  }
});
