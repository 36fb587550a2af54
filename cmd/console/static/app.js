// agentfleet console. Hand-written, no build step, no dependencies.
// Rule: everything that comes from a run (model text, tool arguments and
// results, ids, errors) is put into the page as text (text nodes and
// textContent), never as HTML.
"use strict";

const session = { user: "", csrf: "", allowControl: false };

// el builds an element: attrs are properties or attributes, children are
// nodes or strings (which become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "for" || k === "role") e.setAttribute(k, v);
    else e[k] = v;
  }
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function toast(msg, bad) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = bad ? "show bad" : "show";
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, 5000);
}

async function getJSON(path, signal) {
  const r = await fetch(path, { signal, headers: { Accept: "application/json" } });
  const body = await r.json().catch(() => ({}));
  if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
  return body;
}

// newKey makes an Idempotency-Key: getRandomValues, unlike randomUUID,
// works on a page served over plain http.
function newKey() {
  return Array.from(crypto.getRandomValues(new Uint8Array(16)), (b) => b.toString(16).padStart(2, "0")).join("");
}

// post sends a request with the page's CSRF token. A control request
// carries a key: one that got no answer (the connection dropped) may have
// been stored, so it is sent again with the same key, which the stream
// stores once (docs/console.md), a few times before the error is shown.
async function post(path, body, key) {
  const headers = { "Content-Type": "application/json", "X-CSRF-Token": session.csrf };
  if (key) headers["Idempotency-Key"] = key;
  for (let attempt = 1; ; attempt++) {
    let r;
    try {
      r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body || {}) });
    } catch (err) {
      if (!key || attempt >= 3) throw err;
      await new Promise((done) => setTimeout(done, 250 * attempt));
      continue;
    }
    const out = await r.json().catch(() => ({}));
    if (!r.ok) throw new Error(out.error || r.status + " " + r.statusText);
    return out;
  }
}

// runPath is the page of a run; ids are [A-Za-z0-9_-], encoded anyway.
const runPath = (id) => "/runs/" + encodeURIComponent(id);

function fmtTokens(u) {
  const n = (u && u.totalTokens) || 0;
  return n >= 10000 ? (n / 1000).toFixed(1) + "k" : String(n);
}
function fmtCost(c) { return c ? "$" + c.toFixed(c < 0.01 ? 5 : 3) : "–"; }
function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0) return "–";
  if (ms < 1000) return ms + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + Math.round(s % 60) + "s";
  return Math.floor(m / 60) + "h " + (m % 60) + "m";
}
const isZeroTime = (t) => !t || t.startsWith("0001-");
function runDuration(r) {
  if (isZeroTime(r.startedAt)) return null;
  const end = isZeroTime(r.finishedAt) ? Date.now() : Date.parse(r.finishedAt);
  return end - Date.parse(r.startedAt);
}
function fmtTime(t) {
  if (isZeroTime(t)) return "–";
  const d = new Date(t);
  return d.toLocaleTimeString([], { hour12: false }) + (Date.now() - d > 86400000 ? " " + d.toLocaleDateString() : "");
}
function stateBadge(state, stale) {
  return el("span", { class: "badge state-" + (stale ? "stale" : state), "data-state": state },
    stale ? state + " · stale" : state);
}

// ---------------------------------------------------------------- runs page

const STATES = ["", "queued", "running", "waiting", "stale", "succeeded", "failed", "aborted"];

