// The Node client against a real worker process (demo and faux models, its
// embedded NATS server): every function, the errors, and the envelopes as
// `submit follow --json` prints them.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";

import {
  connect,
  formatEnvelope,
  JetStreamUnavailableError,
  NatsUnreachableError,
  RunFinishedError,
  RunIdTakenError,
  RunNotFoundError,
  UnknownQueueError,
  InvalidArgumentError,
  newRunId,
} from "../src/index.js";
import { startWorker, submit, waitFor, freePort, repoDir, sleeper, manyDeltas, gated, startNatsWithoutJetStream } from "./fleet.js";

/** @type {Awaited<ReturnType<typeof startWorker>>} */
let hub;
/** @type {import("../src/index.js").Client} */
let client;

before(async () => {
  // Two queues: a request under a used id on the other one is refused by the record's queue.
  hub = await startWorker(["--concurrency", "16", "--ack-wait", "10s", "--queue", "default,other"], { name: "hub" });
  client = await connect({ servers: hub.url, followStallMs: 1000 });
});

after(async () => {
  await client?.close();
  await hub?.stop();
});

/** A request of cmd/submit/examples with a prompt. @param {string} name */
const example = (name) => ({ prompt: "What is 1234*5678?", ...JSON.parse(readFileSync(join(repoDir, "cmd/submit/examples", name), "utf8")) });

/** Follows a run to its end: its envelopes. @param {string} run @param {import("../src/index.js").FollowOptions} [opts] */
async function followAll(run, opts) {
  const out = [];
  for await (const env of client.follow(run, opts)) out.push(env);
  return out;
}

/** Follows a run until an event of a type: returns the follow, still open. @param {string} run @param {(e: any) => boolean} until */
async function followUntil(run, until) {
  const f = client.follow(run);
  const it = f[Symbol.asyncIterator]();
  const seen = [];
  for (;;) {
    const r = await it.next();
    assert.ok(!r.done, `run ${run} ended before the awaited event`);
    seen.push(r.value);
    if (until(r.value)) return { f, it, seen };
  }
}

test("submit, follow typed events live, status and result", async () => {
  const { id, queue, seq, duplicate } = await client.submit({ prompt: "Hello, fleet" });
  assert.equal(queue, "default");
  assert.ok(seq > 0);
  assert.equal(duplicate, false);
  let text = "";
  const types = [];
  for await (const env of client.follow(id)) {
    types.push(env.event.type);
    assert.equal(env.run, id);
    assert.ok(env.streamSeq > 0);
    if (env.event.type === "message_update" && env.event.assistantMessageEvent.type === "text_delta") text += env.event.assistantMessageEvent.delta;
  }
  assert.equal(types[0], "run_started");
  assert.equal(types.at(-1), "run_finished");
  assert.ok(types.includes("message_end"));
  const rec = await client.status(id);
  assert.equal(rec.state, "succeeded");
  assert.equal(rec.queue, "default");
  assert.ok(rec.revision && rec.revision > 0);
  const res = await client.result(id);
  assert.equal(res.status, "succeeded");
  assert.equal(res.text, text);
  assert.match(res.text, /You said: Hello, fleet/);
  assert.deepEqual(
    res.messages.map((m) => m.role),
    ["user", "assistant"],
  );
});

test("the envelopes, byte for byte as submit follow --json prints them", async () => {
  const runs = [];
  // A scripted tool run with thinking; text that Go escapes (<, >, &,
  // U+2028) and text it does not; a bad request; an approval approved with
  // an edit; a steered, then aborted run.
  runs.push((await client.submit({ ...example("calculator.json"), prompt: "What is <1234*5678> & \"why\"? \u2028 é ✓ \u{1F600}" })).id);
  runs.push((await client.submit({ prompt: "demo <b>bold</b> & \\ \t tab" })).id);
  runs.push((await client.submit({ prompt: "x", tools: ["no_such_tool"] })).id);
  const appr = (await client.submit(example("approval.json"))).id;
  runs.push(appr);
  const slow = (await client.submit(sleeper(30))).id;
  runs.push(slow);
  {
    const { it } = await followUntil(appr, (e) => e.event.type === "tool_approval_requested");
    await client.approve(appr, "c1", { by: "alice <a@example.com>", arguments: { expression: "2+3" } });
    while (!(await it.next()).done);
  }
  {
    const { it } = await followUntil(slow, (e) => e.event.type === "tool_execution_start");
    await client.steer(slow, "Steer <now> & then");
    await client.abort(slow, { reason: "enough" });
    while (!(await it.next()).done);
  }
  for (const id of runs) {
    const go = await submit(hub.url, ["follow", "--json", id]);
    const lines = [];
    for await (const env of client.follow(id, { includeUnknown: true })) lines.push(formatEnvelope(env) + "\n");
    assert.equal(lines.join(""), go.stdout, `run ${id}`);
  }
});

