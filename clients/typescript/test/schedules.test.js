// Schedules (protocol 1.10, docs/protocol.md §2): client.schedules() lists
// what `submit schedule` stores, paused ones too, with each one's newest
// run, and leaves deleted ones out.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { connect } from "../src/index.js";
import { startWorker, submit, waitFor } from "./fleet.js";

let hub, client;
before(async () => {
  hub = await startWorker([], { name: "schedhub" });
  client = await connect({ servers: hub.url });
});
after(async () => { await client?.close(); await hub?.stop(); });

test("schedules: listed with their spec, pause state and newest run; a deleted one is gone", async () => {
  const ok = async (args) => {
    const r = await submit(hub.url, args);
    assert.equal(r.code, 0, `submit ${args.join(" ")}: ${r.stderr}`);
  };
  await ok(["schedule", "create", "ts-tick", "--every", "1s", "hello"]);
  await ok(["schedule", "create", "ts-weekly", "--cron", "0 0 9 * * MON", "--tz", "Europe/Berlin", "--paused", "hello"]);
  await ok(["schedule", "create", "ts-gone", "--every", "1h", "--paused", "hello"]);
  await ok(["schedule", "delete", "ts-gone"]);
  let list = [];
  await waitFor(async () => {
    list = await client.schedules();
    return list.find((s) => s.name === "ts-tick")?.last != null;
  }, "a run of ts-tick");
  await ok(["schedule", "pause", "ts-tick"]);
  assert.deepEqual(list.map((s) => s.name), ["ts-tick", "ts-weekly"]);
  const [tick, weekly] = list;
  assert.equal(tick.every, "1s");
  assert.equal(tick.queue, "default");
  assert.match(tick.last.run, /^sch-[a-z2-7]{26}$/);
  const rec = await client.status(tick.last.run);
  assert.equal(rec.metadata.schedule, "ts-tick");
  assert.equal(weekly.cron, "0 0 9 * * MON");
  assert.equal(weekly.timeZone, "Europe/Berlin");
  assert.equal(weekly.paused, true);
  assert.equal(weekly.last, null);
});