function runsPage(main) {
  const params = new URLSearchParams(location.search);
  const state = el("select", { id: "f-state", "aria-label": "state" },
    ...STATES.map((s) => el("option", { value: s, text: s || "all states" })));
  state.value = params.get("state") || "";
  const queue = el("input", { id: "f-queue", placeholder: "queue", value: params.get("queue") || "", size: 10 });
  const q = el("input", { id: "f-q", placeholder: "search run id", value: params.get("q") || "", size: 28 });
  const count = el("span", { class: "muted", id: "runs-count" });
  const tbody = el("tbody", { id: "runs-body" });
  main.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Runs"), state, queue, q, count),
    el("table", { class: "runs", id: "runs" },
      el("thead", {}, el("tr", {}, ...["Run", "State", "Queue", "Model", "Metadata", "Attempt", "Worker",
        "Turns", "Tokens", "Cost", "Duration", "Submitted"].map((h) => el("th", {}, h)))),
      tbody));

  let ctl = null;
  let version = null;
  const query = () => {
    const p = new URLSearchParams();
    if (state.value) p.set("state", state.value);
    if (queue.value.trim()) p.set("queue", queue.value.trim());
    if (q.value.trim()) p.set("q", q.value.trim());
    return p;
  };
  const render = (page) => {
    const rows = page.runs.map((r) => {
      const meta = Object.entries(r.metadata || {}).map(([k, v]) => k + "=" + v).join(" ");
      return el("tr", { "data-run": r.id, "data-state": r.stale ? "stale" : r.state },
        el("td", { class: "mono" }, el("a", { href: runPath(r.id) }, r.id)),
        el("td", {}, stateBadge(r.state, r.stale), r.reason ? el("span", { class: "muted" }, " " + r.reason) : null,
          r.waiting && r.state === "running" ? el("span", { class: "muted" }, " waiting for " + r.waiting.for) : null),
        el("td", {}, r.queue || ""),
        el("td", {}, r.model || ""),
        el("td", { class: "meta" }, meta),
        el("td", { class: "num" }, String(r.attempt || "")),
        el("td", { class: "mono small" }, r.worker || ""),
        el("td", { class: "num" }, String(r.turns || 0)),
        el("td", { class: "num" }, fmtTokens(r.usage)),
        el("td", { class: "num" }, fmtCost(r.cost)),
        el("td", { class: "num" }, fmtDuration(runDuration(r))),
        el("td", { class: "small" }, fmtTime(r.submittedAt || r.startedAt)));
    });
    if (rows.length === 0) {
      rows.push(el("tr", {}, el("td", { colSpan: 12, class: "muted empty" },
        page.ready ? "No runs match." : "Reading the run records…")));
    }
    tbody.replaceChildren(...rows);
    count.textContent = page.total > page.runs.length
      ? page.runs.length + " of " + page.total + " runs" : page.total + " runs";
  };
  // loop long-polls: each answer comes when the records change.
  const loop = async () => {
    ctl = new AbortController();
    const signal = ctl.signal;
    while (!signal.aborted) {
      const p = query();
      if (version !== null) p.set("after", version);
      try {
        const page = await getJSON("/api/runs?" + p, signal);
        version = page.version;
        render(page);
        // A busy fleet changes records all the time: at most two
        // renders a second.
        await new Promise((r) => setTimeout(r, 500));
      } catch (e) {
        if (signal.aborted) return;
        count.textContent = "disconnected: " + e.message;
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
  };
  const refilter = () => {
    const p = query();
    history.replaceState(null, "", p.toString() ? "/?" + p : "/");
    if (ctl) ctl.abort();
    version = null;
    loop();
  };
  state.addEventListener("change", refilter);
  let typing = null;
  for (const i of [queue, q]) {
    i.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(refilter, 250); });
  }
  loop();
}

// ----------------------------------------------------------------- run page

// Transcript replays a run's envelopes into the page, under the readers'
// rules: events of an older attempt that come after a newer attempt's
// run_started are ignored; of an attempt's seq only the first counts (a
// re-sent event may be stored twice); run_resumed keeps only the first
// messagesRestored messages of the earlier attempts.
class Transcript {
  constructor(root, onStatus) {
    this.root = root;
    this.onStatus = onStatus;
    this.attempt = 0;
    this.lastSeq = 0; // of this.attempt
    this.messages = []; // finished message elements, in transcript order
    this.current = null; // the message being streamed
    this.blocks = [];
    this.calls = new Map(); // toolCallId -> tool call element
    this.turn = 0;
    this.finished = null;
  }

