#!/usr/bin/env node
// Follow throughput: one faux run of many text deltas, followed live by this
// client, then replayed (stored) by this client (decoding every envelope),
// by this client printing the `submit follow --json` lines, and by `submit
// follow --json` itself (a process: start, connect, replay, print).
//
//   NATS_URL=nats://127.0.0.1:4222 node scripts/bench-follow.js [--deltas 20000] [--rounds 5] [--submit PATH]
//
// Needs a worker that allows faux (a worker without a model endpoint does).
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { connect, formatEnvelope } from "../src/index.js";

const args = process.argv.slice(2);
const opt = (/** @type {string} */ name, /** @type {string} */ def) => {
  const i = args.indexOf(name);
  return i >= 0 ? args[i + 1] : def;
};
const deltas = Number(opt("--deltas", "20000"));
const rounds = Number(opt("--rounds", "5"));
const submitBin = opt("--submit", "");

const client = await connect();
const run = promisify(execFile);
const { id } = await client.submit({ model: "faux/bench", prompt: "talk", faux: { tokenSize: 1, responses: [{ content: [{ type: "text", text: "abcd".repeat(deltas) }] }] } });
// Live: this client and, at the same time, submit follow --json.
let n = 0;
let t = performance.now();
const goLive = submitBin ? run(submitBin, ["follow", "--json", id], { maxBuffer: 1 << 30 }).then(() => performance.now() - t) : null;
for await (const _ of client.follow(id)) n++;
const live = performance.now() - t;
const goLiveMs = goLive ? await goLive : 0;

/** @param {string} name @param {() => Promise<number>} fn */
async function measure(name, fn) {
  const times = [];
  for (let i = 0; i < rounds; i++) {
    const t0 = performance.now();
    const count = await fn();
    times.push(performance.now() - t0);
    if (count !== n) throw new Error(`${name}: ${count} events, want ${n}`);
  }
  times.sort((a, b) => a - b);
  const med = times[Math.floor(times.length / 2)];
  console.log(`${name.padEnd(44)} median ${med.toFixed(0).padStart(5)} ms  ${Math.round((n / med) * 1000).toLocaleString("en").padStart(8)} events/s  (best ${times[0].toFixed(0)} ms)`);
}

console.log(`run ${id}: ${n} events; followed live in ${live.toFixed(0)} ms (${Math.round((n / live) * 1000).toLocaleString("en")} events/s, bound by the worker)` + (goLive ? `; submit follow --json beside it: ${goLiveMs.toFixed(0)} ms` : ""));
await measure("replay, decoded (follow)", async () => {
  let c = 0;
  for await (const _ of client.follow(id)) c++;
  return c;
});
await measure("replay, printed as --json lines (to /dev/null)", async () => {
  let c = 0;
  let out = "";
  for await (const env of client.follow(id, { includeUnknown: true })) {
    out += formatEnvelope(env) + "\n";
    if (out.length > 1 << 16) out = "";
    c++;
  }
  return c;
});
if (submitBin) {
  await measure("submit follow --json (a process)", async () => {
    const { stdout } = await run(submitBin, ["follow", "--json", id], { maxBuffer: 1 << 30, env: { ...process.env, NO_COLOR: "1" } });
    return stdout.split("\n").length - 1;
  });
}
await client.close();