test("replay from a stream sequence, and resume from a cursor", async () => {
  const { id } = await client.submit({ ...example("calculator.json"), prompt: "replay" });
  const all = await followAll(id);
  assert.ok(all.length > 10);
  const k = 7;
  const tail = await followAll(id, { from: all[k].streamSeq });
  assert.deepEqual(
    tail.map((e) => formatEnvelope(e)),
    all.slice(k).map((e) => formatEnvelope(e)),
  );
  // A follow stopped after a few envelopes goes on from its cursor.
  const first = client.follow(id);
  const got = [];
  for await (const env of first) {
    got.push(env);
    if (got.length === 5) break;
  }
  const rest = await followAll(id, first.cursor());
  assert.deepEqual(
    [...got, ...rest].map((e) => e.streamSeq),
    all.map((e) => e.streamSeq),
  );
});

test("submit is idempotent by run id; another request under a used id is refused", async () => {
  const id = newRunId();
  const req = { prompt: "once" };
  const a = await client.submit(req, { id });
  const b = await client.submit(req, { id });
  assert.equal(a.duplicate, false);
  assert.equal(b.duplicate, true);
  assert.equal(b.seq, a.seq);
  await assert.rejects(client.submit({ prompt: "another body" }, { id }), RunIdTakenError);
  await followAll(id);
  // Once taken (the request acked and gone), the record's queue tells (on
  // a queue that is declared: "other" is the hub's too).
  await assert.rejects(client.submit(req, { id, queue: "other" }), (err) => {
    assert.ok(err instanceof RunIdTakenError, `${err}`);
    assert.match(err.message, /stored on queue "default", not "other"/);
    return true;
  });
  await assert.rejects(client.submit(req, { id: "bad id" }), InvalidArgumentError);
});

test("errors: queue not declared, no such run, NATS unreachable, JetStream down", async () => {
  await assert.rejects(client.submit({ prompt: "x" }, { queue: "nobody-serves-this" }), (err) => {
    assert.ok(err instanceof UnknownQueueError);
    assert.equal(err.code, "queue_not_declared");
    assert.match(err.message, /queue "nobody-serves-this" is not declared/);
    return true;
  });
  for (const call of [() => client.status("no-such-run"), () => client.result("no-such-run"), () => followAll("no-such-run")]) {
    await assert.rejects(call(), (err) => err instanceof RunNotFoundError && err.code === "run_not_found" && /no such run: no-such-run/.test(err.message));
  }
  // A follower started before the run is submitted, that looked once and
  // found nothing, is not told it has none.
  const early = newRunId();
  const ef = client.follow(early);
  const followed = (async () => {
    const out = [];
    for await (const env of ef) out.push(env);
    return out;
  })();
  await Promise.race([waitFor(() => ef.missingLooks >= 1, "the follower's first look"), followed]);
  await client.submit({ prompt: "just in time" }, { id: early });
  const envs = await followed;
  assert.equal(envs.at(-1).event.type, "run_finished");
  const port = await freePort();
  await assert.rejects(connect({ servers: `nats://127.0.0.1:${port}`, timeout: 2000 }), (err) => {
    assert.ok(err instanceof NatsUnreachableError);
    assert.match(err.message, new RegExp(`cannot reach NATS at nats://127.0.0.1:${port}`));
    return true;
  });
  const plain = await startNatsWithoutJetStream();
  const c = await connect({ servers: plain.url });
  try {
    for (const call of [() => c.submit({ prompt: "x" }), () => c.status("r1"), () => c.list(), () => c.steer("r1", "x")]) {
      await assert.rejects(call(), (err) => {
        assert.ok(err instanceof JetStreamUnavailableError, `${err}`);
        assert.equal(err.code, "jetstream_unavailable");
        assert.match(err.message, /JetStream is not answering/);
        return true;
      });
    }
  } finally {
    await c.close();
    await plain.close();
  }
});