  apply(env) {
    if (env.attempt < this.attempt) return; // a stale attempt's late event
    if (env.attempt === this.attempt && env.seq && env.seq <= this.lastSeq) return; // a stored copy
    const ev = env.event || {};
    if (env.attempt > this.attempt) {
      if (this.attempt > 0 && this.current) {
        this.current.classList.add("interrupted");
        this.current.append(el("div", { class: "note" }, "interrupted: attempt " + this.attempt + " stopped here"));
        this.current = null;
      }
      this.attempt = env.attempt;
    }
    if (env.seq) this.lastSeq = env.seq;
    switch (ev.type) {
      case "run_started": return this.runStarted(env, ev);
      case "run_resumed": return this.runResumed(ev);
      case "run_finished": return this.runFinished(ev);
      case "message_start": return this.messageStart(env, ev.message || {});
      case "message_update": return this.messageUpdate(ev.assistantMessageEvent || {});
      case "message_end": return this.messageEnd(env, ev.message || {});
      case "tool_execution_start": return this.toolState(ev.toolCallId, "running");
      case "tool_execution_end": return this.toolState(ev.toolCallId, ev.isError ? "error" : "done");
      case "turn_end":
        this.turn++;
        this.root.append(el("div", { class: "turn-sep" }, el("span", {}, "turn " + this.turn)));
        return;
    }
  }

  fleetEvent(cls, ...parts) {
    this.root.append(el("div", { class: "fleet-event " + cls }, ...parts));
  }

  runStarted(env, ev) {
    const model = ev.model ? ev.model.provider + "/" + ev.model.id : "";
    this.fleetEvent("started", "attempt " + ev.attempt + " started on ", el("span", { class: "mono" }, ev.worker || env.worker),
      " · queue " + ev.queue + (model ? " · " + model : "") +
      (ev.tools && ev.tools.length ? " · tools: " + ev.tools.join(", ") : "") +
      (ev.continueFrom ? " · continues " + ev.continueFrom : ""));
    if (ev.notice) this.fleetEvent("notice", ev.notice);
    this.onStatus({ attempt: ev.attempt, worker: ev.worker || env.worker, queue: ev.queue, model, state: "running" });
  }

  runResumed(ev) {
    const keep = ev.messagesRestored || 0;
    for (const m of this.messages.slice(keep)) {
      m.classList.add("dropped");
      m.prepend(el("div", { class: "note" }, "not kept: the next attempt resumed before this message"));
    }
    this.messages = this.messages.slice(0, keep);
    this.fleetEvent("resumed", "attempt " + ev.attempt + " resumed the run: " + keep + " messages restored");
  }

  runFinished(ev) {
    this.finished = ev;
    const u = ev.usage || {};
    this.fleetEvent("finished state-" + ev.status,
      "finished: " + ev.status + (ev.reason ? " (" + ev.reason + ")" : "") +
      " · " + ev.turns + " turns · " + (u.totalTokens || 0) + " tokens · " + fmtCost(ev.cost) +
      " · " + fmtDuration(ev.durationMs),
      ev.error ? el("div", { class: "error-text" }, ev.error) : null);
    this.onStatus({ state: ev.status, reason: ev.reason, turns: ev.turns, usage: ev.usage, cost: ev.cost, durationMs: ev.durationMs, finished: true });
  }

  messageStart(env, m) {
    const role = m.role || "message";
    const body = el("div", { class: "body" });
    const box = el("div", { class: "msg msg-" + role, "data-role": role },
      el("div", { class: "role" }, roleLabel(m)), body);
    box.body = body;
    this.root.append(box);
    this.current = box;
    this.blocks = [];
    if (role !== "assistant") this.fill(box, m);
  }

