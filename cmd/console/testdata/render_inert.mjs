// Runs the console's page script, as the console serves it, in node with a
// minimal DOM, and reports what the run page and the runs page made of a
// run (render_test.go checks the report).
//
//   node render_inert.mjs <console URL> <run id> [<markdown run id> <waiting run id>]
//
// With the two more ids it also reports the run page of a run whose
// answer is hostile markdown, and the run page and the Approvals page of a
// run whose tool call waits for approval with hostile arguments.
//
// The DOM is a stub: elements, text nodes, attributes, the selectors the
// page and the checks use. Its HTML sinks (innerHTML, outerHTML,
// insertAdjacentHTML, document.write) parse nothing: each use is reported.
// Anything else the page would need and the stub lacks throws, and the
// error is reported too, so a page that turns to another API fails loudly
// rather than passing unchecked. fetch and EventSource are real HTTP to
// the console.
import vm from "node:vm";

const [base, runID, mdRunID, waitingRunID] = process.argv.slice(2);
if (!base || !runID) {
  console.error("usage: node render_inert.mjs <console URL> <run id>");
  process.exit(2);
}

const sinks = []; // every use of an HTML sink, with what it was given
const errors = []; // the page's exceptions
const clip = (s) => { s = String(s); return s.length > 200 ? s.slice(0, 200) + "…" : s; };
const sink = (name, value) => sinks.push(name + " = " + clip(value));
process.on("uncaughtException", (e) => errors.push("uncaught: " + (e && e.stack || e)));
process.on("unhandledRejection", (e) => errors.push("unhandled rejection: " + (e && e.stack || e)));

// ------------------------------------------------------------------ the DOM

class Node {
  constructor(doc) {
    this.ownerDocument = doc;
    this.parentNode = null;
    this.childNodes = [];
  }
  get isConnected() {
    let n = this;
    while (n.parentNode) n = n.parentNode;
    return n === this.ownerDocument.documentElement;
  }
  remove() {
    if (!this.parentNode) return;
    const siblings = this.parentNode.childNodes;
    siblings.splice(siblings.indexOf(this), 1);
    this.parentNode = null;
  }
}

class Text extends Node {
  constructor(doc, data) {
    super(doc);
    this.data = String(data);
  }
  get nodeType() { return 3; }
  get textContent() { return this.data; }
  set textContent(v) { this.data = String(v); }
}

const camel = (s) => s.replace(/-([a-z])/g, (_, c) => c.toUpperCase());
const kebab = (s) => s.replace(/[A-Z]/g, (c) => "-" + c.toLowerCase());

class Element extends Node {
  constructor(doc, tag) {
    super(doc);
    this.localName = String(tag).toLowerCase();
    this.attrs = new Map();
    this.listeners = {};
    this.style = {};
    const attrs = this.attrs;
    this.dataset = new Proxy({}, {
      get: (_, k) => (typeof k === "string" ? attrs.get("data-" + kebab(k)) : undefined),
      set: (_, k, v) => { attrs.set("data-" + kebab(k), String(v)); return true; },
      has: (_, k) => attrs.has("data-" + kebab(k)),
    });
    this.classList = {
      contains: (c) => this.className.split(/\s+/).includes(c),
      add: (...cs) => { for (const c of cs) if (!this.classList.contains(c)) this.className = (this.className + " " + c).trim(); },
      remove: (...cs) => { this.className = this.className.split(/\s+/).filter((c) => c && !cs.includes(c)).join(" "); },
      toggle: (c, force) => {
        const on = force === undefined ? !this.classList.contains(c) : !!force;
        if (on) this.classList.add(c); else this.classList.remove(c);
        return on;
      },
    };
  }
  get nodeType() { return 1; }
  get tagName() { return this.localName.toUpperCase(); }
  get id() { return this.attrs.get("id") || ""; }
  set id(v) { this.attrs.set("id", String(v)); }
  get className() { return this.attrs.get("class") || ""; }
  set className(v) { this.attrs.set("class", String(v)); }
  setAttribute(k, v) { this.attrs.set(String(k).toLowerCase(), String(v)); }
  getAttribute(k) { return this.attrs.has(k) ? this.attrs.get(k) : null; }
  hasAttribute(k) { return this.attrs.has(k); }
  removeAttribute(k) { this.attrs.delete(k); }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  removeEventListener(type, fn) { this.listeners[type] = (this.listeners[type] || []).filter((f) => f !== fn); }

