// A minimal DOM for running the console's page scripts in node
// (render_inert.mjs, markdown_cases.mjs), and a loader of those scripts.
//
// The DOM is a stub: elements, text nodes, attributes, the selectors the
// page and the checks use. Its HTML sinks (innerHTML, outerHTML,
// insertAdjacentHTML, document.write) parse nothing: each use is recorded
// in sinks. Anything else the page would need and the stub lacks throws,
// so a page that turns to another API fails loudly rather than passing
// unchecked.
//
// Module scripts need node's vm modules: run node with
// --experimental-vm-modules.
import vm from "node:vm";

export const sinks = []; // every use of an HTML sink, with what it was given
const clip = (s) => { s = String(s); return s.length > 200 ? s.slice(0, 200) + "…" : s; };
const sink = (name, value) => sinks.push(name + " = " + clip(value));

// ------------------------------------------------------------------ the DOM

export class Node {
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

export class Text extends Node {
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

export class Element extends Node {
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

export class Document {
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


// serialize writes a node as HTML-like text for checks: elements with
// their attributes and the properties the markdown renderer sets (as the
// attributes they reflect in a browser), text escaped, so "<" in the text
// is always "&lt;" and every "<tag" is an element.
const reflected = ["href", "rel", "target", "title", "type", "checked", "disabled"];
const esc = (s) => String(s).replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;").replace(/"/g, "&quot;");
export function serialize(n) {
  if (n instanceof Text) return esc(n.data);
  let s = "<" + n.localName;
  for (const [k, v] of n.attrs) s += " " + k + "=\"" + esc(v) + "\"";
  for (const k of reflected) {
    if (n[k] === undefined || n[k] === "" || n[k] === false || n.attrs.has(k)) continue;
    s += n[k] === true ? " " + k : " " + k + "=\"" + esc(n[k]) + "\"";
  }
  return s + ">" + n.childNodes.map(serialize).join("") + "</" + n.localName + ">";
}

// ---------------------------------------------------------- the scripts

// fetchScript gets a script as a browser would run it: 200 and a
// JavaScript Content-Type (the console sends nosniff). Memoised.
const fetched = new Map();
function fetchScript(url) {
  if (!fetched.has(url)) {
    fetched.set(url, (async () => {
      const r = await fetch(url);
      if (!r.ok) throw new Error("GET " + url + ": " + r.status);
      const type = r.headers.get("content-type") || "";
      if (!/^(text|application)\/javascript\b/.test(type)) throw new Error("GET " + url + ": Content-Type " + type + ", not JavaScript");
      return r.text();
    })());
  }
  return fetched.get(url);
}

// pageScripts lists the scripts of the page at url (index.html), in the
// order the browser runs them (all are deferred or modules): { url, module }.
export async function pageScripts(url) {
  const r = await fetch(url);
  if (!r.ok) throw new Error("GET " + url + ": " + r.status);
  const page = await r.text();
  const out = [];
  for (const m of page.matchAll(/<script\b([^>]*)>/g)) {
    const src = /\bsrc="([^"]+)"/.exec(m[1]);
    if (!src) throw new Error("index.html has an inline script: " + m[0]);
    const module = /\btype="module"/.test(m[1]);
    if (!module && !/\bdefer\b/.test(m[1])) throw new Error("a classic script that is not deferred: " + m[0]);
    out.push({ url: new URL(src[1], url).href, module });
  }
  if (out.length === 0) throw new Error("index.html loads no script");
  return out;
}

// runScripts runs scripts in the vm context ctx, in order: a classic
// script as it is, a module with its imports (fetched from the server,
// relative to the module's URL, each once per context) and evaluated
// before the next script runs, as deferred scripts and modules are.
export async function runScripts(ctx, scripts) {
  if (scripts.some((s) => s.module) && typeof vm.SourceTextModule !== "function") {
    throw new Error("module scripts need node --experimental-vm-modules");
  }
  const modules = new Map();
  const load = (url) => {
    if (!modules.has(url)) {
      modules.set(url, fetchScript(url).then((code) => new vm.SourceTextModule(code, { context: ctx, identifier: url })));
    }
    return modules.get(url);
  };
  for (const s of scripts) {
    if (!s.module) {
      vm.runInContext(await fetchScript(s.url), ctx, { filename: s.url });
      continue;
    }
    const m = await load(s.url);
    await m.link((specifier, from) => load(new URL(specifier, from.identifier).href));
    await m.evaluate();
  }
}
