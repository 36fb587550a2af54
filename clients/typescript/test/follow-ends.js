// Run by follow.test.js as a process of its own: follows runs of the fleet
// at NATS_URL and ends them in every way (finish, close, break, abort, an
// error), then closes its client. It checks that each follow removed its
// abort listener and that no timer is left once the client is closed (the
// process would otherwise wait on it before it exits), and prints "ok".
// RUNNING: a run that goes on for a while; DONE: a finished run.
import assert from "node:assert/strict";
import { getEventListeners } from "node:events";

import { connect, EventsGoneError, newRunId } from "../src/index.js";

const timers = () => process.getActiveResourcesInfo().filter((r) => r === "Timeout").length;
const running = process.env.RUNNING ?? "";
const done = process.env.DONE ?? "";
const before = timers();
// A long stall interval: a timer of the follow's watch left behind would
// keep the process for a minute.
const c = await connect({ servers: process.env.NATS_URL, followStallMs: 60_000 });

/** @param {string} run @param {import("../src/index.js").FollowOptions} [opts] */
async function followAll(run, opts) {
  const out = [];
  for await (const env of c.follow(run, opts)) out.push(env);
  return out;
}

/** Resolves once check() holds, looking at each turn of the event loop (no timer of its own). @param {() => boolean} check */
async function until(check) {
  while (!check()) await new Promise((r) => setImmediate(r));
}

/** @type {Array<[string, (signal: AbortSignal, ac: AbortController) => Promise<unknown>]>} */
const ways = [
  ["finish", (signal) => followAll(done, { signal })],
  [
    "close (while the consumer is being created)",
    async (signal) => {
      const f = c.follow(running, { signal });
      const next = f[Symbol.asyncIterator]().next();
      f.close();
      assert.equal((await next).done, true);
    },
  ],
  [
    "abort (while the consumer is being created)",
    async (signal, ac) => {
      const next = c.follow(running, { signal })[Symbol.asyncIterator]().next();
      ac.abort();
      await assert.rejects(next, (err) => err instanceof Error && err.name === "AbortError");
    },
  ],
  [
    "close (a run not yet submitted)",
    async (signal) => {
      const f = c.follow(newRunId(), { signal });
      const next = f[Symbol.asyncIterator]().next();
      await until(() => f.missingLooks >= 1);
      f.close();
      assert.equal((await next).done, true);
    },
  ],
  [
    "close (a running run)",
    async (signal) => {
      const f = c.follow(running, { signal });
      const it = f[Symbol.asyncIterator]();
      await it.next();
      f.close();
      assert.equal((await it.next()).done, true);
    },
  ],
  [
    "break (a running run)",
    async (signal) => {
      for await (const env of c.follow(running, { signal })) if (env.event.type === "run_started") break;
    },
  ],
  [
    "abort (a run not yet submitted)",
    async (signal, ac) => {
      const f = c.follow(newRunId(), { signal });
      const next = f[Symbol.asyncIterator]().next();
      await until(() => f.missingLooks >= 1);
      ac.abort();
      await assert.rejects(next, (err) => err instanceof Error && err.name === "AbortError");
    },
  ],
  [
    "abort (a running run)",
    async (signal, ac) => {
      const it = c.follow(running, { signal })[Symbol.asyncIterator]();
      await it.next();
      ac.abort();
      await assert.rejects(it.next(), (err) => err instanceof Error && err.name === "AbortError");
    },
  ],
  [
    "error (the run's events gone)",
    async (signal) => {
      const gone = newRunId();
      await (await c.records()).put(gone, JSON.stringify({ id: gone, queue: "default", state: "succeeded", attempt: 1 }));
      const fast = await connect({ servers: process.env.NATS_URL, followStallMs: 100 });
      try {
        const f = fast.follow(gone, { signal });
        await assert.rejects(
          (async () => {
            for await (const _ of f);
          })(),
          EventsGoneError,
        );
      } finally {
        await fast.close();
      }
    },
  ],
];

for (const [how, end] of ways) {
  const ac = new AbortController();
  await end(ac.signal, ac);
  assert.equal(getEventListeners(ac.signal, "abort").length, 0, `${how}: the follow's abort listener is left on the signal`);
  console.log(`# ${how}: ended`);
}
await c.close();
assert.equal(timers(), before, `timers left once the follows ended and the client closed: ${process.getActiveResourcesInfo().join(", ")}`);
console.log("ok");
