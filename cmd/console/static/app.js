// agentfleet console. Hand-written, no build step; its one dependency,
// marked's markdown lexer, is vendored (static/vendor/, see markdown.js).
// Rule: everything that comes from a run (model text, tool arguments and
// results, ids, errors) is put into the page as text (text nodes and
// textContent), never as HTML. Markdown (markdown.js, a module run before
// this script: marked's lexer and a DOM builder) is rendered by building
// elements, never by parsing HTML.
"use strict";

// requestTimeoutMs bounds each read (the server may say otherwise);
// longPollMs is how long a runs page long-poll may wait besides.
const session = { user: "", csrf: "", allowControl: false, requestTimeoutMs: 20000, longPollMs: 25000 };

// el builds an element: attrs are properties or attributes, children are
// nodes or strings (which become text nodes).
function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  setAttrs(e, attrs);
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function setAttrs(e, attrs) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (k.startsWith("data-") || k.startsWith("aria-") || k === "for" || k === "role" || k === "list") e.setAttribute(k, v);
    else e[k] = v;
  }
}

// svg builds an SVG element; attrs are attributes.
function svg(tag, attrs, ...children) {
  const e = document.createElementNS("http://www.w3.org/2000/svg", tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  for (const c of children) if (c) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

function toast(msg, bad) {
  const t = document.getElementById("toast");
  t.textContent = msg;
  t.className = bad ? "show bad" : "show";
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => { t.className = ""; }, 5000);
}

// getJSON reads with a timeout of its own (a stalled request fails
// instead of holding the page forever), extraMs more for a long-poll.
async function getJSON(path, signal, extraMs) {
  const ms = session.requestTimeoutMs + (extraMs || 0);
  const timeout = AbortSignal.timeout(ms);
  const both = signal ? AbortSignal.any([signal, timeout]) : timeout;
  try {
    const r = await fetch(path, { signal: both, headers: { Accept: "application/json" } });
    const body = await r.json().catch((e) => { if (timeout.aborted) throw e; return {}; });
    if (!r.ok) throw new Error(body.error || r.status + " " + r.statusText);
    return body;
  } catch (e) {
    if (timeout.aborted && !(signal && signal.aborted)) throw new Error("no answer in " + fmtDuration(ms));
    throw e;
  }
}

// poll runs step, then again every ms after it ended: never two at once
// under a slow server. now() runs it at once (or right after the one
// under way); stop() ends it.
function poll(step, ms) {
  let timer = null, running = false, again = false, stopped = false;
  const run = async () => {
    clearTimeout(timer);
    if (stopped) return;
    if (running) { again = true; return; }
    running = true;
    try { await step(); } catch { /* the step shows its errors */ }
    running = false;
    if (stopped) return;
    if (again) { again = false; run(); } else timer = setTimeout(run, ms);
  };
  run();
  return { now: run, stop: () => { stopped = true; clearTimeout(timer); } };
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
// An error answer throws an Error with its status and body. Each attempt
// has a timeout: a stalled one counts as unanswered.
async function post(path, body, key) {
  const headers = { "Content-Type": "application/json", "X-CSRF-Token": session.csrf };
  if (key) headers["Idempotency-Key"] = key;
  for (let attempt = 1; ; attempt++) {
    let r, out;
    const timeout = AbortSignal.timeout(session.requestTimeoutMs);
    try {
      r = await fetch(path, { method: "POST", headers, body: JSON.stringify(body || {}), signal: timeout });
      out = await r.json().catch((e) => { if (timeout.aborted) throw e; return {}; });
    } catch (err) {
      const e = timeout.aborted ? new Error("no answer in " + fmtDuration(session.requestTimeoutMs)) : err;
      if (!key || attempt >= 3) throw e;
      await new Promise((done) => setTimeout(done, 250 * attempt));
      continue;
    }
    if (!r.ok) {
      const err = new Error(out.error || r.status + " " + r.statusText);
      err.status = r.status;
      err.body = out;
      throw err;
    }
    return out;
  }
}

// runPath is the page of a run; ids are [A-Za-z0-9_-], encoded anyway.
const runPath = (id) => "/runs/" + encodeURIComponent(id);
const runAPI = (id) => "/api/runs/" + encodeURIComponent(id);

const nf = new Intl.NumberFormat("en-US");
function fmtTokens(u) {
  const n = (u && u.totalTokens) || 0;
  return n >= 100000 ? (n / 1000).toFixed(0) + "k" : nf.format(n);
}
// fmtCost: "–" only when there is no cost (a model without prices).
function fmtCost(c) {
  if (!c) return "–";
  return "$" + (c < 0.01 ? c.toFixed(5) : c < 10 ? c.toFixed(4) : c.toFixed(2));
}
function fmtDuration(ms) {
  if (ms === null || ms === undefined || ms < 0 || Number.isNaN(ms)) return "–";
  if (ms < 1000) return Math.round(ms) + " ms";
  const s = ms / 1000;
  if (s < 60) return s.toFixed(1) + " s";
  const m = Math.floor(s / 60);
  if (m < 60) return m + "m " + Math.round(s % 60) + "s";
  const h = Math.floor(m / 60);
  if (h < 48) return h + "h " + (m % 60) + "m";
  return Math.floor(h / 24) + "d " + (h % 24) + "h";
}
const isZeroTime = (t) => !t || (typeof t === "string" && t.startsWith("0001-"));
const pad = (n, w) => String(n).padStart(w || 2, "0");
// fmtDateTime is a full local date and time: 2026-12-07 14:05:09.
function fmtDateTime(t) {
  if (isZeroTime(t)) return "–";
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return "–";
  return d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + " " +
    pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
}
// fmtClock is a local time of day with milliseconds.
function fmtClock(ms) {
  const d = new Date(ms);
  return pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds()) + "." + pad(d.getMilliseconds(), 3);
}
function fmtAgo(t) {
  if (isZeroTime(t)) return "–";
  const ms = Date.now() - new Date(t).getTime();
  return ms < 0 ? "in " + fmtDuration(-ms) : fmtDuration(ms) + " ago";
}
function runDuration(r) {
  if (isZeroTime(r.startedAt)) return null;
  const end = isZeroTime(r.finishedAt) ? Date.now() : Date.parse(r.finishedAt);
  return end - Date.parse(r.startedAt);
}
function stateBadge(state, stale) {
  return el("span", { class: "badge state-" + (stale ? "stale" : state), "data-state": state },
    stale ? state + " · stale" : state);
}
const json = (v) => JSON.stringify(v === undefined ? {} : v, null, 2);

// fleetInfo is GET /api/fleet, shared by the pages that need the queues
// and the presence (pick-lists).
let fleetCache = null;
async function fleetInfo() {
  if (!fleetCache) fleetCache = getJSON("/api/fleet").catch((e) => { fleetCache = null; throw e; });
  return fleetCache;
}
function presence(f) {
  const models = new Set();
  const defaults = new Set();
  const tools = new Map(); // name -> {name, source, description, available}
  for (const w of f.workers || []) {
    for (const m of w.models || []) models.add(m);
    if (w.defaultModel) defaults.add(w.defaultModel);
    for (const t of w.tools || []) {
      if (!tools.has(t.name) || t.available) tools.set(t.name, t);
    }
  }
  return { models: [...models].sort(), defaults: [...defaults].sort(), tools: [...tools.values()] };
}
function bySource(tools) {
  const groups = new Map();
  for (const t of tools) {
    const s = t.source || "builtin";
    if (!groups.has(s)) groups.set(s, []);
    groups.get(s).push(t);
  }
  return [...groups.entries()].sort(([a], [b]) => (a === "builtin" ? -1 : b === "builtin" ? 1 : a.localeCompare(b)));
}
function datalist(id, values) {
  return el("datalist", { id }, ...values.map((v) => el("option", { value: v })));
}

// ---------------------------------------------------------------- runs page

const STATES = ["", "queued", "running", "waiting", "stale", "succeeded", "failed", "aborted"];
const FILTERS = ["state", "queue", "model", "tenant", "q", "since", "until"];

function runsPage(main) {
  const params = new URLSearchParams(location.search);
  const input = (id, name, placeholder, size, attrs) => el("input", Object.assign({ id, placeholder, size, value: params.get(name) || "", "aria-label": placeholder }, attrs || {}));
  const state = el("select", { id: "f-state", "aria-label": "state" },
    ...STATES.map((s) => el("option", { value: s, text: s || "all states" })));
  state.value = params.get("state") || "";
  const queue = input("f-queue", "queue", "queue", 9, { list: "dl-queues" });
  const model = input("f-model", "model", "model", 14, { list: "dl-models" });
  const tenant = input("f-tenant", "tenant", "tenant", 9);
  const meta = el("input", { id: "f-meta", placeholder: "metadata key=value, …", size: 18, value: params.getAll("meta").join(", "), "aria-label": "metadata" });
  const localValue = (iso) => {
    if (!iso) return "";
    const d = new Date(iso);
    return Number.isNaN(d.getTime()) ? "" : d.getFullYear() + "-" + pad(d.getMonth() + 1) + "-" + pad(d.getDate()) + "T" + pad(d.getHours()) + ":" + pad(d.getMinutes()) + ":" + pad(d.getSeconds());
  };
  // The time range as the URL says it (the inputs show it in local time,
  // to the second); an input the user changes replaces it.
  const times = { since: params.get("since") || "", until: params.get("until") || "" };
  const since = el("input", { id: "f-since", type: "datetime-local", step: 1, value: localValue(times.since), "aria-label": "written since" });
  const until = el("input", { id: "f-until", type: "datetime-local", step: 1, value: localValue(times.until), "aria-label": "written before" });
  for (const [k, i] of [["since", since], ["until", until]]) {
    i.addEventListener("change", () => {
      const d = i.value ? new Date(i.value) : null;
      times[k] = d && !Number.isNaN(d.getTime()) ? d.toISOString() : "";
    });
  }
  const q = input("f-q", "q", "search id or title", 20);
  const size = el("select", { id: "f-limit", "aria-label": "runs per page" }, ...[25, 50, 100, 200, 500].map((n) => el("option", { value: String(n), text: n + " per page" })));
  size.value = params.get("limit") || "50";
  const clear = el("a", { href: "/", class: "small", id: "f-clear" }, "clear filters");
  const count = el("span", { class: "muted", id: "runs-count" });
  const newer = el("button", { id: "page-newer", class: "secondary", type: "button" }, "← Newer");
  const older = el("button", { id: "page-older", class: "secondary", type: "button" }, "Older →");
  const pageNo = el("span", { class: "muted small", id: "page-no" });
  const tbody = el("tbody", { id: "runs-body" });
  const lists = el("div", { hidden: true }, datalist("dl-queues", []), datalist("dl-models", []));
  main.append(
    el("div", { class: "toolbar" }, el("h1", {}, "Runs"), count),
    el("div", { class: "filters" }, state, queue, model, tenant, meta, el("label", { class: "small muted" }, "since ", since),
      el("label", { class: "small muted" }, "before ", until), q, size, clear),
    lists,
    el("table", { class: "runs", id: "runs" },
      el("thead", {}, el("tr", {}, ...["Run", "State", "Queue", "Model", "Tenant", "Metadata",
        "Turns", "Tokens", "Cost", "Duration", "Submitted"].map((h) => el("th", {}, h)))),
      tbody),
    el("div", { class: "pager" }, newer, pageNo, older));
  fleetInfo().then((f) => {
    lists.replaceChildren(datalist("dl-queues", f.queues.map((x) => x.queue)), datalist("dl-models", presence(f).models));
  }).catch(() => {});

  // The cursors of the pages before this one (Newer goes back).
  let stack = (history.state && history.state.stack) || [];
  let before = params.get("before") || "";
  let ctl = null;
  let version = null;
  const query = () => {
    const p = new URLSearchParams();
    if (state.value) p.set("state", state.value);
    for (const [k, i] of [["queue", queue], ["model", model], ["tenant", tenant], ["q", q]]) if (i.value.trim()) p.set(k, i.value.trim());
    for (const kv of meta.value.split(",")) if (kv.trim()) p.append("meta", kv.trim());
    for (const k of ["since", "until"]) if (times[k]) p.set(k, times[k]);
    if (size.value !== "50") p.set("limit", size.value);
    return p;
  };
  const render = (page) => {
    const rows = page.runs.map((r) => {
      const meta = Object.entries(r.metadata || {}).map(([k, v]) => k + "=" + v).join(" ");
      // A wait for a full concurrency key names the key (since 1.10).
      const waiting = r.waiting && r.state === "running" ? (r.waiting.key ? "key " + r.waiting.key : r.waiting.for || "") : "";
      return el("tr", { "data-run": r.id, "data-state": r.stale ? "stale" : r.state },
        el("td", { class: "run" }, el("a", { href: runPath(r.id), class: "title" }, r.title || r.id),
          r.title ? el("div", { class: "mono small muted" }, r.id) : null),
        el("td", {}, stateBadge(r.state, r.stale), r.reason ? el("div", { class: "muted small" }, r.reason) : null,
          waiting ? el("div", { class: "waiting small" }, "waiting for " + waiting) : null),
        el("td", {}, r.queue || "", r.priority ? el("div", { class: "muted small" }, r.priority + " priority") : null),
        el("td", { class: "small" }, r.model || ""),
        el("td", {}, r.tenant || ""),
        el("td", { class: "meta" }, meta),
        el("td", { class: "num" }, String(r.turns || 0)),
        el("td", { class: "num" }, fmtTokens(r.usage)),
        el("td", { class: "num" }, fmtCost(r.cost)),
        el("td", { class: "num" }, fmtDuration(runDuration(r))),
        el("td", { class: "small nowrap" }, fmtDateTime(r.submittedAt || r.startedAt)));
    });
    if (rows.length === 0) {
      rows.push(el("tr", {}, el("td", { colSpan: 11, class: "muted empty" },
        page.truncated ? "No match in the records scanned so far." : "No runs match.")));
    }
    tbody.replaceChildren(...rows);
    count.textContent = page.truncated
      ? page.runs.length + " runs · scanned " + nf.format(page.scanned) + " of " + nf.format(page.stored) + " records"
      : page.runs.length + " shown · " + nf.format(page.stored) + " records in all";
    count.dataset.scanned = String(page.scanned);
    count.dataset.truncated = String(!!page.truncated);
    older.hidden = !page.next;
    older.textContent = page.truncated ? "Scan further →" : "Older →";
    older.dataset.next = String(page.next || "");
    newer.hidden = !before;
    pageNo.textContent = before ? "page " + (stack.length + 1) : "newest";
    tbody.dataset.before = before;
  };
  // load reads the page; the first page long-polls, each answer coming
  // when a record is written, so it follows the fleet.
  const load = async () => {
    if (ctl) ctl.abort();
    ctl = new AbortController();
    const signal = ctl.signal;
    version = null;
    while (!signal.aborted) {
      const p = query();
      if (before) p.set("before", before);
      if (version !== null) p.set("after", version);
      try {
        const page = await getJSON("/api/runs?" + p, signal, version !== null ? session.longPollMs : 0);
        if (signal.aborted) return;
        version = page.version;
        render(page);
        if (before) return; // an older page stays as read
        // A busy fleet writes records all the time: at most two
        // renders a second.
        await new Promise((r) => setTimeout(r, 500));
      } catch (e) {
        if (signal.aborted) return;
        count.textContent = "disconnected: " + e.message;
        await new Promise((r) => setTimeout(r, 2000));
      }
    }
  };
  const url = () => {
    const p = query();
    if (before) p.set("before", before);
    return p.toString() ? "/?" + p : "/";
  };
  const refilter = () => {
    before = "";
    stack = [];
    history.replaceState({ stack }, "", url());
    load();
  };
  for (const s of [state, size, since, until]) s.addEventListener("change", refilter);
  let typing = null;
  for (const i of [queue, model, tenant, meta, q]) {
    i.addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(refilter, 300); });
  }
  older.addEventListener("click", () => {
    if (!older.dataset.next) return;
    stack = stack.concat([before]);
    before = older.dataset.next;
    history.pushState({ stack }, "", url());
    load();
  });
  newer.addEventListener("click", () => {
    before = stack.length ? stack[stack.length - 1] : "";
    stack = stack.slice(0, -1);
    history.pushState({ stack }, "", url());
    load();
  });
  window.addEventListener("popstate", () => {
    const p = new URLSearchParams(location.search);
    before = p.get("before") || "";
    stack = (history.state && history.state.stack) || [];
    load();
  });
  load();
}