  #adopt(nodes) {
    return nodes.map((n) => {
      if (!(n instanceof Node)) n = new Text(this.ownerDocument, n);
      n.remove();
      n.parentNode = this;
      return n;
    });
  }
  append(...nodes) { this.childNodes.push(...this.#adopt(nodes)); }
  appendChild(n) { this.append(n); return n; }
  prepend(...nodes) { this.childNodes.unshift(...this.#adopt(nodes)); }
  replaceChildren(...nodes) {
    for (const c of this.childNodes) c.parentNode = null;
    this.childNodes = [];
    this.append(...nodes);
  }
  before(...nodes) {
    const parent = this.parentNode;
    if (!parent) return;
    const adopted = parent.#adopt(nodes);
    parent.childNodes.splice(parent.childNodes.indexOf(this), 0, ...adopted);
  }
  after(...nodes) {
    const parent = this.parentNode;
    if (!parent) return;
    const adopted = parent.#adopt(nodes);
    parent.childNodes.splice(parent.childNodes.indexOf(this) + 1, 0, ...adopted);
  }
  replaceWith(...nodes) {
    const parent = this.parentNode;
    if (!parent) return;
    const adopted = parent.#adopt(nodes.filter((n) => n !== this));
    const i = parent.childNodes.indexOf(this);
    parent.childNodes.splice(i, 1, ...adopted);
    this.parentNode = null;
  }

  get textContent() { return this.childNodes.map((c) => c.textContent).join(""); }
  set textContent(v) { this.replaceChildren(...(v === "" || v == null ? [] : [String(v)])); }
  get children() { return this.childNodes.filter((c) => c instanceof Element); }

  // The HTML sinks: reported, never parsed.
  get innerHTML() { return ""; }
  set innerHTML(v) { sink("innerHTML", v); }
  get outerHTML() { return ""; }
  set outerHTML(v) { sink("outerHTML", v); }
  insertAdjacentHTML(pos, v) { sink("insertAdjacentHTML(" + pos + ")", v); }

  *descendants() {
    for (const c of this.children) {
      yield c;
      yield* c.descendants();
    }
  }
  matches(selector) { return parseSelector(selector).some((chain) => matchChain(this, chain)); }
  closest(selector) {
    for (let n = this; n instanceof Element; n = n.parentNode) if (n.matches(selector)) return n;
    return null;
  }
  querySelectorAll(selector) {
    const chains = parseSelector(selector);
    return [...this.descendants()].filter((e) => chains.some((chain) => matchChain(e, chain)));
  }
  querySelector(selector) { return this.querySelectorAll(selector)[0] || null; }
}

// Selectors: comma-separated chains of compound selectors (tag, #id,
// .class, [attr], [attr=value], [attr="value"]) joined by descendant
// combinators. Anything else throws.
function parseSelector(selector) {
  return selector.split(",").map((group) => group.trim().split(/\s+/).map((compound) => {
    const parts = [];
    const re = /^(?:([a-zA-Z][a-zA-Z0-9-]*)|#([\w-]+)|\.([\w-]+)|\[([\w-]+)(?:=(?:"([^"]*)"|([\w-]+)))?\])/;
    let rest = compound;
    while (rest) {
      const m = re.exec(rest);
      if (!m) throw new Error("DOM stub: selector not supported: " + selector);
      if (m[1]) parts.push((e) => e.localName === m[1].toLowerCase());
      else if (m[2]) parts.push((e) => e.id === m[2]);
      else if (m[3]) parts.push((e) => e.classList.contains(m[3]));
      else {
        const want = m[5] ?? m[6];
        parts.push((e) => e.hasAttribute(m[4]) && (want === undefined || e.getAttribute(m[4]) === want));
      }
      rest = rest.slice(m[0].length);
    }
    return (e) => parts.every((p) => p(e));
  }));
}

function matchChain(e, chain) {
  if (!chain[chain.length - 1](e)) return false;
  let i = chain.length - 2;
  for (let n = e.parentNode; i >= 0 && n instanceof Element; n = n.parentNode) if (chain[i](n)) i--;
  return i < 0;
}

class Document {
  constructor() {
    this.title = "";
    this.created = []; // every element the page created, by tag
    const e = (tag, attrs, ...children) => {
      const n = new Element(this, tag);
      for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
      n.append(...children);
      return n;
    };
    // index.html's body.
    this.head = e("head", {});
    this.body = e("body", {},
      e("header", {}, e("a", { class: "brand", href: "/" }, "agentfleet"),
        e("nav", {}, e("a", { href: "/", "data-nav": "runs" }, "Runs"), e("a", { href: "/fleet", "data-nav": "fleet" }, "Fleet"),
          e("a", { href: "/new", "data-nav": "new", id: "nav-new" }, "New run")),
        e("span", { id: "session" })),
      e("main", { id: "main" }),
      e("div", { id: "toast", role: "status" }));
    this.documentElement = e("html", {}, this.head, this.body);
  }
  createElement(tag) {
    const n = new Element(this, tag);
    this.created.push(n.localName);
    return n;
  }
  createTextNode(s) { return new Text(this, s); }
  getElementById(id) { return [...this.documentElement.descendants()].find((e) => e.id === id) || null; }
  querySelector(s) { return this.documentElement.querySelector(s); }
  querySelectorAll(s) { return this.documentElement.querySelectorAll(s); }
  write(v) { sink("document.write", v); }
  writeln(v) { sink("document.writeln", v); }
}

// ------------------------------------------------------------ the network

const abs = (path) => new URL(String(path), base);

// EventSource: the stream read over fetch, the events dispatched as the
// browser does (event, id, data fields; a blank line ends an event).
const sources = new Set();
class EventSource {
  constructor(url) {
    this.listeners = {};
    this.ctl = new AbortController();
    this.closed = false;
    sources.add(this);
    this.read(url);
  }
  addEventListener(type, fn) { (this.listeners[type] ||= []).push(fn); }
  close() { this.closed = true; this.ctl.abort(); sources.delete(this); }
  async read(url) {
    try {
      const r = await fetch(abs(url), { signal: this.ctl.signal, headers: { Accept: "text/event-stream" } });
      if (!r.ok) throw new Error("events: " + r.status);
      const dec = new TextDecoder();
      let buf = "";
      for await (const chunk of r.body) {
        buf += dec.decode(chunk, { stream: true });
        for (let i; !this.closed && (i = buf.indexOf("\n\n")) >= 0;) {
          const block = buf.slice(0, i);
          buf = buf.slice(i + 2);
          this.dispatch(block);
        }
        if (this.closed) return;
      }
    } catch (e) {
      if (!this.closed) errors.push("EventSource: " + e);
    }
  }
  dispatch(block) {
    let type = "message", id = "";
    const data = [];
    for (const line of block.split("\n")) {
      if (line.startsWith(":")) continue;
      const colon = line.indexOf(":");
      const field = colon < 0 ? line : line.slice(0, colon);
      let value = colon < 0 ? "" : line.slice(colon + 1);
      if (value.startsWith(" ")) value = value.slice(1);
      if (field === "event") type = value;
      else if (field === "id") id = value;
      else if (field === "data") data.push(value);
    }
    if (data.length === 0) return;
    const ev = { type, data: data.join("\n"), lastEventId: id };
    for (const fn of this.listeners[type] || []) {
      try { fn(ev); } catch (e) { errors.push("event " + type + ": " + (e && e.stack || e)); }
    }
  }
}

// --------------------------------------------------------------- the pages

// The page's scripts, in the order index.html loads them.
const scripts = await (async () => {
  const page = await (await fetch(abs("/"))).text();
  const out = [];
  for (const m of page.matchAll(/<script src="([^"]+)"/g)) {
    const r = await fetch(abs(m[1]));
    if (!r.ok) throw new Error("GET " + m[1] + ": " + r.status);
    out.push({ name: m[1], code: await r.text() });
  }
  if (out.length === 0) throw new Error("index.html loads no script");
  return out;
})();

// open runs the page script on a fresh document at path, as the browser
// does when it loads index.html there.
function open(path) {
  const u = abs(path);
  const document = new Document();
  // The window: no layout, so the page is always scrolled to its end.
  const win = {
    scrollY: 0, innerHeight: 900,
    scrollTo() {}, addEventListener() {}, removeEventListener() {},
  };
  Object.defineProperty(document.documentElement, "scrollHeight", { get: () => 900 });
  const ctx = vm.createContext({
    document, Node, EventSource, URLSearchParams, URL, AbortController, TextDecoder, console,
    location: { pathname: u.pathname, search: u.search, assign() {} },
    history: { replaceState() {}, pushState() {}, state: null },
    window: win,
    fetch: (p, opts) => fetch(abs(p), opts),
    crypto: globalThis.crypto,
    setTimeout, clearTimeout, setInterval, clearInterval,
  });
  for (const s of scripts) vm.runInContext(s.code, ctx, { filename: s.name });
  return document;
}

async function until(what, cond) {
  for (const deadline = Date.now() + 15000; Date.now() < deadline;) {
    if (cond()) return;
    await new Promise((r) => setTimeout(r, 10));
  }
  throw new Error("timed out waiting for " + what + "; errors: " + JSON.stringify(errors));
}

const text = (doc, selector) => doc.querySelectorAll(selector).map((e) => e.textContent);
const tags = (doc) => {
  const n = {};
  for (const t of doc.created) n[t] = (n[t] || 0) + 1;
  return n;
};

const runDoc = open("/runs/" + encodeURIComponent(runID));
await until("the run page's transcript to end and its record to say finished", () =>
  runDoc.getElementById("transcript")?.dataset.ended === "true" &&
  ["succeeded", "failed", "aborted"].includes(runDoc.getElementById("status")?.dataset.state));
for (const s of sources) s.close();

const runsDoc = open("/?q=" + encodeURIComponent(runID));
await until("the run's row on the runs page", () => runsDoc.querySelector("tr[data-run]") !== null);

const report = {
  sinks,
  errors,
  run: {
    transcript: runDoc.getElementById("transcript").textContent,
    userText: text(runDoc, ".msg-user .text"),
    thinking: text(runDoc, ".msg-assistant .thinking .text"),
    assistantText: runDoc.querySelectorAll(".msg-assistant .text")
      .filter((e) => !e.parentNode.classList.contains("thinking")).map((e) => e.textContent),
    toolCallLabels: text(runDoc, ".toolcall .label"),
    created: tags(runDoc),
  },
  runs: {
    rows: runsDoc.querySelectorAll("tr[data-run]").map((r) => r.getAttribute("data-run")),
    metadata: text(runsDoc, "tr[data-run] td.meta"),
    created: tags(runsDoc),
  },
};
if (mdRunID) {
  const doc = open("/runs/" + encodeURIComponent(mdRunID));
  await until("the markdown run's transcript to end", () => doc.getElementById("transcript")?.dataset.ended === "true");
  for (const s of sources) s.close();
  const md = doc.querySelectorAll("#transcript .msg-assistant .md");
  report.markdown = {
    text: md.map((e) => e.textContent),
    hrefs: doc.querySelectorAll("#transcript a").map((a) => String(a.href || "")),
    elements: Object.fromEntries(["h1", "strong", "a", "img", "script", "div", "b"].map((t) => [t, doc.querySelectorAll("#transcript .md " + t).length])),
    badLinks: text(doc, ".md-badlink"),
    headings: text(doc, ".md h1, .md h2"),
    strong: text(doc, ".md strong"),
    created: tags(doc),
  };
}
if (waitingRunID) {
  const doc = open("/runs/" + encodeURIComponent(waitingRunID));
  await until("the waiting call's banner", () => doc.querySelector(".approval") !== null);
  for (const s of sources) s.close();
  const queue = open("/approvals");
  await until("the approvals page's row", () => queue.querySelector("#approvals-body tr[data-run]") !== null);
  report.approval = {
    runArgs: text(doc, ".toolcall .args"),
    banner: text(doc, ".approval .approval-head"),
    editBox: doc.querySelectorAll(".approval .edit-args").map((e) => String(e.value)),
    buttons: text(doc, ".approval button"),
    created: tags(doc),
    queueArgs: text(queue, "#approvals-body pre.args"),
    queueEditBox: queue.querySelectorAll("#approvals-body .edit-args").map((e) => String(e.value)),
    queueCreated: tags(queue),
  };
}
process.stdout.write(JSON.stringify(report), () => process.exit(0));