test("steer and follow-up with keys: a retry is stored once and reaches the run once", async () => {
  // The run waits for its calculator call's answer while we steer.
  const { id } = await client.submit(gated());
  const { it, seen } = await followUntil(id, (e) => e.event.type === "tool_approval_requested");
  const s1 = await client.steer(id, "Count in French instead", { key: "french" });
  const s2 = await client.steer(id, "Count in French instead", { key: "french" });
  assert.equal(s2.seq, s1.seq);
  assert.equal(s2.duplicate, true);
  const f1 = await client.followUp(id, "And in German?", { key: "german" });
  const bad = await client.sendControl(id, "steer", { txt: "a typo" }); // not a steer body: the run says so (1.8)
  await client.approve(id, "c1");
  for (;;) {
    const r = await it.next();
    if (r.done) break;
    seen.push(r.value);
  }
  const rejected = seen.find((e) => e.event.type === "control_rejected");
  assert.ok(rejected && rejected.event.type === "control_rejected");
  assert.equal(rejected.event.kind, "steer");
  assert.equal(rejected.event.controlSeq, bad.seq);
  assert.match(rejected.event.reason, /txt/);
  const users = seen.filter((e) => e.event.type === "message_end" && e.event.message.role === "user" && e.controlSeq);
  assert.deepEqual(
    users.map((e) => e.controlSeq),
    [s1.seq, f1.seq],
  );
  const res = await client.result(id);
  assert.equal(res.status, "succeeded");
  assert.equal(res.text, "Un, deux, trois.", "the steer, then the follow-up took a turn each");
  // After the finish: a retry whose first copy came in time answers its
  // sequence; a new message is refused.
  const again = await client.steer(id, "Count in French instead", { key: "french" });
  assert.deepEqual(again, { seq: s1.seq, duplicate: true });
  await assert.rejects(client.steer(id, "too late", { key: "late" }), RunFinishedError);
  await assert.rejects(client.steer(id, "too late"), (err) => err instanceof RunFinishedError && /is succeeded/.test(err.message));
  await assert.rejects(client.steer(id, "  "), InvalidArgumentError);
  await assert.rejects(client.steer(id, "x", { key: "no spaces" }), InvalidArgumentError);
});

test("a control whose request fails rejects with the client's error and leaves no unhandled rejection", async () => {
  /** @type {unknown[]} */
  const unhandled = [];
  const onUnhandled = (/** @type {unknown} */ err) => unhandled.push(err);
  process.on("unhandledRejection", onUnhandled);
  const { id } = await client.submit(gated()); // waits for an approval: running until answered
  try {
    for (const when of ["before the requests went out", "while they are out"]) {
      const c = await connect({ servers: hub.url });
      await c.record(id); // the records bucket opened: each control's first request is its record's read
      const calls = [c.steer(id, "x"), c.followUp(id, "y"), c.abort(id), c.approve(id, "c1"), c.deny(id, "c1"), c.steer(id, "x", { key: "k" })];
      if (when === "while they are out") await new Promise((r) => setImmediate(r));
      await c.close();
      for (const p of calls) await assert.rejects(p, (err) => err instanceof NatsUnreachableError || assert.fail(`${when}: ${err}`));
      await assert.rejects(c.steer(id, "after"), NatsUnreachableError);
    }
    // A publish JetStream refuses.
    await assert.rejects(client.steer(id, "x", { headers: { "Nats-Expected-Last-Sequence": "1" } }), /wrong last sequence/);
    // Unhandled rejections are reported once the microtasks have run.
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    assert.deepEqual(unhandled, []);
  } finally {
    process.off("unhandledRejection", onUnhandled);
    await client.abort(id);
  }
});

test("compact: a run whose model has no known window rejects it and goes on", async () => {
  const { id } = await client.submit(sleeper(60));
  const { it } = await followUntil(id, (e) => e.event.type === "tool_execution_start");
  const c = await client.compact(id, { instructions: "keep file names" });
  assert.ok(c.seq > 0);
  let rejected;
  for (;;) {
    const r = await it.next();
    if (r.done) break;
    if (r.value.event.type === "control_rejected") {
      rejected = r.value.event;
      await client.abort(id);
    }
  }
  assert.equal(rejected?.kind, "compact");
  assert.match(rejected.reason, /no known context window/);
  assert.equal(rejected.controlSeq, c.seq);
});