// ------------------------------------------------------- approval answers

// approvalWidget answers one waiting call: Approve, Deny with a reason,
// or Edit arguments (the console checks them against the tool's schema
// before the answer is sent; its complaint is shown here). call has run,
// toolCallId, toolName, args, expiresAt (Unix ms or RFC 3339).
function approvalWidget(call, onSent) {
  const expires = typeof call.expiresAt === "number" ? call.expiresAt : Date.parse(call.expiresAt || "");
  const box = el("div", { class: "approval", "data-call": call.toolCallId, role: "group", "aria-label": "approval of " + (call.toolName || "") });
  const head = el("div", { class: "approval-head" },
    el("span", { class: "badge state-waiting" }, "waiting for approval"), " ",
    el("span", { class: "mono" }, call.toolName || ""),
    expires ? el("span", { class: "muted small" }, " · expires " + fmtDateTime(expires) + " (" + fmtAgo(expires) + ")") : null);
  box.append(head);
  const problem = el("div", { class: "error-text approval-error", role: "alert" });
  const rejected = el("div", { class: "error-text approval-rejected", role: "alert" });
  box.rejected = (reason) => { rejected.textContent = "The run refused the answer: " + reason; };
  if (!session.allowControl) {
    box.append(el("div", { class: "muted small" }, "Read-only console: answer with `submit approve` or from a console started with --allow-control."));
    return box;
  }
  let key = null; // one answer, retried with its key
  const send = async (answer, errorAt) => {
    problem.textContent = "";
    errorAt.textContent = "";
    const body = Object.assign({ toolCallId: call.toolCallId }, answer);
    const k = key && key.body === JSON.stringify(body) ? key.k : newKey();
    key = { body: JSON.stringify(body), k };
    box.classList.add("sending");
    try {
      await post(runAPI(call.run) + "/approve", body, k);
      box.classList.add("sent");
      box.dataset.sent = answer.decision;
      status.textContent = (answer.decision === "approve" ? "Approved" : "Denied") + (answer.arguments ? " with edited arguments" : "") + ": waiting for the run…";
      if (onSent) onSent(answer);
    } catch (err) {
      (err.body && err.body.field === "arguments" ? errorAt : problem).textContent = err.message;
    } finally {
      box.classList.remove("sending");
    }
  };
  const status = el("div", { class: "approval-status small" });
  const approve = el("button", { type: "button", class: "approve" }, "Approve");
  const denyBtn = el("button", { type: "button", class: "deny danger" }, "Deny…");
  const editBtn = el("button", { type: "button", class: "edit secondary" }, "Edit arguments…");
  const reason = el("input", { class: "deny-reason", placeholder: "reason (the model sees it)", size: 40, "aria-label": "reason" });
  const denyGo = el("button", { type: "button", class: "deny-send danger" }, "Deny");
  const denyForm = el("div", { class: "deny-form", hidden: true }, reason, denyGo);
  const args = el("textarea", { class: "edit-args mono", rows: 6, spellcheck: false, "aria-label": "arguments (JSON)" });
  args.value = json(call.args);
  const schemaError = el("div", { class: "error-text schema-error", role: "alert" });
  const editGo = el("button", { type: "button", class: "edit-send" }, "Approve with these arguments");
  const editForm = el("div", { class: "edit-form", hidden: true }, args, editGo, schemaError);
  approve.addEventListener("click", () => send({ decision: "approve" }, problem));
  denyBtn.addEventListener("click", () => { denyForm.hidden = !denyForm.hidden; editForm.hidden = true; if (!denyForm.hidden) reason.focus(); });
  editBtn.addEventListener("click", () => { editForm.hidden = !editForm.hidden; denyForm.hidden = true; });
  denyGo.addEventListener("click", () => send({ decision: "deny", reason: reason.value.trim() || undefined }, problem));
  editGo.addEventListener("click", () => {
    let v;
    try { v = JSON.parse(args.value); } catch (e) { schemaError.textContent = "Not JSON: " + e.message; return; }
    if (!v || typeof v !== "object" || Array.isArray(v)) { schemaError.textContent = "The arguments must be a JSON object."; return; }
    send({ decision: "approve", arguments: v }, schemaError);
  });
  box.append(el("div", { class: "approval-actions" }, approve, denyBtn, editBtn), denyForm, editForm, problem, rejected, status);
  return box;
}

