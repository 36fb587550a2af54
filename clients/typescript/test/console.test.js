// The console entry point (@agentfleet/client/console) against the console
// binary (token auth, --allow-control) in front of a real worker: from Node,
// and in headless Chromium through the example page.
import { test, before, after } from "node:test";
import assert from "node:assert/strict";
import { writeFileSync, existsSync } from "node:fs";
import { join } from "node:path";
import { execFileSync } from "node:child_process";

import { connect, formatEnvelope, RAW } from "../src/index.js";
import { ConsoleClient, ConsoleError, RunFinishedError, RunNotFoundError } from "../src/console.js";
import { serve } from "../examples/serve.js";
import { startWorker, startConsole, tempDir, sleeper, gated, repoDir } from "./fleet.js";
import { readFileSync } from "node:fs";

const token = "tok-" + "0123456789abcdef".repeat(2);
/** @type {Awaited<ReturnType<typeof startWorker>>} */
let hub;
/** @type {Awaited<ReturnType<typeof startConsole>>} */
let con;
/** @type {import("../src/index.js").Client} */
let nats;
/** @type {ConsoleClient} */
let web;
let tokenFile = "";

before(async () => {
  hub = await startWorker(["--concurrency", "8"], { name: "hub" });
  tokenFile = join(tempDir("token"), "token");
  writeFileSync(tokenFile, token + "\n");
  con = await startConsole(hub.url, ["--allow-control", "--auth-token-file", tokenFile]);
  nats = await connect({ servers: hub.url });
  web = new ConsoleClient({ baseUrl: con.base, token, followStallMs: 1000 });
});

after(async () => {
  await nats?.close();
  await con?.stop();
  await hub?.stop();
});

const calculator = () => ({ prompt: "What is 1234*5678? <b>&amp;</b>", ...JSON.parse(readFileSync(join(repoDir, "cmd/submit/examples/calculator.json"), "utf8")) });

/** @param {AsyncIterable<any>} it */
async function all(it) {
  const out = [];
  for await (const x of it) out.push(x);
  return out;
}

/** Follows through the console until an event; returns the rest as a promise. @param {string} run @param {string} type */
async function consoleUntil(run, type) {
  const f = web.follow(run);
  const it = f[Symbol.asyncIterator]();
  const seen = [];
  for (;;) {
    const r = await it.next();
    assert.ok(!r.done, `run ${run} ended before ${type}`);
    seen.push(r.value);
    if (r.value.event.type === type) break;
  }
  const rest = (async () => {
    for (let r; !(r = await it.next()).done; ) seen.push(r.value);
    return seen;
  })();
  return { f, rest };
}

test("follow through the console: what a NATS follower reads, envelope for envelope", async () => {
  const { id } = await nats.submit(calculator());
  const [viaConsole, viaNats] = await Promise.all([all(web.follow(id)), all(nats.follow(id))]);
  assert.ok(viaConsole.length > 10);
  assert.deepEqual(
    viaConsole.map((e) => [e.streamSeq, e[RAW]]),
    viaNats.map((e) => [e.streamSeq, e[RAW]]),
  );
  assert.deepEqual(
    viaConsole.map((e) => formatEnvelope(e)),
    viaNats.map((e) => formatEnvelope(e)),
  );
  // A replay from a stream sequence.
  const k = 6;
  const tail = await all(web.follow(id, { from: viaNats[k].streamSeq }));
  assert.deepEqual(
    tail.map((e) => e.streamSeq),
    viaNats.slice(k).map((e) => e.streamSeq),
  );
  // A resume after the end: the console says so at once.
  const last = viaNats.at(-1);
  assert.deepEqual(await all(web.follow(id, { from: last.streamSeq + 1, attempt: last.attempt, seq: last.seq })), []);
  assert.equal((await web.status(id)).state, "succeeded");
});

test("control through the console: keys, approvals, abort, and its answers (409, 404, 401, 422)", async () => {
  // The run waits for its calculator call's answer while we steer.
  const { id } = await nats.submit(gated());
  const { rest } = await consoleUntil(id, "tool_approval_requested");
  const s1 = await web.steer(id, "Count in French instead", { key: "french" });
  const s2 = await web.steer(id, "Count in French instead", { key: "french" });
  assert.equal(s2.seq, s1.seq);
  const f1 = await web.followUp(id, "And in German?");
  // An edit the tool's schema refuses is a 422 and leaves the call waiting;
  // an answer for a call that does not wait, a 409.
  await assert.rejects(web.approve(id, "c1", { arguments: { bogus: 1 } }), (err) => err instanceof ConsoleError && err.status === 422);
  await assert.rejects(web.approve(id, "nosuchcall"), (err) => err instanceof ConsoleError && err.status === 409);
  await web.approve(id, "c1", { reason: "checked" });
  const envs = await rest;
  assert.deepEqual(
    envs.filter((e) => e.event.type === "message_end" && e.controlSeq).map((e) => e.controlSeq),
    [s1.seq, f1.seq],
  );
  // After the end: the retry of a message stored in time answers its
  // sequence; a new one is a 409.
  assert.equal((await web.steer(id, "Count in French instead", { key: "french" })).seq, s1.seq);
  await assert.rejects(web.steer(id, "too late"), (err) => err instanceof RunFinishedError && err.status === 409);
  await assert.rejects(web.status("no-such-run"), RunNotFoundError);
  await assert.rejects(all(web.follow("no-such-run")), RunNotFoundError);

  await assert.rejects(new ConsoleClient({ baseUrl: con.base }).status(id), (err) => err instanceof ConsoleError && err.status === 401);

  const { id: slow } = await nats.submit(sleeper(60));
  const { rest: r2 } = await consoleUntil(slow, "tool_execution_start");
  // An aborted signal: rejected at once with its reason (the run sleeps a
  // minute: a follow that went on would wait with it).
  const stop = new Error("stopped before it began");
  const stray = web.follow(slow, { signal: AbortSignal.abort(stop) });
  /** @type {ReturnType<typeof setTimeout> | undefined} */
  let late;
  try {
    const early = await Promise.race([all(stray).catch((err) => err), new Promise((r) => (late = setTimeout(r, 5000, "still following after 5 s")))]);
    assert.equal(early, stop);
  } finally {
    clearTimeout(late);
    stray.close();
  }
  await web.abort(slow, { reason: "from the console" });
  const fin = (await r2).at(-1).event;
  assert.equal(fin.type, "run_finished");
  assert.equal(fin.status, "aborted");
});