test("abort a running run", async () => {
  const { id } = await client.submit(sleeper(60));
  const { it } = await followUntil(id, (e) => e.event.type === "tool_execution_start");
  const a = await client.abort(id, { reason: "changed my mind", key: "stop" });
  assert.ok(a.seq > 0);
  let last;
  for (;;) {
    const r = await it.next();
    if (r.done) break;
    last = r.value;
  }
  assert.equal(last.event.type, "run_finished");
  assert.equal(last.event.status, "aborted");
  assert.equal(last.event.reason, "aborted_by_user");
  assert.equal((await client.status(id)).state, "aborted");
});

test("approvalsPage: pages of runs waiting for approval, the model's waits never on them", async () => {
  const queue = `tspages-${newRunId().slice(0, 6)}`;
  const now = Date.now();
  const te = new TextEncoder();
  // A record, then its waiting-index entry, as a worker writes them.
  const put = async (id, waiting, state = "running") => {
    const rec = { id, queue, state, attempt: 1, heartbeatAt: new Date(now).toISOString(), waiting };
    await client.js.publish(`$KV.agents_runs.${id}`, te.encode(JSON.stringify(rec)));
    await client.js.publish(`agents.waiting.${queue}.${id}`, te.encode(JSON.stringify({ for: waiting.for, since: waiting.since })));
  };
  // Entries whose record does not wait (finished since, or none): never listed.
  await put(`${queue}-stale`, { for: "approval" }, "succeeded");
  await client.js.publish(`agents.waiting.${queue}.${queue}-forged`, te.encode(JSON.stringify({ for: "approval" })));
  const runs = [];
  for (let i = 0; i < 5; i++) {
    const id = `${queue}-run-${i}`;
    runs.push(id);
    const ev = { type: "tool_approval_requested", toolCallId: `c${i}`, toolName: "deploy", args: { n: i }, expiresAt: now + 3600_000 };
    await client.js.publish(`agents.run.${id}.events`, te.encode(JSON.stringify({ run: id, seq: 1, attempt: 1, worker: "w", ts: now, event: ev })));
    await put(id, { for: "approval", since: new Date(now).toISOString(), approvals: [{ toolCallId: `c${i}`, toolName: "deploy", requestedAt: now, expiresAt: now + 3600_000 }] });
    await put(`${queue}-model-${i}`, { for: "model", since: new Date(now).toISOString() });
  }
  const sizes = [];
  const seen = new Map();
  let before;
  for (let n = 0; n < 5; n++) {
    const page = await client.approvalsPage({ queue, limit: 2, before });
    sizes.push(page.calls.length);
    for (const c of page.calls) {
      assert.deepEqual(c.args, { n: Number(c.toolCallId.slice(1)) });
      seen.set(c.run, (seen.get(c.run) ?? 0) + 1);
    }
    if (!page.nextCursor) break;
    before = page.nextCursor;
  }
  assert.deepEqual(sizes, [2, 2, 1]);
  assert.deepEqual([...seen.keys()].sort(), runs);
  assert.ok([...seen.values()].every((v) => v === 1));
  assert.ok(before.startsWith("w."), `cursor ${before}: want the waiting index's`);
  // list --state waiting pages the same index, oldest wait first; a
  // model's wait is not indexed (since 1.10: the entries here are a 1.9
  // worker's), and asking for it walks the records.
  const listed = [];
  for (let cur, n = 0; n < 10; n++) {
    const page = await client.list({ state: "waiting", queue, limit: 4, before: cur });
    listed.push(...page.records.map((r) => r.id));
    if (!(cur = page.nextCursor)) break;
  }
  assert.deepEqual(listed, runs);
  // Waits for child runs and for a concurrency key's place are indexed
  // (1.10): listed after the approvals, in the order their waits began.
  await put(`${queue}-kids`, { for: "children", since: new Date(now).toISOString() });
  await put(`${queue}-key`, { for: "key", since: new Date(now).toISOString(), key: "k" });
  const all = [];
  for (let cur, n = 0; n < 10; n++) {
    const page = await client.list({ state: "waiting", queue, limit: 4, before: cur });
    all.push(...page.records.map((r) => r.id));
    if (!(cur = page.nextCursor)) break;
  }
  assert.deepEqual(all, [...runs, `${queue}-kids`, `${queue}-key`]);
  const model = await client.list({ state: "waiting", waitingFor: "model", queue });
  assert.deepEqual(model.records.map((r) => r.id).sort(), runs.map((r) => r.replace("-run-", "-model-")).sort());
  assert.ok(!(model.nextCursor ?? "").startsWith("w."), `cursor ${model.nextCursor}: want the records walk's`);
});

