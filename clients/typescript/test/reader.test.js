// The readers' side without a fleet: the rules of docs/protocol.md §4, the
// --json line as Go writes it, the transcript, the SSE parser, and that the
// console entry point imports no NATS code.
import { test } from "node:test";
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join, dirname } from "node:path";

import { decodeEnvelope, Follower, formatEnvelope, goCompact, goString, pendingCalls, rawMember, Transcript } from "../src/reader.js";
import { GapError, DecodeError } from "../src/errors.js";
import { readSSE } from "../src/console.js";
import { checkControlKey, checkRunId, Names, newRunId } from "../src/names.js";
import { pkgDir } from "./fleet.js";

/** @param {number} attempt @param {number} seq @param {object} event @param {object} [extra] */
const env = (attempt, seq, event, extra = {}) => ({ run: "r1", seq, attempt, worker: "w", ts: 1, ...extra, event });

test("Follower: older attempts, copies and gaps; a cursor resumes", () => {
  const f = new Follower("r1");
  const take = (/** @type {any} */ e) => f.accept(e);
  assert.deepEqual(take(env(1, 1, { type: "run_started" })), { take: true });
  assert.deepEqual(take(env(1, 2, { type: "agent_start" })), { take: true });
  assert.deepEqual(take(env(1, 2, { type: "agent_start" })), { take: false }, "a stored copy");
  const g = take(env(1, 5, { type: "turn_start" }));
  assert.equal(g.take, true);
  assert.ok(g.gap instanceof GapError);
  assert.equal(g.gap.message, "run r1 attempt 1: events 3..4 missing");
  assert.deepEqual(take(env(2, 1, { type: "run_started" })), { take: true }, "a new attempt");
  assert.deepEqual(take(env(1, 6, { type: "message_start" })), { take: false }, "the older attempt's late event");
  assert.deepEqual(take(env(2, 2, { type: "run_resumed" })), { take: true });
  const c = f.cursor();
  assert.deepEqual(c, { from: 1, attempt: 2, seq: 2 });
  assert.deepEqual(take(env(2, 3, { type: "run_finished" })), { take: true });
  assert.equal(f.finished, true);
  assert.deepEqual(take(env(2, 4, { type: "run_started" })), { take: false }, "nothing after the first run_finished");
  f.read(42);
  assert.equal(f.cursor().from, 43);
  // Resumed mid-stream without the state: the first envelope is no gap.
  const blind = new Follower("r1", { from: 10 });
  assert.deepEqual(blind.accept(env(1, 7, { type: "turn_start" })), { take: true });
  assert.ok(blind.accept(env(1, 9, { type: "turn_end" })).gap);
  // With the state: it is.
  const resumed = new Follower("r1", { from: 10, attempt: 1, seq: 5 });
  assert.ok(resumed.accept(env(1, 7, { type: "turn_start" })).gap);
  assert.ok(new Follower("r1").accept(env(2, 3, { type: "turn_start" })).gap, "an attempt that starts past seq 1");
});

test("decodeEnvelope refuses what is not an envelope", () => {
  for (const bad of ["nope", "[]", "{}", '{"event":{}}', '{"event":{"type":""}}', '{"seq":"1","event":{"type":"x"}}', '{"event":null}']) {
    assert.throws(() => decodeEnvelope(bad, "r1"), DecodeError, bad);
  }
  const e = decodeEnvelope('{"run":"r1","seq":1,"attempt":1,"worker":"w","ts":5,"event":{"type":"future_event","x":1}}', "r1", 9);
  assert.equal(e.streamSeq, 9);
  assert.equal(e.event.type, "future_event");
});