// ----------------------------------------------------------------- run page

// Transcript replays a run's envelopes into the page, under the readers'
// rules: events of an older attempt that come after a newer attempt's
// run_started are ignored; of an attempt's seq only the first counts (a
// re-sent event may be stored twice); run_resumed keeps only the first
// messagesRestored messages of the earlier attempts. It shows the run as a
// timeline: a separator before each turn with its time, duration, tokens,
// cost and a compact waterfall of its model call and tool calls.
class Transcript {
  constructor(root, runID, onStatus, onChange) {
    this.root = root;
    this.runID = runID;
    this.onStatus = onStatus;
    this.onChange = onChange || (() => {});
    this.attempt = 0;
    this.lastSeq = 0; // of this.attempt
    this.messages = []; // finished message elements, in transcript order
    this.current = null; // the message being streamed
    this.blocks = [];
    this.calls = new Map(); // toolCallId -> tool call element
    this.approvals = new Map(); // toolCallId -> waiting banner
    this.turn = 0;
    this.turnInfo = null;
    this.lastTS = 0;
    this.finished = null;
    this.usage = { totalTokens: 0, cost: 0 }; // of the messages so far
  }

  apply(env) {
    if (env.attempt < this.attempt) return; // a stale attempt's late event
    if (env.attempt === this.attempt && env.seq && env.seq <= this.lastSeq) return; // a stored copy
    const ev = env.event || {};
    if (env.attempt > this.attempt) {
      if (this.attempt > 0 && this.current) {
        this.current.classList.add("interrupted");
        this.endStreaming(this.current);
        this.current.append(el("div", { class: "note" }, "interrupted: attempt " + this.attempt + " stopped here"));
        this.current = null;
      }
      this.attempt = env.attempt;
    }
    if (env.seq) this.lastSeq = env.seq;
    const ts = env.ts || this.lastTS;
    try {
      this.dispatch(env, ev, ts);
    } finally {
      this.lastTS = ts;
      this.onChange();
    }
  }

  dispatch(env, ev, ts) {
    switch (ev.type) {
      case "run_started": return this.runStarted(env, ev);
      case "run_resumed": return this.runResumed(ev);
      case "run_finished": return this.runFinished(ev);
      case "turn_start": return this.turnStart(ts);
      case "turn_end": return this.turnEnd(ts);
      case "message_start": return this.messageStart(env, ev.message || {}, ts);
      case "message_update": return this.messageUpdate(ev.assistantMessageEvent || {});
      case "message_end": return this.messageEnd(env, ev.message || {}, ts);
      case "tool_execution_start": return this.toolStart(ev, ts);
      case "tool_execution_end": return this.toolEnd(ev, ts);
      case "tool_approval_requested": return this.approvalRequested(ev, ts);
      case "tool_approval_resolved": return this.approvalResolved(ev, ts);
      case "tool_approval_rejected": return this.approvalRejected(ev);
      case "model_wait": return this.fleetEvent("notice", "the model call waited " + fmtDuration(ev.waitedMs) + (ev.reason ? " (" + ev.reason + ")" : ""));
      case "compaction_end": return this.compactionEnd(ev);
    }
  }

  // compactionEnd (since 1.10): where the context was cut, with the
  // summary the model was sent instead, folded; the messages above stay.
  compactionEnd(ev) {
    if (ev.cancelled) return this.fleetEvent("notice compaction", "compaction cancelled (the run stopped or moved; the next attempt compacts again)");
    if (ev.error) return this.fleetEvent("notice compaction", "compaction failed: " + ev.error);
    this.fleetEvent("compaction", "context compacted (" + ev.reason + "): " + nf.format(ev.tokensBefore || 0) + " → " +
      nf.format(ev.tokensAfter || 0) + " tokens, " + (ev.messagesSummarized || 0) + " messages summarised; from its next call the model is sent the summary and the transcript from message " + (ev.firstKeptIndex || 0) + " on (the kept messages are above this line)",
      el("details", { class: "block compaction-summary" }, el("summary", {}, "summary"), el("pre", { class: "mono" }, ev.summary || "")));
  }

