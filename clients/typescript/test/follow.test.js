// How a follow ends, against a real worker process (its embedded NATS
// server): closed or aborted at any point (while its consumer is being
// created too), given an aborted signal, a run whose events are gone, a
// resume from a cursor after the run finished, the two looks before a run
// is judged missing, and what a follow leaves behind when it ends (a
// consumer, a timer, an abort listener: nothing).
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { spawn } from "node:child_process";
import { getEventListeners } from "node:events";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import { AgentfleetError, connect, EventsGoneError, newRunId, RunNotFoundError } from "../src/index.js";
import { startWorker, waitFor, sleeper, repoDir, pkgDir } from "./fleet.js";

/** @type {Awaited<ReturnType<typeof startWorker>>} */
let hub;
/** @type {import("../src/index.js").Client} */
let client;

before(async () => {
  hub = await startWorker(["--concurrency", "8"], { name: "followhub" });
  client = await connect({ servers: hub.url, followStallMs: 1000 });
});

after(async () => {
  await client?.close();
  await hub?.stop();
});

const calculator = () => ({ prompt: "What is 1234*5678?", ...JSON.parse(readFileSync(join(repoDir, "cmd/submit/examples/calculator.json"), "utf8")) });

/**
 * p, or a rejection saying what did not end within ms (a follow that hangs
 * fails the test instead of holding it until the runner's timeout).
 * @template T @param {Promise<T>} p @param {string} what @param {number} [ms]
 * @returns {Promise<T>}
 */
async function within(p, what, ms = 5000) {
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let t;
  const late = new Promise((_, rej) => (t = setTimeout(() => rej(new Error(`${what}: did not end within ${ms} ms`)), ms)));
  try {
    return /** @type {T} */ (await Promise.race([p, late]));
  } finally {
    clearTimeout(t);
  }
}

/** A follow's envelopes to its end. @param {import("../src/index.js").Client} c @param {string} run @param {import("../src/index.js").FollowOptions} [opts] */
async function followAll(c, run, opts) {
  const out = [];
  for await (const env of c.follow(run, opts)) out.push(env);
  return out;
}

/** The consumers on AGENTS_EVENTS that read a run's events. @param {string} run */
async function consumersOf(run) {
  const jsm = await client.jsm();
  const subject = client.names.events(run);
  const out = [];
  for await (const ci of jsm.consumers.list(client.names.eventsStream)) {
    if (ci.config.filter_subject === subject || ci.config.filter_subjects?.includes(subject)) out.push(ci.name);
  }
  return out;
}

/**
 * Counts a client's requests to create a follow consumer: calls, and the
 * creations not settled yet (the real request, watched).
 * @param {import("../src/index.js").Client} c
 */
function watchCreations(c) {
  const orig = c.orderedEvents;
  const w = { calls: 0, unsettled: 0, /** @type {Promise<unknown>[]} */ made: [] };
  c.orderedEvents = function (/** @type {any[]} */ ...args) {
    w.calls++;
    w.unsettled++;
    const p = orig.apply(c, /** @type {any} */ (args));
    w.made.push(p.finally(() => w.unsettled--).catch(() => {}));
    return p;
  };
  return { w, restore: () => (c.orderedEvents = orig) };
}

/** Publishes an envelope on a run's events subject, as a worker would. @param {string} run @param {number} seq @param {object} event */
async function publishEvent(run, seq, event) {
  const env = { run, seq, attempt: 1, worker: "test", ts: Date.now(), event };
  await client.js.publish(client.names.events(run), JSON.stringify(env));
}

test("close() or an abort while the consumer is being created ends the follow at once, leaving no consumer or listener", async () => {
  const { id } = await client.submit(sleeper(60)); // running a minute: a follow would wait for it
  const c = await connect({ servers: hub.url, followStallMs: 10_000 });
  try {
    for (const how of ["close", "abort"]) {
      const { w, restore } = watchCreations(c);
      const ac = new AbortController();
      const f = c.follow(id, { signal: ac.signal });
      const it = f[Symbol.asyncIterator]();
      const next = it.next();
      // The creation request went out and has not been answered.
      assert.equal(w.calls, 1, how);
      assert.equal(w.unsettled, 1, `${how}: the consumer is being created`);
      if (how === "close") {
        f.close();
        const r = await within(next, "a follow closed while its consumer was being created");
        assert.equal(r.done, true);
      } else {
        ac.abort();
        await assert.rejects(within(next, "a follow aborted while its consumer was being created"), (err) => err instanceof Error && err.name === "AbortError");
      }
      assert.equal(getEventListeners(ac.signal, "abort").length, 0, `${how}: the follow's abort listener is removed`);
      await Promise.all(w.made); // the consumer was made after all: then it is deleted
      restore();
      await waitFor(async () => (await consumersOf(id)).length === 0, `${how}: no consumer left on ${id}'s events`, 10_000);
    }
  } finally {
    await c.close();
    await client.abort(id);
  }
});