test("the --json line: Go's field order, HTML escapes and compaction", () => {
  assert.equal(goString('a<b>&"\\\n\t\r\b\f\u0001\u2028\u2029é\u{1F600}'), '"a\\u003cb\\u003e\\u0026\\"\\\\\\n\\t\\r\\b\\f\\u0001\\u2028\\u2029é\u{1F600}"');
  assert.equal(goString("\ud800x"), '"\\ufffdx"', "a lone surrogate");
  assert.equal(goCompact('{ "a" : [ 1 , "x < y & \\" z " ] ,\n "b":{} }'), '{"a":[1,"x \\u003c y \\u0026 \\" z "],"b":{}}');
  assert.equal(goCompact('"\\\\" "'), '"\\\\""', "an escaped backslash ends before the quote");
  assert.equal(rawMember('{"a":{"event":1},"event" : {"type":"x"} ,"z":[1]}', "event"), '{"type":"x"}');
  // The worker's form, and the same envelope written otherwise: the same line.
  const canonical = '{"run":"r1","seq":3,"attempt":2,"worker":"w<1>","ts":17,"controlSeq":9,"interrupted":true,"event":{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"a<b> & c"}]}}}';
  const worker = '{"run":"r1","seq":3,"attempt":2,"worker":"w<1>","ts":17,"controlSeq":9,"interrupted":true,"event":{"type":"message_end","message":{"role":"user","content":[{"type":"text","text":"a<b> & c"}]}}}';
  const spaced = '{ "event" : { "type" : "message_end", "message": {"role":"user","content":[{"type":"text","text":"a<b> & c"}]} }, "interrupted": true, "controlSeq": 9, "ts": 17, "worker": "w\\u003c1>", "attempt": 2, "seq": 3, "run": "r1", "extra": {"x": 1} }';
  const want = canonical.replaceAll("<", "\\u003c").replaceAll(">", "\\u003e").replaceAll("&", "\\u0026");
  assert.equal(formatEnvelope(decodeEnvelope(worker, "r1")), want);
  assert.equal(formatEnvelope(decodeEnvelope(spaced, "r1")), want);
  // Zero fields are written as Go writes them; absent optional ones are left out.
  assert.equal(formatEnvelope(decodeEnvelope('{"event":{"type":"x"},"controlSeq":0,"interrupted":false}', "r1")), '{"run":"","seq":0,"attempt":0,"worker":"","ts":0,"event":{"type":"x"}}');
});

test("Transcript: streaming, a resumed attempt, copies", () => {
  const t = new Transcript();
  const user = { role: "user", content: [{ type: "text", text: "hi" }], timestamp: 1 };
  const header = { role: "assistant", content: [], api: "faux", provider: "faux", model: "m", usage: {}, stopReason: "", timestamp: 2 };
  const step = (/** @type {object} */ a) => ({ type: "message_update", assistantMessageEvent: a });
  const seq = [
    env(1, 1, { type: "run_started" }),
    env(1, 2, { type: "message_end", message: user }),
    env(1, 3, { type: "message_start", message: header }),
    env(1, 4, step({ type: "text_start", contentIndex: 0 })),
    env(1, 5, step({ type: "text_delta", contentIndex: 0, delta: "Hel" })),
    env(1, 5, step({ type: "text_delta", contentIndex: 0, delta: "Hel" })),
    env(1, 6, step({ type: "text_delta", contentIndex: 0, delta: "lo" })),
    env(1, 7, step({ type: "toolcall_start", contentIndex: 1, id: "c1", name: "calc" })),
    env(1, 8, step({ type: "text_delta", contentIndex: 5, delta: "ignored" })),
  ];
  for (const e of seq) t.apply(e);
  assert.deepEqual(t.partial?.content, [
    { type: "text", text: "Hello" },
    { type: "toolCall", id: "c1", name: "calc", arguments: {} },
  ]);
  // The worker dies; attempt 2 restores the first message and answers.
  for (const e of [
    env(2, 1, { type: "run_started" }),
    env(2, 2, { type: "run_resumed", attempt: 2, messagesRestored: 1 }),
    env(1, 9, { type: "message_end", message: { ...header, content: [{ type: "text", text: "late" }] } }),
    env(2, 3, { type: "message_start", message: header }),
    env(2, 4, { type: "message_end", message: { ...header, stopReason: "stop", content: [{ type: "text", text: "Hello again" }] } }),
    env(2, 5, { type: "run_finished", status: "succeeded" }),
  ])
    t.apply(e);
  assert.equal(t.partial, null);
  assert.deepEqual(
    t.messages.map((m) => m.role),
    ["user", "assistant"],
  );
  assert.equal(t.finalText(), "Hello again");
  assert.equal(t.finished?.status, "succeeded");
});