  fleetEvent(cls, ...parts) {
    this.root.append(el("div", { class: "fleet-event " + cls }, ...parts));
  }

  runStarted(env, ev) {
    const model = ev.model ? ev.model.provider + "/" + ev.model.id : "";
    this.fleetEvent("started", "attempt " + ev.attempt + " started on ", el("span", { class: "mono" }, ev.worker || env.worker),
      " · queue " + ev.queue + (model ? " · " + model : "") +
      (ev.tools && ev.tools.length ? " · tools: " + ev.tools.join(", ") : "") +
      (ev.continueFrom ? " · continues " + ev.continueFrom : "") +
      (env.ts ? " · " + fmtDateTime(env.ts) : ""));
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
    if (this.current) this.endStreaming(this.current);
    this.closeTurn(this.lastTS);
    for (const b of this.approvals.values()) b.remove();
    this.approvals.clear();
    const u = ev.usage || {};
    this.fleetEvent("finished state-" + ev.status,
      "finished: " + ev.status + (ev.reason ? " (" + ev.reason + ")" : "") +
      " · " + ev.turns + " turns · " + nf.format(u.totalTokens || 0) + " tokens · " + fmtCost(ev.cost) +
      " · " + fmtDuration(ev.durationMs),
      ev.error ? el("div", { class: "error-text" }, ev.error) : null);
    this.onStatus({ state: ev.status, reason: ev.reason, turns: ev.turns, usage: ev.usage, cost: ev.cost, durationMs: ev.durationMs, finished: true });
  }

  // A turn: a separator before it, filled in as it goes.
  turnStart(ts) {
    this.closeTurn(ts);
    this.turn++;
    const label = el("span", { class: "turn-label" }, "turn " + this.turn);
    const when = el("span", { class: "turn-when" }, ts ? fmtClock(ts) : "");
    const stats = el("span", { class: "turn-stats" });
    const fall = el("div", { class: "waterfall" });
    const sep = el("div", { class: "turn-sep", "data-turn": String(this.turn) }, el("div", { class: "turn-line" }, label, when, stats), fall);
    this.root.append(sep);
    this.turnInfo = { sep, stats, fall, start: ts, end: 0, rows: [], tokens: 0, cost: 0, hasCost: false };
  }

  turnEnd(ts) {
    if (this.turnInfo) this.turnInfo.end = ts;
    this.drawTurn();
  }

  closeTurn(ts) {
    const t = this.turnInfo;
    if (t && !t.end) t.end = ts || this.lastTS;
    this.drawTurn();
  }

  // row adds a bar to the turn's waterfall.
  row(kind, label, start) {
    const t = this.turnInfo;
    if (!t) return null;
    const r = { kind, label, start, end: 0 };
    t.rows.push(r);
    this.drawTurn();
    return r;
  }

  drawTurn() {
    const t = this.turnInfo;
    if (!t) return;
    const end = t.end || Math.max(this.lastTS, ...t.rows.map((r) => r.end || r.start));
    const span = Math.max(end - t.start, 1);
    t.stats.textContent = [
      t.end ? fmtDuration(t.end - t.start) : "running",
      t.tokens ? nf.format(t.tokens) + " tokens" : "",
      t.hasCost ? fmtCost(t.cost) : "",
    ].filter(Boolean).join(" · ");
    t.fall.replaceChildren(...t.rows.map((r) => {
      const bar = el("span", { class: "bar bar-" + r.kind });
      const rEnd = r.end || end;
      bar.style.left = (100 * (r.start - t.start) / span).toFixed(2) + "%";
      bar.style.width = Math.max(0.5, 100 * (rEnd - r.start) / span).toFixed(2) + "%";
      return el("div", { class: "wf-row", "data-kind": r.kind },
        el("span", { class: "wf-label" }, r.label),
        el("span", { class: "wf-when mono" }, fmtClock(r.start)),
        el("span", { class: "wf-dur mono" }, r.end ? fmtDuration(r.end - r.start) : "…"),
        el("span", { class: "wf-track" }, bar));
    }));
  }

  messageStart(env, m, ts) {
    const role = m.role || "message";
    const body = el("div", { class: "body" });
    const meta = el("span", { class: "msg-meta" });
    const box = el("div", { class: "msg msg-" + role, "data-role": role },
      el("div", { class: "role" }, el("span", {}, roleLabel(m)), meta), body);
    box.body = body;
    box.meta = meta;
    if (role === "assistant") {
      // The model call: from the event before (the request went out).
      box.call = this.row("model", "model" + (m.model ? " " + m.model : ""), this.lastTS || ts);
      meta.append(el("span", { class: "streaming" }, "streaming"));
    }
    this.root.append(box);
    this.current = box;
    this.blocks = [];
    if (role !== "assistant") this.fill(box, m);
  }

  endStreaming(box) {
    for (const s of box.querySelectorAll(".streaming")) s.remove();
    for (const t of box.querySelectorAll(".text.md-live")) renderLive(t, true);
  }

  messageUpdate(se) {
    const box = this.current;
    if (!box) return;
    const i = se.contentIndex || 0;
    const block = (kind) => {
      if (!this.blocks[i]) {
        this.blocks[i] = renderBlock({ type: kind, name: se.name, id: se.id, text: "", thinking: "" }, this, true);
        box.body.append(this.blocks[i]);
      }
      return this.blocks[i];
    };
    switch (se.type) {
      case "text_start": block("text"); break;
      case "text_delta": appendLive(block("text").querySelector(".text"), se.delta || ""); break;
      case "thinking_start": block("thinking"); break;
      case "thinking_delta": block("thinking").querySelector(".text").append(se.delta || ""); break;
      case "toolcall_start": block("toolCall"); break;
      case "toolcall_delta": block("toolCall").querySelector(".args").append(se.delta || ""); break;
      case "toolcall_end":
        if (se.toolCall) block("toolCall").querySelector(".args").textContent = json(se.toolCall.arguments);
        break;
    }
  }

