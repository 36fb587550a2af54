// Runs the console's page script, as the console serves it, in node with a
// minimal DOM, and reports what the run page and the runs page made of a
// run (render_test.go checks the report).
//
//   node --experimental-vm-modules render_inert.mjs <console URL> <run id> [<markdown run id> <waiting run id>]
//
// With the two more ids it also reports the run page of a run whose
// answer is hostile markdown, and the run page and the Approvals page of a
// run whose tool call waits for approval with hostile arguments.
//
// The DOM is a stub (domstub.mjs): its HTML sinks (innerHTML, outerHTML,
// insertAdjacentHTML, document.write) parse nothing, and each use is
// reported. Anything else the page would need and the stub lacks throws,
// and the error is reported too, so a page that turns to another API fails
// loudly rather than passing unchecked. fetch and EventSource are real
// HTTP to the console. The page's module (markdown.js) needs
// node --experimental-vm-modules.
import vm from "node:vm";
import { Node, Document, sinks, pageScripts, runScripts } from "./domstub.mjs";

const [base, runID, mdRunID, waitingRunID] = process.argv.slice(2);
if (!base || !runID) {
  console.error("usage: node --experimental-vm-modules render_inert.mjs <console URL> <run id>");
  process.exit(2);
}

const errors = []; // the page's exceptions
process.on("uncaughtException", (e) => errors.push("uncaught: " + (e && e.stack || e)));
process.on("unhandledRejection", (e) => errors.push("unhandled rejection: " + (e && e.stack || e)));

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
const scripts = await pageScripts(abs("/").href);

// open runs the page scripts on a fresh document at path, as the browser
// does when it loads index.html there.
async function open(path) {
  const u = abs(path);
  const document = new Document();
  // The window: no layout, so the page is always scrolled to its end.
  const win = {
    scrollY: 0, innerHeight: 900,
    scrollTo() {}, addEventListener() {}, removeEventListener() {},
  };
  Object.defineProperty(document.documentElement, "scrollHeight", { get: () => 900 });
  const ctx = vm.createContext({
    document, Node, EventSource, URLSearchParams, URL, AbortController, AbortSignal, TextDecoder, console,
    location: { pathname: u.pathname, search: u.search, assign() {} },
    history: { replaceState() {}, pushState() {}, state: null },
    window: win,
    fetch: (p, opts) => fetch(abs(p), opts),
    crypto: globalThis.crypto,
    setTimeout, clearTimeout, setInterval, clearInterval,
  });
  await runScripts(ctx, scripts);
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

const runDoc = await open("/runs/" + encodeURIComponent(runID));
await until("the run page's transcript to end and its record to say finished", () =>
  runDoc.getElementById("transcript")?.dataset.ended === "true" &&
  ["succeeded", "failed", "aborted"].includes(runDoc.getElementById("status")?.dataset.state));
for (const s of sources) s.close();

const runsDoc = await open("/?q=" + encodeURIComponent(runID));
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
  const doc = await open("/runs/" + encodeURIComponent(mdRunID));
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
  const doc = await open("/runs/" + encodeURIComponent(waitingRunID));
  await until("the waiting call's banner", () => doc.querySelector(".approval") !== null);
  for (const s of sources) s.close();
  const queue = await open("/approvals");
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