test("Transcript: a continuation names what it restored (transcript_restored, 1.9); an unknown event is skipped", () => {
  for (const type of ["transcript_restored", "transcript_restored_from_the_future"]) {
    const t = new Transcript();
    const user = { role: "user", content: [{ type: "text", text: "go on" }], timestamp: 1 };
    for (const e of [
      env(1, 1, { type: "run_started", continueFrom: "r0" }),
      env(1, 2, { type, from: "r0", messages: 12, bytes: 4096 }),
      env(1, 3, { type: "message_end", message: user }),
      env(1, 4, { type: "run_finished", status: "succeeded" }),
    ])
      t.apply(e);
    assert.deepEqual(t.messages, [user], type);
    assert.equal(t.finished?.status, "succeeded");
    assert.deepEqual(t.restored, type === "transcript_restored" ? { type, from: "r0", messages: 12, bytes: 4096 } : null, type);
  }
});

test("Transcript: compaction_end (1.10) is kept, a failed one is not, and every message stays", () => {
  const t = new Transcript();
  const user = { role: "user", content: [{ type: "text", text: "go" }], timestamp: 1 };
  const end = { type: "compaction_end", reason: "threshold", tokensBefore: 7000, tokensAfter: 3000, summary: "## Goal", firstKeptIndex: 1 };
  for (const e of [
    env(1, 1, { type: "run_started" }),
    env(1, 2, { type: "message_end", message: user }),
    env(1, 3, { type: "compaction_start", reason: "threshold", tokensBefore: 7000 }),
    env(1, 4, end),
    env(1, 5, { type: "compaction_end", reason: "manual", tokensBefore: 3000, error: "compaction: the summary call failed: 503" }),
    env(1, 6, { type: "message_end", message: user }),
  ])
    t.apply(e);
  assert.deepEqual(t.compactions, [end]);
  assert.equal(t.messages.length, 2);
});

test("pendingCalls: requested and not yet resolved, across attempts", () => {
  const req = (/** @type {string} */ id) => ({ type: "tool_approval_requested", toolCallId: id, toolName: "deploy", args: { to: id }, expiresAt: 99 });
  const envs = [env(1, 1, req("a")), env(1, 2, req("b")), env(1, 2, req("b")), env(2, 1, { type: "run_started" }), env(2, 2, { type: "tool_approval_resolved", toolCallId: "a", decision: "approve" })];
  assert.deepEqual(
    pendingCalls(envs).map((p) => [p.toolCallId, p.args]),
    [["b", { to: "b" }]],
  );
  assert.deepEqual(pendingCalls([...envs, env(2, 3, { type: "run_finished" })]), []);
});

test("readSSE: events, ids, comments, split chunks and CRLF", async () => {
  const text = ": hello\r\nevent: envelope\r\nid: 7\r\ndata: {\"a\":1}\r\n\r\n: heartbeat\n\nevent: end\ndata: {}\n\n";
  const enc = new TextEncoder().encode(text);
  const body = new ReadableStream({
    start(c) {
      for (let i = 0; i < enc.length; i += 5) c.enqueue(enc.subarray(i, i + 5));
      c.close();
    },
  });
  const got = [];
  for await (const ev of readSSE(body)) got.push(ev);
  assert.deepEqual(got, [
    { event: "envelope", id: "7", data: '{"a":1}' },
    { event: "end", id: "7", data: "{}" },
  ]);
});