  messageEnd(env, m, ts) {
    let box = this.current;
    if (!box || box.dataset.role !== m.role) {
      this.messageStart(env, m, ts);
      box = this.current;
    }
    if (m.role === "assistant") {
      box.body.replaceChildren();
      this.fill(box, m);
      this.endStreaming(box);
      if (box.call) box.call.end = ts;
      const u = m.usage || {};
      const cost = u.cost && typeof u.cost.total === "number" ? u.cost.total : null;
      box.meta.replaceChildren(...[
        el("span", {}, fmtClock(box.call ? box.call.start : ts)),
        box.call ? el("span", {}, fmtDuration(ts - box.call.start)) : null,
        u.totalTokens ? el("span", { class: "tokens" }, nf.format(u.totalTokens) + " tokens") : null,
        cost ? el("span", { class: "cost" }, fmtCost(cost)) : null,
      ].filter(Boolean));
      if (this.turnInfo) {
        this.turnInfo.tokens += u.totalTokens || 0;
        if (cost) { this.turnInfo.cost += cost; this.turnInfo.hasCost = true; }
      }
      this.usage.totalTokens += u.totalTokens || 0;
      this.usage.cost += cost || 0;
      this.onStatus({ live: this.usage });
      this.drawTurn();
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
    for (const c of contentOf(m)) box.body.append(renderBlock(c, this, m.role === "assistant"));
  }

  toolStart(ev, ts) {
    const call = this.calls.get(ev.toolCallId);
    if (call) {
      call.dataset.exec = "running";
      call.timing = this.row("tool", ev.toolName || "tool", ts);
      call.querySelector(".timing").textContent = "started " + fmtClock(ts);
    }
  }

  toolEnd(ev, ts) {
    const call = this.calls.get(ev.toolCallId);
    if (!call) return;
    call.dataset.exec = ev.isError ? "error" : "done";
    if (call.timing) {
      call.timing.end = ts;
      call.querySelector(".timing").textContent = "started " + fmtClock(call.timing.start) + " · " + fmtDuration(ts - call.timing.start);
      this.drawTurn();
    }
  }

  approvalRequested(ev, ts) {
    const call = this.calls.get(ev.toolCallId);
    const banner = approvalWidget({ run: this.runID, toolCallId: ev.toolCallId, toolName: ev.toolName, args: ev.args, expiresAt: ev.expiresAt });
    const old = this.approvals.get(ev.toolCallId);
    if (old) old.remove();
    this.approvals.set(ev.toolCallId, banner);
    if (call) {
      call.dataset.exec = "waiting";
      call.querySelector(".results").before(banner);
      call.wait = this.row("wait", "approval " + (ev.toolName || ""), ts);
    } else {
      this.root.append(banner);
    }
    this.onStatus({ waiting: this.approvals.size });
  }

  approvalResolved(ev, ts) {
    const banner = this.approvals.get(ev.toolCallId);
    if (banner) banner.remove();
    this.approvals.delete(ev.toolCallId);
    const call = this.calls.get(ev.toolCallId);
    if (call && call.wait) { call.wait.end = ts; this.drawTurn(); }
    const outcome = el("div", { class: "approval-outcome decision-" + ev.decision, "data-decision": ev.decision },
      ev.decision === "timeout" ? "not answered in time" :
        (ev.decision === "approve" ? "approved" : "denied") + (ev.by ? " by " + ev.by : "") + (ev.reason ? ": " + ev.reason : ""),
      ts ? el("span", { class: "muted small" }, " · " + fmtClock(ts)) : null);
    if (call) {
      if (call.dataset.exec === "waiting") call.dataset.exec = ev.decision === "approve" ? "running" : "called";
      call.querySelector(".results").before(outcome);
    } else {
      this.root.append(outcome);
    }
    if (ev.decision === "approve") {
      // The event's arguments (1.8) are what the call ran with, as the
      // worker validated them; {} is an edit too. Before 1.8, the answer.
      if (ev.arguments !== undefined && ev.arguments !== null) this.showEdit(call, outcome, ev.arguments, ev.by);
      else if (ev.controlSeq) this.readEdit(call, outcome, ev);
    }
    this.onStatus({ waiting: this.approvals.size });
  }

  // showEdit shows an approver's edited arguments as what ran.
  showEdit(call, outcome, args, by) {
    const label = el("div", { class: "label edited-label" }, "ran with the arguments " + (by || "the approver") + " edited:");
    const edited = el("pre", { class: "args edited-args" }, json(args));
    const model = call && call.querySelector(".args");
    if (!model) {
      outcome.append(label, edited);
      return;
    }
    model.classList.add("superseded");
    model.before(el("div", { class: "label superseded-label" }, "the model's arguments (not run):"));
    model.after(label, edited);
  }

  // readEdit reads the answer of a worker before 1.8, whose event does
  // not carry the edit.
  async readEdit(call, outcome, ev) {
    let a;
    try { a = await getJSON(runAPI(this.runID) + "/answers/" + encodeURIComponent(ev.controlSeq)); } catch { return; }
    if (a.arguments !== undefined && a.arguments !== null) this.showEdit(call, outcome, a.arguments, a.by || ev.by);
  }

  approvalRejected(ev) {
    const banner = this.approvals.get(ev.toolCallId);
    if (banner) banner.rejected(ev.reason || "");
    else this.fleetEvent("notice", "approval answer refused: " + (ev.reason || ""));
  }
}

// Live markdown: deltas are kept as the text's source and rendered at
// most ten times a second (and once more at the end).
function appendLive(node, delta) {
  node.raw = (node.raw || "") + delta;
  if (!node.timer) node.timer = setTimeout(() => renderLive(node, false), 100);
}
function renderLive(node, final) {
  clearTimeout(node.timer);
  node.timer = null;
  // Without markdown.js (it failed to load), the text as it is.
  node.replaceChildren(typeof renderMarkdown === "function" ? renderMarkdown(node.raw || "", document) :
    el("div", { class: "md plain" }, node.raw || ""));
  if (final) node.classList.remove("md-live");
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

// renderBlock shows a content block; markdown is for assistant text.
function renderBlock(c, tr, markdown) {
  switch (c.type) {
    case "text": {
      if (!markdown) return el("div", { class: "block" }, el("div", { class: "text plain" }, c.text || ""));
      const t = el("div", { class: "text md-live" });
      t.raw = c.text || "";
      renderLive(t, false);
      return el("div", { class: "block" }, t);
    }
    case "thinking":
      return el("details", { class: "block thinking" }, el("summary", {}, c.redacted ? "thinking (redacted)" : "thinking"),
        el("div", { class: "text plain" }, c.thinking || ""));
    case "image":
      if (SAFE_MIME.test(c.mimeType || "") && BASE64.test(c.data || "")) {
        return el("div", { class: "block" }, el("img", { class: "image", alt: "image (" + c.mimeType + ")", src: "data:" + c.mimeType + ";base64," + c.data }));
      }
      return el("div", { class: "block note" }, "image of type " + (c.mimeType || "?") + " not shown");
    case "toolCall": {
      const call = el("div", { class: "block toolcall", "data-exec": "called", "data-call": c.id || "" },
        el("div", { class: "label" }, "tool call · ", el("span", { class: "mono" }, c.name || ""), el("span", { class: "exec" })),
        el("div", { class: "timing small muted" }),
        el("pre", { class: "args" }, c.arguments ? json(c.arguments) : ""),
        el("div", { class: "results" }));
      if (c.id && tr) {
        const old = tr.calls.get(c.id);
        if (old && old.isConnected && !old.closest(".dropped")) {
          // The final message replaces the streamed block: keep what the
          // block gathered since.
          call.querySelector(".results").replaceWith(old.querySelector(".results"));
          call.querySelector(".timing").replaceWith(old.querySelector(".timing"));
          call.dataset.exec = old.dataset.exec;
          call.timing = old.timing;
          call.wait = old.wait;
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
  const title = el("div", { class: "run-title", id: "run-title" });
  const transcript = el("div", { class: "transcript", id: "transcript" });
  // The child runs its run_agent calls started (GET .../children), each
  // linked; shown once the run made such a call.
  const kids = el("div", { class: "children", id: "children", hidden: true });
  const controls = el("div", { class: "controls", id: "controls" });
  const follow = el("button", { id: "follow", class: "follow", type: "button", hidden: true }, "↓ follow the run");
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "Run ", el("span", { class: "mono", id: "run-id" }, id))), title, line, kids, controls, transcript, follow);

  const drawStatus = () => {
    const u = status.usage || {};
    const live = status.live || {};
    // The record is written with the heartbeat: the live sum of the
    // messages is newer while the run goes on.
    const tokens = Math.max(u.totalTokens || 0, live.totalTokens || 0);
    const cost = Math.max(status.cost || 0, live.cost || 0);
    line.replaceChildren(...[
      stateBadge(status.state || "unknown", status.stale),
      status.reason ? el("span", { class: "muted" }, status.reason) : null,
      status.waiting ? el("span", { class: "waiting", id: "waiting-count" }, status.waiting + (status.waiting === 1 ? " call waits" : " calls wait") + " for approval") : null,
      el("span", {}, "queue " + (status.queue || "–")),
      el("span", {}, "model " + (status.model || "–")),
      el("span", {}, "attempt " + (status.attempt || "–")),
      el("span", { class: "mono" }, "worker " + (status.worker || "–")),
      el("span", {}, (status.turns || 0) + " turns"),
      el("span", { id: "total-tokens" }, nf.format(tokens) + " tokens"),
      el("span", { id: "total-cost" }, "cost " + fmtCost(cost)),
      el("span", {}, "duration " + fmtDuration(status.durationMs)),
      status.submittedAt ? el("span", { class: "muted small" }, "submitted " + fmtDateTime(status.submittedAt)) : null,
    ].filter(Boolean));
    line.dataset.state = status.state || "";
    controls.hidden = !!status.finished;
  };
  const update = (s) => {
    Object.assign(status, s);
    drawStatus();
  };
  const fromRecord = (r) => {
    update({ state: r.state, stale: r.stale, reason: r.reason, queue: r.queue, model: r.model, attempt: r.attempt,
      worker: r.worker, turns: r.turns, usage: r.usage, cost: r.cost, durationMs: runDuration(r), submittedAt: r.submittedAt,
      finished: ["succeeded", "failed", "aborted"].includes(r.state) });
    title.textContent = r.title || "";
    if (r.tenant) title.append(el("span", { class: "muted small" }, " · tenant " + r.tenant));
    if (r.priority) title.append(el("span", { class: "muted small" }, " · " + r.priority + " priority"));
    if (r.state === "running" && r.waiting && r.waiting.key) title.append(el("span", { class: "waiting small" }, " · waiting for its concurrency key " + r.waiting.key));
    if (r.child && r.child.parentRunId) {
      title.append(el("span", { class: "muted small", id: "parent-link" }, " · child of ",
        el("a", { href: "/runs/" + encodeURIComponent(r.child.parentRunId), class: "mono" }, r.child.parentRunId),
        " (depth " + (r.child.depth || 1) + ")"));
    }
    if (r.treeCost) title.append(el("span", { class: "muted small", id: "tree-cost" }, " · tree cost " + fmtCost(r.treeCost)));
    if (!following.decided) {
      // A live run is followed from the start; a finished one is read
      // from the top.
      following.decided = true;
      following.on = !status.finished;
    }
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
        if (!text.trim() && action !== "compact") return; // compact's instructions are optional
        try {
          if (unsent.text !== text) unsent = { text, key: newKey() };
          const key = unsent.key;
          await post(runAPI(id) + "/" + action, { text }, key);
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
        await post(runAPI(id) + "/abort", { reason: "aborted from the console by " + session.user }, newKey());
        toast("abort: sent");
      } catch (err) { toast("abort: " + err.message, true); }
    });
    controls.append(form("steer", "steer: taken after the current turn", "Steer"),
      form("followup", "follow-up: taken when the run would stop", "Follow up"),
      form("compact", "compact: summarise the context at the next model call (optional focus)", "Compact"), abort);
  } else {
    controls.append(el("div", { class: "muted small" }, "Read-only console: start it with --allow-control to steer, follow up, abort and answer approvals."));
  }

  // Following: while the run is live and the reader is at the bottom, new
  // text scrolls into view; scrolling up stops it, the button resumes.
  const following = { on: false, decided: false, lastY: 0 };
  const gap = () => document.documentElement.scrollHeight - (window.scrollY + window.innerHeight);
  // The reader moved up since the page last scrolled: stop following.
  const movedUp = () => window.scrollY < following.lastY - 5;
  let pending = false;
  const stick = () => {
    if (pending) return;
    pending = true;
    setTimeout(() => {
      pending = false;
      if (following.on && movedUp()) following.on = false;
      if (following.on && gap() > 2) window.scrollTo(0, document.documentElement.scrollHeight);
      following.lastY = window.scrollY;
      follow.hidden = following.on || !!status.finished || gap() <= 40;
    }, 30);
  };
  window.addEventListener("scroll", () => {
    // Up stops following; back at the end resumes it.
    if (movedUp()) following.on = false;
    else if (gap() <= 40 && !status.finished && following.decided) following.on = true;
    following.lastY = window.scrollY;
    follow.hidden = following.on || !!status.finished || gap() <= 40;
  });
  follow.addEventListener("click", () => { following.on = true; following.decided = true; following.lastY = window.scrollY; stick(); });

  let hasChildren = false;
  const loadChildren = async () => {
    let list;
    try { list = await getJSON(runAPI(id) + "/children"); } catch { return; } // the next poll tries again
    kids.hidden = list.length === 0;
    kids.replaceChildren(el("div", { class: "muted small" }, "Child runs (" + list.length + ")"),
      el("table", { class: "runs children-table" }, el("tbody", { id: "children-body" }, ...list.map((c) =>
        el("tr", { "data-child": c.id },
          el("td", {}, el("a", { href: "/runs/" + encodeURIComponent(c.id), class: "mono" }, c.id)),
          el("td", {}, stateBadge(c.state || "unknown")),
          el("td", {}, fmtCost(c.treeCost || c.cost || 0)),
          el("td", { class: "muted" }, c.title || ""))))));
  };
  const tr = new Transcript(transcript, id, update, stick);
  let lastId = 0;
  const listen = () => {
    const es = new EventSource(runAPI(id) + "/events" + (lastId ? "?after=" + lastId : ""));
    es.addEventListener("envelope", (e) => {
      const seq = Number(e.lastEventId);
      if (seq && seq <= lastId) return; // never twice
      if (seq) lastId = seq;
      let env;
      try { env = JSON.parse(e.data); } catch { return; }
      tr.apply(env);
      transcript.dataset.lastEventId = String(lastId);
      if (!hasChildren && env.event && env.event.type === "tool_execution_start" && env.event.toolName === "run_agent") {
        hasChildren = true;
        loadChildren();
      }
    });
    es.addEventListener("end", () => {
      es.close();
      transcript.dataset.ended = "true";
      follow.hidden = true;
      records.now();
    });
    // The browser reopens a dropped stream itself, but not a refused one
    // (the console's stream caps answer 503 with Retry-After: 5).
    es.addEventListener("error", () => {
      if (es.readyState === EventSource.CLOSED && transcript.dataset.ended !== "true") setTimeout(listen, 5000);
    });
  };
  listen();
  // The record has what events do not say (stale, totals after a resume).
  const refresh = async () => {
    try { fromRecord(await getJSON(runAPI(id))); } catch (e) {
      if (!status.state) update({ state: "unknown", reason: e.message });
    }
    if (hasChildren) await loadChildren();
  };
  const records = poll(async () => {
    await refresh();
    if (status.finished) records.stop();
  }, 2000);
}

// ------------------------------------------------------------ approvals page

function approvalsPage(main) {
  const count = el("span", { class: "muted", id: "approvals-count" });
  const tbody = el("tbody", { id: "approvals-body" });
  // Pages of 100 runs (GET /api/approvals?before=): the first page is
  // polled; an older one is polled where it starts.
  const first = el("button", { type: "button", class: "secondary", id: "approvals-first", hidden: true }, "← First page");
  const older = el("button", { type: "button", class: "secondary", id: "approvals-older", hidden: true }, "Older →");
  let before = "";
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "Approvals"), count),
    el("p", { class: "muted small" }, "Tool calls waiting for a person's answer across the fleet, the most recently waiting runs first; on a page, the oldest request first."),
    el("table", { class: "runs approvals", id: "approvals" },
      el("thead", {}, el("tr", {}, ...["Run", "Tool", "Arguments", "Requested", "Expires", "Answer"].map((h) => el("th", {}, h)))),
      tbody),
    el("div", { class: "toolbar" }, first, older));
  const rows = new Map(); // run/toolCallId -> row: kept while it waits
  const draw = (page) => {
    const keys = new Set();
    const ordered = [];
    for (const c of page.calls) {
      const k = c.run + "/" + c.toolCallId;
      keys.add(k);
      let row = rows.get(k);
      if (!row) {
        row = el("tr", { "data-run": c.run, "data-call": c.toolCallId },
          el("td", {}, el("a", { href: runPath(c.run), class: "title" }, c.title || c.run), c.title ? el("div", { class: "mono small muted" }, c.run) : null,
            c.queue ? el("div", { class: "small muted" }, "queue " + c.queue) : null),
          el("td", { class: "mono" }, c.toolName || ""),
          el("td", {}, el("pre", { class: "args" }, json(c.args))),
          el("td", { class: "small nowrap" }, fmtDateTime(c.requestedAt), el("div", { class: "muted" }, fmtAgo(c.requestedAt))),
          el("td", { class: "small nowrap" }, isZeroTime(c.expiresAt) ? "–" : fmtDateTime(c.expiresAt), el("div", { class: "muted" }, isZeroTime(c.expiresAt) ? "" : fmtAgo(c.expiresAt))),
          el("td", { class: "answer" }, approvalWidget(c, () => setTimeout(() => ticks.now(), 500))));
        rows.set(k, row);
      }
      ordered.push(row);
    }
    for (const k of [...rows.keys()]) if (!keys.has(k)) rows.delete(k);
    if (ordered.length === 0) ordered.push(el("tr", {}, el("td", { colSpan: 6, class: "muted empty" }, page.truncated ? "Nothing waits for approval in the records scanned." : "Nothing waits for approval.")));
    tbody.replaceChildren(...ordered);
    count.textContent = page.calls.length + (page.calls.length === 1 ? " call waits" : " calls wait") +
      (page.truncated ? " · scanned " + nf.format(page.scanned) + " of " + nf.format(page.stored) + " records: runs waiting longer may be missing" : "");
    count.dataset.truncated = String(!!page.truncated);
    older.hidden = !page.next;
    older.dataset.next = page.next || "";
    first.hidden = !before;
    tbody.dataset.before = before;
    tbody.dataset.loaded = "true";
  };
  const tick = async () => {
    const at = before;
    try {
      const page = await getJSON("/api/approvals" + (at ? "?before=" + encodeURIComponent(at) : ""));
      if (at === before) draw(page); // not a page left meanwhile
    } catch (e) { count.textContent = "error: " + e.message; }
  };
  const ticks = poll(tick, 5000);
  older.addEventListener("click", () => {
    if (!older.dataset.next) return;
    before = older.dataset.next;
    ticks.now();
  });
  first.addEventListener("click", () => {
    before = "";
    ticks.now();
  });
}