test("a follow given an aborted signal rejects at once with its reason, creating no consumer", async () => {
  const { id } = await client.submit(sleeper(60));
  const { w, restore } = watchCreations(client);
  try {
    await assert.rejects(within(followAll(client, id, { signal: AbortSignal.abort() }), "a follow with an aborted signal"), (err) => err instanceof Error && err.name === "AbortError");
    const mine = new Error("stopped before it began");
    await assert.rejects(within(followAll(client, id, { signal: AbortSignal.abort(mine) }), "a follow with an aborted signal"), (err) => err === mine);
    await assert.rejects(within(client.result(id, { signal: AbortSignal.abort(mine) }), "result with an aborted signal"), (err) => err === mine);
    assert.equal(w.calls, 0, "no consumer was created");
  } finally {
    restore();
    await client.abort(id);
  }
});

test("a finished run whose events are gone: EventsGoneError, with the Go client's text", async () => {
  const { id } = await client.submit({ prompt: "soon gone" });
  const envs = await followAll(client, id);
  assert.equal(envs.at(-1)?.event.type, "run_finished");
  // The events stream drops a run's events past its max age or byte
  // limit; its record stays. A purge of the run's subject does the same.
  const jsm = await client.jsm();
  await jsm.streams.purge(client.names.eventsStream, { filter: client.names.events(id) });
  const t0 = Date.now();
  await assert.rejects(within(followAll(client, id), "a follow of a run whose events are gone"), (err) => {
    assert.ok(err instanceof EventsGoneError, `${err}`);
    assert.ok(err instanceof AgentfleetError);
    assert.equal(err.code, "events_gone");
    assert.equal(err.message, `follow ${id}: run finished (succeeded) but its events are no longer stored`);
    assert.equal(err.run, id);
    assert.equal(err.state, "succeeded");
    return true;
  });
  // Two looks one stall interval (1 s here) apart.
  assert.ok(Date.now() - t0 >= 1000, "judged on two looks a stall interval apart");
  await waitFor(async () => (await consumersOf(id)).length === 0, "no consumer left", 10_000);
});

test("a resume from a stream sequence the stream no longer holds: EventsGoneError, not a silent later start", async () => {
  const { id } = await client.submit({ ...calculator(), prompt: "partly gone" });
  const all = await followAll(client, id);
  assert.ok(all.length > 8, `${all.length} events`);
  // The stream's oldest messages go (as past its max age): all before the run's 6th event.
  const jsm = await client.jsm();
  const keep = all[5].streamSeq;
  await jsm.streams.purge(client.names.eventsStream, { seq: keep });
  assert.equal((await jsm.streams.info(client.names.eventsStream)).state.first_seq, keep);
  // A stream sequence alone (an SSE id): the run's events from there are gone.
  await assert.rejects(within(followAll(client, id, { from: all[2].streamSeq }), "a follow from a purged sequence"), (err) => {
    assert.ok(err instanceof EventsGoneError, `${err}`);
    assert.equal(err.from, all[2].streamSeq);
    assert.equal(err.message, `follow ${id}: its events from stream sequence ${all[2].streamSeq} are no longer stored (${client.names.eventsStream} now starts at ${keep})`);
    return true;
  });
  // A cursor with its state, after the 2nd event: the 3rd is gone.
  const cursor = { from: all[1].streamSeq + 1, attempt: all[1].attempt, seq: all[1].seq };
  await assert.rejects(within(followAll(client, id, cursor), "a follow from a purged cursor"), EventsGoneError);
  // From what the stream still holds: the rest, as before.
  const rest = await within(followAll(client, id, { from: keep }), "a follow from the stream's first");
  assert.deepEqual(
    rest.map((e) => e.streamSeq),
    all.slice(5).map((e) => e.streamSeq),
  );
});