test("names, ids and keys", () => {
  const n = new Names("acme.agents");
  assert.equal(n.runsStream, "ACME_AGENTS_RUNS");
  assert.equal(n.recordsBucket, "acme_agents_runs");
  assert.equal(n.events("r1"), "acme.agents.run.r1.events");
  assert.deepEqual(n.parseSubmit("acme.agents.submit.q.r1"), { queue: "q", run: "r1" });
  assert.equal(n.parseSubmit("acme.agents.submit.q.r1.x"), null);
  assert.match(newRunId(), /^[a-z2-7]{26}$/);
  for (const bad of ["", "a.b", "a*", "a b", "x".repeat(65)]) assert.throws(() => checkRunId(bad), /invalid run id/);
  assert.throws(() => checkControlKey("a b"), /invalid control key/);
  assert.throws(() => new Names("a..b"), /invalid subject prefix/);
});

test("the console entry point imports no NATS code", () => {
  const seen = new Set();
  const visit = (/** @type {string} */ file) => {
    if (seen.has(file)) return;
    seen.add(file);
    const src = readFileSync(file, "utf8");
    for (const m of src.matchAll(/^\s*(?:import|export)\s[^;]*?from\s+"([^"]+)"/gm)) {
      const spec = m[1];
      assert.ok(spec.startsWith("./"), `${file} imports ${spec}`);
      visit(join(dirname(file), spec));
    }
  };
  visit(join(pkgDir, "src/console.js"));
  assert.ok(seen.size >= 4);
});

test("the --json line of envelopes a decoder reads otherwise than their text suggests", () => {
  // Go keeps the last of two "event" members, and members in their order.
  assert.equal(
    formatEnvelope(decodeEnvelope('{"run":"r","event":{"type":"a"},"event":{"type":"b"}}', "r")),
    '{"run":"r","seq":0,"attempt":0,"worker":"","ts":0,"event":{"type":"b"}}',
  );
  assert.equal(formatEnvelope(decodeEnvelope('{"run":"r","event":{"type":"a"},"0":{"x":1}}', "r")), '{"run":"r","seq":0,"attempt":0,"worker":"","ts":0,"event":{"type":"a"}}');
  assert.equal(formatEnvelope(decodeEnvelope('{"run":"r","event":{"type":"a","args":{"x":1,"event":2}}}', "r")), '{"run":"r","seq":0,"attempt":0,"worker":"","ts":0,"event":{"type":"a","args":{"x":1,"event":2}}}');
});

// Protocol 1.9: a reader that knows nothing of run_parked skips it; the
// woken attempt restores the transcript as after a crash.
test("Transcript: a parked run woken on a later attempt", () => {
  const t = new Transcript();
  const user = { role: "user", content: [{ type: "text", text: "deploy" }], timestamp: 1 };
  const call = { role: "assistant", content: [{ type: "toolCall", id: "c1", name: "deploy", arguments: {} }], stopReason: "toolUse", timestamp: 2 };
  const result = { role: "toolResult", toolCallId: "c1", toolName: "deploy", content: [{ type: "text", text: "deployed" }], isError: false, timestamp: 3 };
  const done = { role: "assistant", content: [{ type: "text", text: "done" }], stopReason: "stop", timestamp: 4 };
  for (const e of [
    env(1, 1, { type: "run_started" }),
    env(1, 2, { type: "message_end", message: user }),
    env(1, 3, { type: "message_end", message: call }),
    env(1, 4, { type: "tool_approval_requested", toolCallId: "c1", toolName: "deploy", expiresAt: 9 }),
    env(1, 5, { type: "run_parked", attempt: 1, waiting: { for: "approval" } }),
    env(2, 1, { type: "run_started" }),
    env(2, 2, { type: "run_resumed", attempt: 2, messagesRestored: 2 }),
    env(2, 3, { type: "tool_approval_resolved", toolCallId: "c1", decision: "approve" }),
    env(2, 4, { type: "message_end", message: result }),
    env(2, 5, { type: "message_end", message: done }),
    env(2, 6, { type: "run_finished", status: "succeeded" }),
  ])
    t.apply(e);
  assert.deepEqual(
    t.messages.map((m) => m.role),
    ["user", "assistant", "toolResult", "assistant"],
  );
  assert.equal(t.finalText(), "done");
});