// ------------------------------------------------------------ schedules page

// The schedules (protocol 1.10): spec, next fire, last run and its state,
// paused or not; with control, pause / resume and trigger.
function schedulesPage(main) {
  const tbody = el("tbody", { id: "schedules-body" });
  const count = el("span", { class: "muted", id: "schedules-count" });
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "Schedules"), count),
    el("p", { class: "muted small" }, "Runs on a clock, kept by NATS. Create one with submit schedule create; each fire is one run."),
    el("table", { class: "runs", id: "schedules" },
      el("thead", {}, el("tr", {}, ...["Name", "Queue", "Spec", "Next fire", "Last run", "Overlap", ""].map((h) => el("th", {}, h)))),
      tbody));
  const act = async (name, action) => {
    try {
      const r = await post("/api/schedules/" + encodeURIComponent(name) + "/" + action, {});
      toast(action === "trigger" ? "triggered " + name + ": run " + r.run : name + ": " + action + "d");
      ticks.now();
    } catch (err) { toast(action + ": " + err.message, true); }
  };
  const draw = (list) => {
    const rows = list.map((s) => {
      const buttons = session.allowControl ? [
        el("button", { type: "button", class: "secondary", "data-act": s.paused ? "resume" : "pause", onclick: () => act(s.name, s.paused ? "resume" : "pause") }, s.paused ? "Resume" : "Pause"),
        el("button", { type: "button", class: "secondary", "data-act": "trigger", onclick: () => act(s.name, "trigger") }, "Trigger"),
      ] : [];
      return el("tr", { "data-schedule": s.name, "data-paused": String(!!s.paused) },
        el("td", { class: "mono" }, s.name),
        el("td", {}, s.queue),
        el("td", { class: "mono small" }, s.spec),
        el("td", { class: "small nowrap" }, s.paused ? "paused" : (s.next ? fmtDateTime(s.next) : "–")),
        el("td", { class: "small" }, s.last ? el("a", { href: runPath(s.last.run), class: "mono" }, s.last.run) : "–",
          s.last ? el("div", { class: "muted", "data-last-state": s.lastState || "" }, (s.lastState || "") + " · " + fmtAgo(s.last.plannedAt)) : null),
        el("td", { class: "small" }, s.overlap || "skip"),
        el("td", { class: "nowrap" }, ...buttons));
    });
    if (rows.length === 0) rows.push(el("tr", {}, el("td", { colSpan: 7, class: "muted empty" }, "No schedules.")));
    tbody.replaceChildren(...rows);
    count.textContent = list.length + (list.length === 1 ? " schedule" : " schedules");
    tbody.dataset.loaded = "true";
  };
  const tick = async () => {
    try { draw((await getJSON("/api/schedules")).schedules); } catch (e) { count.textContent = "error: " + e.message; }
  };
  const ticks = poll(tick, 5000);
}

