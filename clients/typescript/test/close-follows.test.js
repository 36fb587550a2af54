// Client.close() returns once its follows' consumers are deleted: those
// being drained and those still being created when it was called (the
// README and index.d.ts promise it).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import v8 from "node:v8";
import vm from "node:vm";
import { connect } from "../src/index.js";
import { startWorker, waitFor, sleeper } from "./fleet.js";

let hub, client;
before(async () => {
  hub = await startWorker(["--concurrency", "4"], { name: "closehub" });
  client = await connect({ servers: hub.url });
});
after(async () => { await client?.close(); await hub?.stop(); });

async function consumersOf(run) {
  const jsm = await client.jsm();
  const subject = client.names.events(run);
  const out = [];
  for await (const ci of jsm.consumers.list(client.names.eventsStream)) {
    if (ci.config.filter_subject === subject || ci.config.filter_subjects?.includes(subject)) out.push(ci.name);
  }
  return out;
}

for (const when of ["draining", "creating"]) {
  test(`Client.close() while a follow is ${when} leaves no consumer`, async () => {
    const { id } = await client.submit(sleeper(60));
    const c = await connect({ servers: hub.url });
    const f = c.follow(id);
    const it = f[Symbol.asyncIterator]();
    const p = it.next().catch(() => {});
    if (when === "draining") await waitFor(async () => (await consumersOf(id)).length === 1, "consumer made");
    await c.close();
    await p;
    const left = await consumersOf(id);
    await client.abort(id);
    assert.deepEqual(left, [], `consumers left after close() (${when})`);
  });
}

test("a follow's waits for replies keep nothing once settled (until close())", async () => {
  v8.setFlagsFromString("--expose-gc");
  const gc = /** @type {() => void} */ (vm.runInNewContext("gc"));
  const f = client.follow("retain-check");
  /** @type {WeakRef<object>[]} */
  const refs = [];
  for (let i = 0; i < 10; i++) {
    await (async () => {
      const reply = { big: new Array(1000).fill(i) }; // what a reply brings: a consumer, a stream info
      refs.push(new WeakRef(reply));
      assert.equal(await f.unlessClosed(Promise.resolve(reply)), reply);
    })();
  }
  let kept = refs.length;
  for (let round = 0; round < 5 && kept > 0; round++) {
    await new Promise((r) => setImmediate(r)); // WeakRefs hold until the job ends
    gc();
    kept = refs.filter((r) => r.deref() !== undefined).length;
  }
  f.close();
  assert.equal(kept, 0, "replies kept alive by a settled wait");
});