test("the console restarts under a follower: it reconnects after the last stream sequence it had", async () => {
  const { id } = await nats.submit(sleeper(2));
  const { f, rest } = await consoleUntil(id, "tool_execution_start");
  await con.kill();
  con = await startConsole(hub.url, ["--allow-control", "--auth-token-file", tokenFile], { port: con.port });
  const envs = await rest;
  assert.ok(f.connects >= 2, `connects ${f.connects}`);
  assert.deepEqual(f.warnings, []);
  assert.deepEqual(
    envs.map((e) => e.streamSeq),
    (await all(nats.follow(id))).map((e) => e.streamSeq),
  );
  // The new console has a new CSRF key: the client fetches the token again.
  const { id: next } = await nats.submit(gated());
  const { rest: r2 } = await consoleUntil(next, "tool_approval_requested");
  const s = await web.steer(next, "after the restart");
  await nats.approve(next, "c1");
  assert.ok((await r2).some((e) => e.controlSeq === s.seq));
});

/** The Chromium binary, or null (CI must have one). */
function chromiumPath() {
  if (process.env.CHROMIUM) return process.env.CHROMIUM;
  for (const name of ["chromium", "chromium-browser", "google-chrome"]) {
    try {
      const p = execFileSync("sh", ["-c", `command -v ${name}`]).toString().trim();
      if (p && existsSync(p)) return p;
    } catch {
      // not there
    }
  }
  return null;
}

test("in the browser: the example page follows a run live through the console, and steers it", async (t) => {
  const path = chromiumPath();
  if (!path) {
    if (process.env.CI === "true") assert.fail("no chromium and CI=true: apt-get install chromium, or set CHROMIUM");
    t.skip("no chromium (apt-get install chromium, or set CHROMIUM)");
    return;
  }
  const { chromium } = await import("playwright-core");
  const proxy = await serve({ console: con.base });
  const browser = await chromium.launch({
    executablePath: path,
    args: ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update", "--no-first-run"],
  });
  try {
    const page = await browser.newPage();
    /** @type {string[]} */
    const problems = [];
    page.on("pageerror", (err) => problems.push(`exception: ${err.message}`));
    page.on("console", (m) => {
      if (m.type() === "error" || /Content Security Policy/.test(m.text())) problems.push(`console ${m.type()}: ${m.text()} (${m.location().url})`);
    });
    // Log in as a browser does: ?token= once, the console keeps it in a cookie.
    await page.goto(`${proxy.base}/api/session?token=${token}`);
    assert.match(await page.content(), /"allowControl":true/);

    // A run that waits for its tool call's answer: the page shows it, steers
    // it, and shows the rest live once the call is approved.
    const { id } = await nats.submit(gated("<script>alert(1)</script> & <img src=x onerror=alert(2)>"));
    await page.goto(`${proxy.base}/examples/follow.html?run=${id}`);
    await page.waitForFunction(() => /waiting for approval of calculator/.test(document.getElementById("status")?.textContent ?? ""), null, { timeout: 30_000 });
    assert.equal(await page.isVisible("#steer"), true);
    await page.fill("#text", "Steered from the browser");
    await page.click("#steer button");
    await page.waitForFunction(() => /steering sent/.test(document.getElementById("status")?.textContent ?? ""), null, { timeout: 30_000 });
    await nats.approve(id, "c1");
    await page.waitForFunction(() => document.body.dataset.state === "finished", null, { timeout: 60_000 });
    const envs = await all(nats.follow(id));
    assert.equal(await page.textContent("#events"), String(envs.length));
    assert.equal(await page.textContent("#cursor"), String(envs.at(-1).streamSeq));
    const steered = envs.find((e) => e.event.type === "message_end" && e.controlSeq);
    assert.ok(steered, "the page's steer reached the run");
    assert.match(JSON.stringify(steered.event), /Steered from the browser/);
    assert.equal(await page.getAttribute("body", "data-final"), "One, two, three.");
    assert.match((await page.textContent("#status")) ?? "", /^succeeded · 2 turn/);
    // The run's text is text: nothing it holds became markup.
    assert.equal(await page.locator("#transcript script, #transcript img").count(), 0);
    assert.match((await page.textContent("#transcript")) ?? "", /<script>alert\(1\)<\/script>/);

    // The package in the page's own script: follow a finished run through
    // the console module, as an application would.
    const { id: done } = await nats.submit(calculator());
    const viaNats = await all(nats.follow(done));
    const lines = await page.evaluate(async (run) => {
      const m = await import("/src/console.js");
      const c = new m.ConsoleClient();
      const out = [];
      for await (const env of c.follow(run)) out.push(m.formatEnvelope(env));
      return out;
    }, done);
    assert.deepEqual(
      lines,
      viaNats.map((e) => formatEnvelope(e)),
    );
    assert.deepEqual(problems, []);
  } finally {
    await browser.close();
    await proxy.close();
  }
});