// --------------------------------------------------------------- fleet page

// sparkline draws values (oldest first) as a small SVG line over an hour.
function sparkline(values, cls, label) {
  const w = 240, h = 36;
  const peak = Math.max(1, ...values.map((v) => v.y));
  const pts = values.map((v) => (w * v.x).toFixed(1) + "," + (h - 2 - (h - 4) * v.y / peak).toFixed(1)).join(" ");
  return svg("svg", { class: "spark " + cls, width: w, height: h, viewBox: "0 0 " + w + " " + h, role: "img", "aria-label": label },
    svg("title", {}, label),
    svg("line", { x1: 0, x2: w, y1: h - 2, y2: h - 2, class: "axis" }),
    values.length ? svg("polyline", { points: pts, class: "series" }) : null);
}

function fleetPage(main) {
  const tiles = el("div", { class: "tiles", id: "rates" });
  const queues = el("tbody", { id: "queues" });
  const workers = el("tbody", { id: "workers" });
  const tools = el("div", { class: "sources", id: "tools" });
  const errors = el("div", { class: "error-text" });
  const note = el("div", { class: "muted small", id: "history-note" });
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "Fleet")), tiles, errors,
    el("h2", {}, "Queues ", el("span", { class: "muted small", id: "history-span" }, "· the last hour")),
    el("table", { class: "runs", id: "queues-table" }, el("thead", {}, el("tr", {}, ...["Queue", "Depth", "In flight", "Idle pulls", "Redelivered", "Finished, last hour", "Throughput (runs/min)", "Depth"].map((h) => el("th", {}, h)))), queues),
    note,
    el("h2", {}, "Workers"),
    el("table", { class: "runs" }, el("thead", {}, el("tr", {}, ...["Worker", "Queues", "Slots", "Busy", "Waiting", "Models", "Version", "Last seen"].map((h) => el("th", {}, h)))), workers),
    el("h2", {}, "Tools ", el("span", { class: "muted small" }, "· by source")), tools);
  const tile = (label, value, cls, id) => el("div", { class: "tile " + (cls || ""), id }, el("div", { class: "value" }, String(value)), el("div", { class: "label" }, label));
  let hist = { samples: [], every: 10000 };
  let fleet = null;
  // The charts span the last hour, or the history's own span while it
  // is younger (a new fleet).
  const series = (queue, pick, rate) => {
    const now = Date.now();
    const first = hist.samples.length ? hist.samples[0].t : now;
    const span = Math.max(Math.min(3600000, now - first), 60000);
    // A partial slot (the console started in it) makes no rate.
    return hist.samples.filter((s) => !(rate && s.partial)).map((s) => {
      const q = (s.queues || []).find((x) => x.queue === queue);
      return { x: Math.max(0, 1 - (now - s.t) / span), y: q ? pick(q, s) : 0 };
    });
  };
  const draw = () => {
    if (!fleet) return;
    const f = fleet;
    const now = Date.now();
    let lastMin = 0, lastHour = 0, failed = 0, aborted = 0;
    for (const s of hist.samples) {
      for (const q of s.queues || []) {
        lastHour += q.finished || 0;
        failed += q.failed || 0;
        aborted += q.aborted || 0;
        if (now - s.t <= 60000) lastMin += q.finished || 0;
      }
    }
    const sum = (k) => f.queues.reduce((a, q) => a + (q[k] || 0), 0);
    const waiting = f.workers.reduce((a, w) => a + (w.waiting || 0), 0);
    tiles.replaceChildren(
      tile("finished, last minute", lastMin, "", "tile-minute"),
      tile("finished, last hour", nf.format(lastHour), "", "tile-hour"),
      tile("queued", nf.format(sum("depth")), "", "tile-queued"),
      tile("running", nf.format(sum("inFlight")), "", "tile-running"),
      tile("waiting for approval", waiting, waiting ? "warn" : "", "tile-waiting"),
      tile("failed, last hour", failed, failed ? "bad" : "", "tile-failed"),
      tile("aborted, last hour", aborted, "", "tile-aborted"),
      tile("workers", f.workers.length, "", "tile-workers"));
    queues.replaceChildren(...f.queues.map((q) => {
      // Runs a minute, over the time the slot's counts cover.
      const tput = series(q.queue, (x, s) => (x.finished || 0) * 60000 / (s.span || s.every || hist.every || 10000), true);
      const depth = series(q.queue, (x) => x.depth || 0);
      const hour = hist.samples.reduce((a, s) => a + (((s.queues || []).find((x) => x.queue === q.queue) || {}).finished || 0), 0);
      const peak = (vs) => Math.max(0, ...vs.map((v) => v.y));
      return el("tr", { "data-queue": q.queue },
        el("td", {}, q.queue), el("td", { class: "num" }, nf.format(q.depth)), el("td", { class: "num" }, nf.format(q.inFlight)),
        el("td", { class: "num" }, String(q.waiting)), el("td", { class: "num" }, String(q.redelivered)),
        el("td", { class: "num", "data-finished": String(hour) }, nf.format(hour)),
        el("td", { class: "chart", "data-points": String(tput.length) }, sparkline(tput, "tput", q.queue + ": runs finished per minute, last hour"), el("span", { class: "peak small muted" }, "peak " + Math.round(peak(tput)))),
        el("td", { class: "chart" }, sparkline(depth, "depth", q.queue + ": depth, last hour"), el("span", { class: "peak small muted" }, "peak " + nf.format(peak(depth)))));
    }));
    const every = (hist.every || 10000) % 1000 === 0 ? (hist.every || 10000) / 1000 + " s" : fmtDuration(hist.every);
    document.getElementById("history-span").textContent = "· the last hour, sampled every " + every;
    note.textContent = hist.problem ? hist.problem : hist.samples.length ? "charts since " + fmtDateTime(hist.samples[0].t) + " (" + hist.samples.length + " samples, kept an hour)" : "no samples yet: the first comes within " + every;
    if (f.workers.length === 0) {
      workers.replaceChildren(el("tr", {}, el("td", { colSpan: 8, class: "muted empty" }, "No worker presence: the workers of this fleet do not publish it (bucket agents_workers).")));
    } else {
      workers.replaceChildren(...f.workers.map((w) => el("tr", { "data-worker": String(w.worker || "") },
        el("td", { class: "mono" }, String(w.worker || "?")),
        el("td", {}, (w.queues || []).join(", ")),
        el("td", { class: "num" }, String(w.slots ?? "–")), el("td", { class: "num" }, String(w.busy ?? "–")),
        el("td", { class: "num" }, String(w.waiting ?? "–")),
        el("td", { class: "small" }, (w.models || []).join(", ") || (w.defaultModel ? w.defaultModel + " (default)" : "")),
        el("td", { class: "small" }, String(w.version ?? "") + (w.protocol ? " · protocol " + w.protocol : "")),
        el("td", { class: "small seen", title: fmtDateTime(w.seenAt) }, fmtAgo(w.seenAt)))));
    }
    const p = presence(f);
    const serving = (name) => f.workers.filter((w) => (w.tools || []).some((t) => t.name === name && t.available)).length;
    tools.replaceChildren(...bySource(p.tools).map(([source, ts]) => el("div", { class: "source", "data-source": source },
      el("div", { class: "source-head" }, el("span", { class: "mono" }, source), el("span", { class: "muted small" }, " · " + ts.length + (ts.length === 1 ? " tool" : " tools"))),
      el("div", { class: "chips" }, ...ts.sort((a, b) => a.name.localeCompare(b.name)).map((t) =>
        el("span", { class: "chip" + (t.available ? "" : " unavailable"), title: (t.description || "") + " · on " + serving(t.name) + " worker(s)" }, t.name))))));
    if (p.tools.length === 0) tools.replaceChildren(el("div", { class: "muted" }, "No tools in the presence."));
    errors.textContent = (f.errors || []).join("; ");
  };
  const tick = async () => {
    try { fleet = await getJSON("/api/fleet"); draw(); } catch (e) { errors.textContent = e.message; }
  };
  const history = async () => {
    try { hist = await getJSON("/api/fleet/history"); draw(); } catch (e) { note.textContent = e.message; }
  };
  poll(tick, 2000);
  poll(history, 10000);
}