test("the cursor after run_finished points past it: a follow resumed from it reads nothing and ends at once", async () => {
  const { id } = await client.submit({ ...calculator(), prompt: "resume after the end" });
  const f = client.follow(id);
  const all = [];
  for await (const env of f) all.push(env);
  const last = /** @type {any} */ (all.at(-1));
  assert.equal(last.event.type, "run_finished");
  const c = f.cursor();
  assert.deepEqual(c, { from: last.streamSeq + 1, attempt: last.attempt, seq: last.seq, finished: true });
  // The cursor says finished: nothing is asked.
  const { w, restore } = watchCreations(client);
  try {
    assert.deepEqual(await within(followAll(client, id, c), "a follow from the final cursor"), []);
    assert.equal(w.calls, 0);
  } finally {
    restore();
  }
  // The same position without the flag (a cursor kept before 1.x, an SSE
  // id + 1): the run_finished stored before it ends the follow.
  assert.deepEqual(await within(followAll(client, id, { from: c.from, attempt: c.attempt, seq: c.seq }), "a follow from past run_finished"), []);
  assert.deepEqual(await within(followAll(client, id, { from: c.from }), "a follow from past run_finished, blind"), []);
  // Stopped midway, resumed, resumed again from where that one ended: each
  // envelope once.
  const first = client.follow(id);
  const got = [];
  for await (const env of first) {
    got.push(env);
    if (got.length === 4) break;
  }
  const second = client.follow(id, first.cursor());
  for await (const env of second) got.push(env);
  for await (const env of client.follow(id, second.cursor())) got.push(env);
  assert.deepEqual(
    got.map((e) => e.streamSeq),
    all.map((e) => e.streamSeq),
  );
  await waitFor(async () => (await consumersOf(id)).length === 0, "no consumer left", 10_000);
});

test("a run is judged missing only when two looks a stall interval apart agree", async () => {
  // A long stall interval: the second look comes 10 s after the first, and
  // the run appears in between.
  const c = await connect({ servers: hub.url, followStallMs: 10_000 });
  try {
    // Not submitted yet when the follow first looks.
    const early = newRunId();
    const f = c.follow(early);
    const followed = (async () => {
      const out = [];
      for await (const env of f) out.push(env);
      return out;
    })();
    await Promise.race([waitFor(() => f.missingLooks >= 1, "the follow's first look"), followed]);
    assert.equal(f.missingLooks, 1);
    await c.submit({ prompt: "just in time" }, { id: early });
    const envs = await within(followed, "a follow of a run submitted after its first look", 30_000);
    assert.equal(envs.at(-1)?.event.type, "run_finished");

    // A finished record and no event yet (a request refused at pickup gets
    // its final record just before its events): not gone.
    const late = newRunId();
    const kv = await c.records();
    await kv.put(late, JSON.stringify({ id: late, queue: "default", state: "failed", attempt: 1, reason: "bad_request" }));
    const g = c.follow(late);
    const followed2 = (async () => {
      const out = [];
      for await (const env of g) out.push(env);
      return out;
    })();
    await Promise.race([waitFor(() => g.missingLooks >= 1, "the follow's first look"), followed2]);
    assert.equal(g.missingLooks, 1);
    await publishEvent(late, 1, { type: "run_started", attempt: 1 });
    await publishEvent(late, 2, { type: "run_finished", status: "failed", reason: "bad_request" });
    const envs2 = await within(followed2, "a follow of a finished run whose events came after its first look", 30_000);
    assert.deepEqual(
      envs2.map((e) => e.event.type),
      ["run_started", "run_finished"],
    );

    // Nothing both times: RunNotFoundError.
    const none = newRunId();
    await assert.rejects(within(followAll(client, none), "a follow of a run nobody submitted"), (err) => err instanceof RunNotFoundError && err.run === none);
  } finally {
    await c.close();
  }
});

test("a follow ending in any way leaves no timer, abort listener or consumer behind", async () => {
  const running = (await client.submit(sleeper(60))).id;
  const done = (await client.submit({ prompt: "done" })).id;
  await followAll(client, done);
  // A process of its own, so that its timers are the client's and the
  // follows' alone: it checks them, and must exit by itself.
  const child = spawn(process.execPath, [join(pkgDir, "test", "follow-ends.js")], {
    env: { ...process.env, NATS_URL: hub.url, RUNNING: running, DONE: done },
    stdio: ["ignore", "pipe", "pipe"],
  });
  let out = "";
  child.stdout.on("data", (d) => (out += d));
  child.stderr.on("data", (d) => (out += d));
  const exited = new Promise((res) => child.on("exit", (code) => res(code)));
  try {
    const code = await within(exited, "the follows' process (a timer left would hold it)", 60_000);
    assert.equal(code, 0, out);
    assert.match(out, /^ok$/m);
  } finally {
    if (child.exitCode === null) child.kill("SIGKILL");
    await client.abort(running);
  }
  await waitFor(async () => (await consumersOf(running)).length === 0, "no consumer left", 10_000);
});