  messageUpdate(se) {
    const box = this.current;
    if (!box) return;
    const i = se.contentIndex || 0;
    const block = (kind) => {
      if (!this.blocks[i]) {
        this.blocks[i] = renderBlock({ type: kind, name: se.name, id: se.id, text: "", thinking: "" }, this);
        box.body.append(this.blocks[i]);
      }
      return this.blocks[i];
    };
    switch (se.type) {
      case "text_start": block("text"); break;
      case "text_delta": block("text").querySelector(".text").append(se.delta || ""); break;
      case "thinking_start": block("thinking"); break;
      case "thinking_delta": block("thinking").querySelector(".text").append(se.delta || ""); break;
      case "toolcall_start": block("toolCall"); break;
      case "toolcall_delta": block("toolCall").querySelector(".args").append(se.delta || ""); break;
      case "toolcall_end":
        if (se.toolCall) block("toolCall").querySelector(".args").textContent = JSON.stringify(se.toolCall.arguments || {}, null, 2);
        break;
    }
  }

  messageEnd(env, m) {
    let box = this.current;
    if (!box || box.dataset.role !== m.role) {
      this.messageStart(env, m);
      box = this.current;
    }
    if (m.role === "assistant") {
      box.body.replaceChildren();
      this.fill(box, m);
      if (m.usage) this.onStatus({ addUsage: m.usage });
    }
    if (m.role === "toolResult") {
      const call = this.calls.get(m.toolCallId);
      if (call) {
        box.remove();
        const res = el("div", { class: "result" + (m.isError ? " is-error" : "") },
          el("div", { class: "label" }, m.isError ? "error result" : "result"));
        for (const c of contentOf(m)) res.append(renderBlock(c, this));
        call.querySelector(".results").append(res);
        box = res;
      }
    }
    if (env.interrupted) box.append(el("div", { class: "note" }, "interrupted: the worker stopped; the next attempt answers again"));
    if (m.stopReason === "error" || m.stopReason === "aborted") {
      box.append(el("div", { class: "note error-text" }, m.stopReason + (m.errorMessage ? ": " + m.errorMessage : "")));
    }
    this.messages.push(box);
    this.current = null;
    this.blocks = [];
  }

  fill(box, m) {
    for (const c of contentOf(m)) box.body.append(renderBlock(c, this));
  }

  toolState(id, state) {
    const call = this.calls.get(id);
    if (call) call.dataset.exec = state;
  }
}

function roleLabel(m) {
  switch (m.role) {
    case "user": return "user";
    case "assistant": return "assistant" + (m.model ? " · " + m.model : "");
    case "toolResult": return "tool result · " + (m.toolName || "");
  }
  return m.role || "message";
}

function contentOf(m) {
  if (typeof m.content === "string") return [{ type: "text", text: m.content }];
  return Array.isArray(m.content) ? m.content : [];
}

const SAFE_MIME = /^image\/(png|jpeg|gif|webp|bmp)$/;
const BASE64 = /^[A-Za-z0-9+/=\s]*$/;

function renderBlock(c, tr) {
  switch (c.type) {
    case "text":
      return el("div", { class: "block" }, el("div", { class: "text" }, c.text || ""));
    case "thinking":
      return el("details", { class: "block thinking" }, el("summary", {}, c.redacted ? "thinking (redacted)" : "thinking"),
        el("div", { class: "text" }, c.thinking || ""));
    case "image":
      if (SAFE_MIME.test(c.mimeType || "") && BASE64.test(c.data || "")) {
        return el("div", { class: "block" }, el("img", { class: "image", alt: "image (" + c.mimeType + ")", src: "data:" + c.mimeType + ";base64," + c.data }));
      }
      return el("div", { class: "block note" }, "image of type " + (c.mimeType || "?") + " not shown");
    case "toolCall": {
      const call = el("div", { class: "block toolcall", "data-exec": "called" },
        el("div", { class: "label" }, "tool call · ", el("span", { class: "mono" }, c.name || ""), el("span", { class: "exec" })),
        el("pre", { class: "args" }, c.arguments ? JSON.stringify(c.arguments, null, 2) : ""),
        el("div", { class: "results" }));
      if (c.id && tr) {
        const old = tr.calls.get(c.id);
        if (old && old.isConnected && !old.closest(".dropped")) {
          // The final message replaces the streamed block: keep results.
          call.querySelector(".results").replaceWith(old.querySelector(".results"));
          call.dataset.exec = old.dataset.exec;
        }
        tr.calls.set(c.id, call);
      }
      return call;
    }
  }
  return el("div", { class: "block note" }, "(" + (c.type || "unknown") + " block)");
}