// ------------------------------------------------------------ new-run form

function newRunPage(main) {
  main.append(el("div", { class: "toolbar" }, el("h1", {}, "New run")));
  if (!session.allowControl) {
    main.append(el("p", { class: "muted" }, "This console is read-only: start it with --allow-control to submit runs."));
    return;
  }
  // A field of several controls is a div: a label holds one.
  const field = (label, input, hint) => el(input.tagName === "DIV" ? "div" : "label", { class: "field" }, el("span", {}, label), input, hint ? el("small", { class: "muted" }, hint) : null);
  const prompt = el("textarea", { id: "new-prompt", name: "prompt", rows: 5, required: true });
  const title = el("input", { id: "new-title", name: "title", placeholder: "the first line of the prompt" });
  const model = el("select", { id: "new-model", name: "model" }, el("option", { value: "", text: "the worker's default" }));
  const modelOther = el("input", { id: "new-model-other", placeholder: "provider/id", hidden: true, "aria-label": "model (provider/id)" });
  const tools = el("div", { id: "new-tools", class: "toolpick" }, el("span", { class: "muted small" }, "reading the fleet's tools…"));
  const toolsOther = el("input", { id: "new-tools-other", placeholder: "other tools, comma-separated" });
  const queue = el("select", { id: "new-queue", name: "queue" }, el("option", { value: "default", text: "default" }));
  const gate = el("input", { id: "new-approve", name: "approve", placeholder: "e.g. deploy, mcp__* (or * for every call)" });
  const runID = el("input", { id: "new-id", name: "id", placeholder: "a fresh random id" });
  const meta = el("input", { id: "new-meta", name: "metadata", placeholder: "tenant=acme, team=search" });
  const faux = el("textarea", { id: "new-faux", name: "faux", rows: 4, placeholder: '{"responses":[{"content":[{"type":"text","text":"hi"}]}],"tokensPerSecond":20}' });
  model.addEventListener("change", () => { modelOther.hidden = model.value !== "__other"; });
  const form = el("form", { id: "new-run", class: "newrun" },
    field("Prompt", prompt), field("Title", title, "shown in the runs list (metadata title)"),
    field("Model", el("div", { class: "row" }, model, modelOther), "the models of the workers' model tables"),
    field("Tools", el("div", {}, tools, toolsOther), "the tools the fleet's workers serve, by source"),
    field("Queue", queue), field("Needs approval", gate, "tools whose calls wait for a person's answer (Approvals page)"),
    el("details", {}, el("summary", {}, "More"), field("Run id", runID), field("Metadata", meta, "key=value, comma-separated"),
      field("Faux script", faux, "JSON script for the faux provider (tests and demos)")),
    el("button", { type: "submit", id: "new-submit" }, "Submit run"));
  fleetInfo().then((f) => {
    const p = presence(f);
    const def = p.defaults.length === 1 ? " (" + p.defaults[0] + ")" : "";
    model.replaceChildren(el("option", { value: "", text: "the worker's default" + def }),
      ...p.models.map((m) => el("option", { value: m, text: m })), el("option", { value: "__other", text: "other…" }));
    const qs = f.queues.map((q) => q.queue);
    if (qs.length) {
      queue.replaceChildren(...qs.map((q) => el("option", { value: q, text: q })));
      queue.value = qs.includes("default") ? "default" : qs[0];
    }
    tools.replaceChildren(...bySource(p.tools.filter((t) => t.available)).map(([source, ts]) => el("fieldset", { class: "toolgroup" },
      el("legend", { class: "mono small" }, source),
      ...ts.sort((a, b) => a.name.localeCompare(b.name)).map((t) => el("label", { class: "toolopt", title: t.description || "" },
        el("input", { type: "checkbox", value: t.name, name: "tool" }), " ", el("span", { class: "mono" }, t.name))))));
    if (p.tools.length === 0) tools.replaceChildren(el("span", { class: "muted small" }, "No tools in the fleet's presence."));
  }).catch((e) => { tools.replaceChildren(el("span", { class: "error-text" }, "fleet: " + e.message)); });
  const list = (s) => s.split(",").map((x) => x.trim()).filter(Boolean);
  form.addEventListener("submit", async (e) => {
    e.preventDefault();
    const body = { prompt: prompt.value, queue: queue.value || "default" };
    const m = model.value === "__other" ? modelOther.value.trim() : model.value;
    if (m) body.model = m;
    const t = [...tools.querySelectorAll("input[type=checkbox]")].filter((c) => c.checked).map((c) => c.value).concat(list(toolsOther.value));
    if (t.length) body.tools = t;
    if (list(gate.value).length) body.approval = { tools: list(gate.value) };
    if (runID.value.trim()) body.id = runID.value.trim();
    const md = {};
    for (const kv of meta.value.split(",")) {
      const [k, ...v] = kv.split("=");
      if (k.trim()) md[k.trim()] = v.join("=").trim();
    }
    if (title.value.trim()) md.title = title.value.trim();
    if (Object.keys(md).length) body.metadata = md;
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
  } else if (path === "/approvals") {
    nav = "approvals";
    approvalsPage(main);
  } else if (path === "/schedules") {
    nav = "schedules";
    schedulesPage(main);
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