test("approvals: the fleet's pending calls, approve with an edit, deny with a reason", async () => {
  const a = (await client.submit(example("approval.json"), { id: `appr-a-${newRunId()}` })).id;
  const b = (await client.submit(example("approval.json"), { id: `appr-b-${newRunId()}` })).id;
  const fa = await followUntil(a, (e) => e.event.type === "tool_approval_requested");
  const fb = await followUntil(b, (e) => e.event.type === "tool_approval_requested");
  // The records say they wait (written at once when the wait starts).
  const pending = await waitFor(async () => {
    const p = (await client.approvals()).filter((x) => x.run === a || x.run === b);
    return p.length === 2 ? p : null;
  }, "both runs in approvals()");
  for (const p of pending) {
    assert.equal(p.toolCallId, "c1");
    assert.equal(p.toolName, "calculator");
    assert.deepEqual(p.args, { expression: "1234*5678" });
    assert.equal(p.queue, "default");
    assert.ok(p.expiresAt && p.expiresAt > p.requestedAt);
  }
  assert.deepEqual(
    (await client.pendingOf(a)).map((p) => p.toolCallId),
    ["c1"],
  );
  await client.approve(a, "c1", { by: "alice", reason: "checked", arguments: { expression: "2+3" } });
  await client.deny(b, "c1", { by: "bob", reason: "not in production" });
  const ea = [];
  for (let r; !(r = await fa.it.next()).done; ) ea.push(r.value.event);
  const eb = [];
  for (let r; !(r = await fb.it.next()).done; ) eb.push(r.value.event);
  const resolved = ea.find((e) => e.type === "tool_approval_resolved");
  assert.equal(resolved.decision, "approve");
  assert.equal(resolved.by, "alice");
  const endA = ea.find((e) => e.type === "tool_execution_end");
  assert.equal(endA.isError, false);
  // The edited expression ran (2+3), not the model's (1234*5678 = 7006652, which has a 5 too).
  assert.deepEqual(endA.result.content, [{ type: "text", text: "5" }]);
  const endB = eb.find((e) => e.type === "tool_execution_end");
  assert.equal(endB.isError, true);
  assert.match(JSON.stringify(endB.result), /not in production/);
  assert.deepEqual(await client.pendingOf(a), []);
  await assert.rejects(client.deny(a, "c1", { arguments: {} }), InvalidArgumentError);
});

test("list: newest first, filters, pages, queued runs", async () => {
  // A queue that is declared but has no worker now: its runs stay queued.
  const parked = await startWorker(["--nats", hub.url, "--queue", "parked"], { name: "parked" });
  await parked.stop();
  const q = await client.submit({ prompt: "wait for me" }, { queue: "parked" });
  assert.equal((await client.status(q.id)).state, "queued");
  const ids = [];
  for (let i = 0; i < 4; i++) {
    const { id } = await client.submit({ prompt: `list ${i}` });
    await followAll(id);
    ids.push(id);
  }
  const bad = (await client.submit({ prompt: "x", tools: ["nope"] })).id;
  await followAll(bad);
  const page = await client.list({ limit: 3 });
  assert.equal(page.records.length, 3);
  assert.equal(page.records[0].id, q.id, "queued runs come first");
  assert.equal(page.records[0].state, "queued");
  assert.deepEqual(
    page.records.slice(1).map((r) => r.id),
    [bad, ids[3]],
  );
  const next = await client.list({ limit: 2, before: page.next });
  assert.deepEqual(
    next.records.map((r) => r.id),
    [ids[2], ids[1]],
  );
  const failed = await client.list({ state: "failed" });
  assert.ok(failed.records.some((r) => r.id === bad && r.reason === "bad_request"));
  assert.ok(failed.records.every((r) => r.state === "failed"));
  assert.deepEqual(
    (await client.list({ state: "queued" })).records.map((r) => r.id),
    [q.id],
  );
  const recent = await client.list({ since: new Date(Date.now() - 60_000), queue: "default" });
  assert.ok(recent.records.some((r) => r.id === ids[0]));
});