async function runPage(main, id) {
  document.title = id + " · agentfleet console";
  const status = {};
  const line = el("div", { class: "statusline", id: "status" });
  const transcript = el("div", { class: "transcript", id: "transcript" });
  const controls = el("div", { class: "controls", id: "controls" });
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "Run ", el("span", { class: "mono", id: "run-id" }, id))), line, controls, transcript);

  const drawStatus = () => {
    const u = status.usage || {};
    line.replaceChildren(...[
      stateBadge(status.state || "unknown", status.stale),
      status.reason ? el("span", { class: "muted" }, status.reason) : null,
      el("span", {}, "queue " + (status.queue || "–")),
      el("span", {}, "model " + (status.model || "–")),
      el("span", {}, "attempt " + (status.attempt || "–")),
      el("span", { class: "mono" }, "worker " + (status.worker || "–")),
      el("span", {}, (status.turns || 0) + " turns"),
      el("span", {}, (u.totalTokens || 0) + " tokens"),
      el("span", {}, "cost " + fmtCost(status.cost)),
      el("span", {}, "duration " + fmtDuration(status.durationMs)),
    ].filter(Boolean));
    line.dataset.state = status.state || "";
    controls.hidden = !!status.finished;
  };
  const update = (s) => {
    if (s.addUsage) {
      // Tokens of the messages streamed so far; the record has the total.
      return;
    }
    Object.assign(status, s);
    drawStatus();
  };
  const fromRecord = (r) => {
    update({ state: r.state, stale: r.stale, reason: r.reason, queue: r.queue, model: r.model, attempt: r.attempt,
      worker: r.worker, turns: r.turns, usage: r.usage, cost: r.cost, durationMs: runDuration(r),
      finished: ["succeeded", "failed", "aborted"].includes(r.state) });
  };
  drawStatus();

  if (session.allowControl) {
    const form = (action, placeholder, button) => {
      const input = el("input", { name: "text", placeholder, id: action + "-text", autocomplete: "off" });
      const f = el("form", { class: "control", id: action + "-form" }, input, el("button", { type: "submit" }, button));
      // The same text sent again after an error keeps its key: if the
      // first send was stored after all, the run takes it once.
      let unsent = { text: null, key: "" };
      f.addEventListener("submit", async (e) => {
        e.preventDefault();
        const text = input.value;
        if (!text.trim()) return;
        try {
          if (unsent.text !== text) unsent = { text, key: newKey() };
          const key = unsent.key;
          await post("/api/runs/" + encodeURIComponent(id) + "/" + action, { text }, key);
          // Another text may have been sent (or typed) meanwhile.
          if (unsent.key === key) unsent = { text: null, key: "" };
          if (input.value === text) input.value = "";
          toast(button + ": sent");
        } catch (err) { toast(button + ": " + err.message, true); }
      });
      return f;
    };
    const abort = el("button", { id: "abort", class: "danger" }, "Abort");
    abort.addEventListener("click", async () => {
      try {
        await post("/api/runs/" + encodeURIComponent(id) + "/abort", { reason: "aborted from the console by " + session.user }, newKey());
        toast("abort: sent");
      } catch (err) { toast("abort: " + err.message, true); }
    });
    controls.append(form("steer", "steer: taken after the current turn", "Steer"),
      form("followup", "follow-up: taken when the run would stop", "Follow up"), abort,
      el("div", { class: "muted small approvals" }, "Tool approvals: not available on this fleet yet."));
  } else {
    controls.append(el("div", { class: "muted small" }, "Read-only console: start it with --allow-control to steer, follow up and abort."));
  }

  const tr = new Transcript(transcript, update);
  let lastId = 0;
  const follow = () => {
    const es = new EventSource("/api/runs/" + encodeURIComponent(id) + "/events" + (lastId ? "?after=" + lastId : ""));
    es.addEventListener("envelope", (e) => {
      const seq = Number(e.lastEventId);
      if (seq && seq <= lastId) return; // never twice
      if (seq) lastId = seq;
      let env;
      try { env = JSON.parse(e.data); } catch { return; }
      tr.apply(env);
      transcript.dataset.lastEventId = String(lastId);
    });
    es.addEventListener("end", () => {
      es.close();
      transcript.dataset.ended = "true";
      refresh();
    });
    // The browser reopens a dropped stream itself, but not a refused one
    // (the console's stream caps answer 503 with Retry-After: 5).
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED && transcript.dataset.ended !== "true") setTimeout(follow, 5000);
    });
  };
  follow();
  // The record has what events do not say (stale, totals after a resume).
  const refresh = async () => {
    try { fromRecord(await getJSON("/api/runs/" + encodeURIComponent(id))); } catch (e) {
      if (!status.state) update({ state: "unknown", reason: e.message });
    }
  };
  refresh();
  const timer = setInterval(() => { if (status.finished) clearInterval(timer); else refresh(); }, 2000);
}

