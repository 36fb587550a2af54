// Schedules (protocol 1.10, docs/protocol.md §2): client.schedules() lists
// what `submit schedule` stores, paused ones too, with each one's newest
// run, and leaves deleted ones out.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { connect, ScheduleError } from "../src/index.js";
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

// The schedule operations (protocol 1.10): requests a worker of the queue
// answers, as the Go client's bus.CreateSchedule and the rest.
test("schedules: create, fire, pause, resume, trigger and delete through a worker", async () => {
  const name = "ts-ops";
  const find = async () => (await client.schedules()).find((s) => s.name === name);
  const seq = await client.createSchedule({ name, every: "1s", overlap: "allow", request: { prompt: "hello" } });
  assert.ok(seq > 0, `seq ${seq}`);
  const created = await find();
  assert.equal(created?.queue, "default");
  assert.equal(created?.seq, seq);
  assert.ok(created?.createdAt, "the worker sets createdAt");

  // It fires: a run of the schedule.
  const first = await waitFor(async () => (await find())?.last, "a fire of ts-ops");
  const rec = await waitFor(() => client.record(first.run), `the record of ${first.run}`);
  assert.equal(rec.metadata?.schedule, name);

  // Paused: the definition stays, nothing fires (a fire handled before the
  // pause may still write last, but none planned after it runs).
  await client.pauseSchedule(name);
  const pausedAt = Date.now();
  assert.equal((await find())?.paused, true);
  await new Promise((r) => setTimeout(r, 3000));
  const last = (await find())?.last;
  assert.ok(last && Date.parse(last.plannedAt) <= pausedAt, `a paused schedule fired: ${JSON.stringify(last)}, paused at ${new Date(pausedAt).toISOString()}`);

  // Resumed: it fires again.
  await client.resumeSchedule(name);
  assert.notEqual((await find())?.paused, true);
  await waitFor(async () => Date.parse((await find())?.last?.plannedAt ?? "") > pausedAt, "a fire after the resume");

  // Trigger fires now, paused or not, and names the run.
  await client.pauseSchedule(name);
  const run = await client.triggerSchedule(name);
  assert.match(run, /^sch-[a-z2-7]{26}$/);
  const trec = await waitFor(() => client.record(run), `the triggered run ${run}`);
  assert.equal(trec.metadata?.schedule, name);

  // Replace keeps createdAt; create over the name is refused.
  await client.replaceSchedule({ name, every: "1h", paused: true, request: { prompt: "hi" } });
  const replaced = await find();
  assert.equal(replaced?.every, "1h");
  assert.equal(replaced?.createdAt, created?.createdAt);
  await assert.rejects(client.createSchedule({ name, every: "1h", request: { prompt: "hi" } }), (err) => {
    assert.ok(err instanceof ScheduleError, String(err));
    assert.equal(err.code, "schedule_exists");
    return true;
  });

  // Deleted: gone from the list, and operations on it are not found.
  await client.deleteSchedule(name);
  assert.equal(await find(), undefined);
  await assert.rejects(client.resumeSchedule(name), (err) => {
    assert.ok(err instanceof ScheduleError, String(err));
    assert.equal(err.code, "schedule_not_found");
    assert.match(err.message, /ts-ops/);
    return true;
  });
});

test("schedules: a refused create throws every problem; no worker of the queue is named", async () => {
  await assert.rejects(
    client.createSchedule({
      name: "ts-bad",
      every: "1500ms",
      timeZone: "UTC",
      overlap: /** @type {any} */ ("never"),
      request: /** @type {any} */ ({ id: "mine", prompt: "hi" }),
    }),
    (err) => {
      assert.ok(err instanceof ScheduleError, String(err));
      assert.equal(err.code, "schedule_invalid");
      assert.equal(err.op, "create");
      assert.ok(err.problems.length >= 4, `problems: ${err.problems.join(" | ")}`);
      for (const p of err.problems) assert.ok(err.message.includes(p), `the message lacks "${p}": ${err.message}`);
      for (const what of [/every 1\.5s must be whole seconds/, /time zone applies only to a cron/, /overlap "never"/, /request\.id must be empty/]) {
        assert.match(err.message, what);
      }
      return true;
    },
  );
  assert.equal((await client.schedules()).find((s) => s.name === "ts-bad"), undefined);

  await assert.rejects(client.createSchedule({ name: "ts-lost", queue: "nobody", every: "1h", request: { prompt: "hi" } }), (err) => {
    assert.ok(err instanceof ScheduleError, String(err));
    assert.equal(err.code, "schedule_no_worker");
    assert.equal(err.queue, "nobody");
    assert.match(err.message, /no worker of queue "nobody"/);
    return true;
  });
});
