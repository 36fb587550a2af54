// Listing pages of queued runs (docs/protocol.md §7, "Listing runs"): the
// read of the records written since the listing began is bounded by
// maxScan, and a run picked up between the first page's read of the
// records' top and its read of the queued runs is listed once.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/index.js";
import { startWorker } from "./fleet.js";

let hub, client;
before(async () => {
  hub = await startWorker(["--concurrency", "2"], { name: "listhub" });
  client = await connect({ servers: hub.url });
});
after(async () => { await client?.close(); await hub?.stop(); });

/** A queue with no worker: its runs stay queued. @param {string} queue */
async function parkedRuns(queue) {
  const parked = await startWorker(["--nats", hub.url, "--queue", queue], { name: queue });
  await parked.stop();
  const runs = [];
  for (let i = 0; i < 5; i++) runs.push(await client.submit({ prompt: `page ${i}` }, { queue }));
  return runs.sort((a, b) => (a.id < b.id ? -1 : 1));
}

/** A record written as a worker would. @param {string} id @param {string} queue @param {number} requestSeq */
async function putRecord(id, queue, requestSeq = 0) {
  const kv = await client.records();
  const r = { id, queue, state: "running", attempt: 1, requestSeq, heartbeatAt: new Date().toISOString(), turns: 0, usage: {}, cost: 0 };
  await kv.put(id, JSON.stringify(r));
}

test("list: a queued page's read above top is bounded by maxScan and marked truncated", async () => {
  const runs = await parkedRuns("scanq");
  const p1 = await client.list({ queue: "scanq", limit: 2, maxScan: 50 });
  assert.deepEqual(p1.records.map((r) => r.id), runs.slice(0, 2).map((r) => r.id));
  for (let i = 0; i < 600; i++) await putRecord(`hb${String(i % 300).padStart(4, "0")}`, "other"); // heartbeats since
  const p2 = await client.list({ queue: "scanq", limit: 2, maxScan: 50, before: p1.nextCursor });
  assert.ok(p2.scanned <= 50, `page 2 scanned ${p2.scanned}, maxScan 50`);
  assert.equal(p2.truncated, true);
  assert.deepEqual(p2.records.map((r) => r.id), runs.slice(2, 4).map((r) => r.id));
});

test("list: a run picked up between the records' top and the queued runs is listed once", async () => {
  const runs = await parkedRuns("raceq");
  let done = false;
  client.beforeListQueued = async () => {
    if (done) return;
    done = true; // a worker picks the first one up
    await putRecord(runs[0].id, "raceq", runs[0].seq);
  };
  const seen = [];
  let before = "";
  try {
    for (let n = 0; n < 10; n++) {
      const page = await client.list({ queue: "raceq", limit: 2, ...(before ? { before } : {}) });
      seen.push(...page.records.map((r) => r.id));
      if (!page.nextCursor) break;
      before = page.nextCursor;
    }
  } finally {
    client.beforeListQueued = undefined;
  }
  assert.deepEqual(seen.sort(), runs.map((r) => r.id));
});

test("list: a queued page whose read above top spends maxScan still has a cursor to the records", async () => {
  const runs = await parkedRuns("spentq");
  const olds = [];
  for (let i = 0; i < 5; i++) { // records of the queue at or below top
    olds.push(`spentold${i}`);
    await putRecord(`spentold${i}`, "spentq");
  }
  const seen = new Map();
  const count = (/** @type {{records: {id: string}[]}} */ p) => { for (const r of p.records) seen.set(r.id, (seen.get(r.id) ?? 0) + 1); };
  const p1 = await client.list({ queue: "spentq", limit: 2, maxScan: 20 });
  count(p1);
  for (let i = 0; i < 30; i++) await putRecord("spentbusy", "other"); // a running run heartbeats
  let before = p1.nextCursor;
  for (let n = 2; before; n++) {
    assert.ok(n <= 200, `still paging after 200 pages (cursor ${before})`);
    const p = await client.list({ queue: "spentq", limit: 2, maxScan: 20, before });
    if (n === 2) {
      assert.ok(p.scanned <= 20, `page 2 scanned ${p.scanned}, maxScan 20`);
      assert.equal(p.truncated, true);
    }
    count(p);
    before = p.nextCursor;
  }
  for (const id of [...olds, ...runs.map((r) => r.id)]) assert.equal(seen.get(id), 1, `${id} listed ${seen.get(id) ?? 0} times, want once`);
});