// --------------------------------------------------------------- fleet page

function fleetPage(main) {
  const tiles = el("div", { class: "tiles", id: "rates" });
  const queues = el("tbody", { id: "queues" });
  const workers = el("tbody", { id: "workers" });
  const errors = el("div", { class: "error-text" });
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "Fleet")), tiles, errors,
    el("h2", {}, "Queues"),
    el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["Queue", "Depth (waiting)", "In flight", "Idle pulls", "Redelivered"].map((h) => el("th", {}, h)))), queues),
    el("h2", {}, "Workers"),
    el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["Worker", "Slots", "Busy", "Waiting", "Tools", "Version", "Seen"].map((h) => el("th", {}, h)))), workers));
  const tile = (label, value, cls) => el("div", { class: "tile " + (cls || "") }, el("div", { class: "value" }, String(value)), el("div", { class: "label" }, label));
  const draw = (f) => {
    const r = f.rates;
    tiles.replaceChildren(
      tile("runs per minute (finished, last 60 s)", r.finishedLastMinute),
      tile("started, last 60 s", r.startedLastMinute),
      tile("running", r.states.running || 0),
      tile("queued", r.states.queued || 0),
      tile("stale", r.states.stale || 0, r.states.stale ? "bad" : ""),
      tile("failed since " + fmtTime(r.watchingSince), r.failedSinceStart, r.failedSinceStart ? "bad" : ""),
      tile("aborted since " + fmtTime(r.watchingSince), r.abortedSinceStart));
    queues.replaceChildren(...f.queues.map((q) => el("tr", { "data-queue": q.queue },
      el("td", {}, q.queue), el("td", { class: "num" }, String(q.depth)), el("td", { class: "num" }, String(q.inFlight)),
      el("td", { class: "num" }, String(q.waiting)), el("td", { class: "num" }, String(q.redelivered)))));
    if (f.workers.length === 0) {
      workers.replaceChildren(el("tr", {}, el("td", { colSpan: 7, class: "muted empty" }, "No worker presence: the workers of this fleet do not publish it (bucket agents_workers).")));
    } else {
      workers.replaceChildren(...f.workers.map((w) => el("tr", {},
        el("td", { class: "mono" }, String(w.id || w.worker || w.name || "?")),
        el("td", { class: "num" }, String(w.slots ?? "–")), el("td", { class: "num" }, String(w.busy ?? "–")),
        el("td", { class: "num" }, String(w.waiting ?? "–")),
        el("td", { class: "small" }, Array.isArray(w.tools) ? w.tools.map((t) => typeof t === "string" ? t : t.name).join(", ") : ""),
        el("td", {}, String(w.version ?? "")), el("td", { class: "small" }, fmtTime(w.seenAt || w.updatedAt || w.heartbeatAt)))));
    }
    errors.textContent = (f.errors || []).join("; ");
  };
  const tick = async () => {
    try { draw(await getJSON("/api/fleet")); } catch (e) { errors.textContent = e.message; }
  };
  tick();
  setInterval(tick, 2000);
}