test("list: queued runs past a full page come on the next pages, each once", async () => {
  // A queue with no worker now: its runs stay queued.
  const parked = await startWorker(["--nats", hub.url, "--queue", "paging"], { name: "paging" });
  await parked.stop();
  const ids = [];
  for (let i = 0; i < 5; i++) ids.push((await client.submit({ prompt: `page ${i}` }, { queue: "paging" })).id);
  ids.sort();
  const seen = [];
  let before = "";
  for (let n = 0; n < 10; n++) {
    const page = await client.list({ queue: "paging", limit: 2, ...(before ? { before } : {}) });
    seen.push(...page.records.map((r) => r.id + ":" + r.state));
    if (!page.nextCursor) break;
    before = page.nextCursor;
  }
  assert.deepEqual(seen, ids.map((id) => id + ":queued"));
  await assert.rejects(client.list({ before: "q.1.2.no good" }), InvalidArgumentError);
});

test("throughput: following one run of 20,000 deltas, against submit follow --json", async (t) => {
  const { id } = await client.submit(manyDeltas(20_000));
  let n = 0;
  const t0 = performance.now();
  for await (const env of client.follow(id)) n++;
  const live = performance.now() - t0;
  // Replays of the stored run: this client, the same with the --json lines, and submit.
  const t1 = performance.now();
  let m = 0;
  for await (const env of client.follow(id)) m++;
  const replay = performance.now() - t1;
  const t2 = performance.now();
  let bytes = 0;
  for await (const env of client.follow(id, { includeUnknown: true })) bytes += formatEnvelope(env).length + 1;
  const replayJSON = performance.now() - t2;
  const t3 = performance.now();
  const go = await submit(hub.url, ["follow", "--json", id]);
  const goMs = performance.now() - t3;
  assert.equal(m, n);
  assert.ok(n > 20_000);
  assert.equal(go.stdout.split("\n").length - 1, n);
  const rate = (/** @type {number} */ count, /** @type {number} */ ms) => `${Math.round((count / ms) * 1000).toLocaleString("en")} events/s`;
  const report =
    `follow of one run with ${n} events: live ${rate(n, live)} (${live.toFixed(0)} ms, bound by the worker); ` +
    `replay ${rate(n, replay)} (${replay.toFixed(0)} ms); replay printed as --json ${rate(n, replayJSON)} (${replayJSON.toFixed(0)} ms, ${bytes} bytes); ` +
    `submit follow --json (a process: start, connect, replay, print) ${rate(n, goMs)} (${goMs.toFixed(0)} ms)`;
  t.diagnostic(report);
  console.log(`# ${report}`);
});

test("priority: a high or low request goes to its lane (since 1.10), its record says so; normal stays on the old subject", async () => {
  const high = await client.submit({ prompt: "urgent", priority: "high" });
  const low = await client.submit({ prompt: "batch", priority: "low" });
  const normal = await client.submit({ prompt: "usual", priority: "normal" });
  for (const { id } of [high, low, normal]) await followAll(id);
  assert.equal((await client.status(high.id)).priority, "high");
  assert.equal((await client.status(low.id)).priority, "low");
  assert.equal((await client.status(normal.id)).priority, undefined);
  assert.equal(client.names.request("default", "high", "r1"), "agents.lane.default.high._.r1");
  assert.equal(client.names.request("default", "normal", "r1"), "agents.submit.default.r1");
  assert.equal(client.names.request("default", undefined, "r1", "acme"), "agents.lane.default.normal.acme.r1");
  assert.equal(client.names.request("default", "low", "r1", "not a token"), "agents.lane.default.low._.r1");
  const tenant = await client.submit({ prompt: "mine", metadata: { tenant: "acme" } });
  await followAll(tenant.id);
  assert.equal((await client.status(tenant.id)).tenant, "acme");
  assert.deepEqual(client.names.parseSubmit("agents.lane.default.low._.r1"), { queue: "default", run: "r1", priority: "low" });
  await assert.rejects(client.submit({ prompt: "x", priority: /** @type {any} */ ("urgent") }), InvalidArgumentError);
});