// ------------------------------------------------------------ new-run form

function newRunPage(main) {
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "New run")));
  if (!session.allowControl) {
    main.append(el("p", { class: "muted" }, "This console is read-only: start it with --allow-control to submit runs."));
    return;
  }
  const field = (label, input, hint) => el("label", { class: "field" }, el("span", {}, label), input, hint ? el("small", { class: "muted" }, hint) : null);
  const prompt = el("textarea", { id: "new-prompt", name: "prompt", rows: 5, required: true });
  const model = el("input", { id: "new-model", name: "model", placeholder: "the worker's default (e.g. faux/demo, openai/gpt-4o-mini)" });
  const tools = el("input", { id: "new-tools", name: "tools", placeholder: "calculator, current_time" });
  const queue = el("input", { id: "new-queue", name: "queue", value: "default" });
  const runID = el("input", { id: "new-id", name: "id", placeholder: "a fresh random id" });
  const meta = el("input", { id: "new-meta", name: "metadata", placeholder: "tenant=acme, team=search" });
  const faux = el("textarea", { id: "new-faux", name: "faux", rows: 4, placeholder: '{"responses":[{"content":[{"type":"text","text":"hi"}]}],"tokensPerSecond":20}' });
  const form = el("form", { id: "new-run", class: "newrun" },
    field("Prompt", prompt), field("Model", model, "provider/id"), field("Tools", tools, "comma-separated"), field("Queue", queue),
    el("details", {}, el("summary", {}, "More"), field("Run id", runID), field("Metadata", meta, "key=value, comma-separated"),
      field("Faux script", faux, "JSON script for the faux provider (tests and demos)")),
    el("button", { type: "submit", id: "new-submit" }, "Submit run"));
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { prompt: prompt.value, queue: queue.value.trim() || "default" };
    if (model.value.trim()) body.model = model.value.trim();
    const t = tools.value.split(",").map((s) => s.trim()).filter(Boolean);
    if (t.length) body.tools = t;
    if (runID.value.trim()) body.id = runID.value.trim();
    const m = {};
    for (const kv of meta.value.split(",")) {
      const [k, ...v] = kv.split("=");
      if (k.trim()) m[k.trim()] = v.join("=").trim();
    }
    if (Object.keys(m).length) body.metadata = m;
    try {
      if (faux.value.trim()) body.faux = JSON.parse(faux.value);
      const r = await post("/api/runs", body);
      location.assign(runPath(r.id));
    } catch (err) { toast("submit: " + err.message, true); }
  });
  main.append(form);
}

// ------------------------------------------------------------------- router

async function start() {
  try {
    Object.assign(session, await getJSON("/api/session"));
  } catch (e) { toast("session: " + e.message, true); }
  const who = document.getElementById("session");
  who.textContent = session.user + (session.allowControl ? " · control" : " · read-only");
  document.getElementById("nav-new").hidden = !session.allowControl;
  const main = document.getElementById("main");
  const path = location.pathname;
  let nav = "runs";
  if (path.startsWith("/runs/")) {
    runPage(main, decodeURIComponent(path.slice("/runs/".length)));
  } else if (path === "/fleet") {
    nav = "fleet";
    fleetPage(main);
  } else if (path === "/new") {
    nav = "new";
    newRunPage(main);
  } else {
    runsPage(main);
  }
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === nav);
  document.body.dataset.ready = "true";
}

start();
