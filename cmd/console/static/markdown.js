// agentfleet console: markdown shown as DOM nodes, never as HTML.
//
// The markdown is parsed by marked's lexer (vendor/marked.esm.js, GFM:
// CommonMark plus tables, strikethrough, task lists and bare URLs), which
// only turns text into tokens; marked's HTML renderer is never used. This
// file walks the tokens and builds elements with createElement and text
// nodes. Model text is hostile input, so: raw HTML (a block or inline) is
// shown as the text it is; links are made only to http(s) and mailto URLs
// (others are shown as their text); images are never loaded (their alt
// text is shown, linked when the URL is safe); nothing is handed to an
// HTML parser. Bounds keep hostile text cheap: past MD_MAX_CHARS, or with
// a line opening more containers than MD_NEST allows, the text is shown
// plain; a block whose inline text is longer than MD_MAX_INLINE, and the
// blocks left once MD_INLINE_BUDGET_MS of inline parsing is spent, are
// shown as their text; containers nested deeper than MD_MAX_DEPTH are
// shown as their source.
//
// A module: app.js (a classic script, run after it) calls the global
// renderMarkdown(text, document).
import { Lexer, getDefaults } from "./vendor/marked.esm.js";

const MD_MAX_CHARS = 200000; // longer text is shown as plain text
const MD_MAX_DEPTH = 12; // nested quotes and lists built; deeper: source text
const MD_MAX_INLINE_DEPTH = 24; // nested emphasis, links, ...
// marked's emphasis matching is quadratic in a paragraph with many
// unmatched delimiters (markedjs/marked#4099): a paragraph of 5,000 "*a_"
// took about 0.5 s here, of 10,000 about 2 s. So inline markdown is parsed only
// in blocks up to MD_MAX_INLINE characters and for MD_INLINE_BUDGET_MS per
// rendering (ordinary text parses at well over 100,000 characters in that).
const MD_MAX_INLINE = 5000;
const MD_INLINE_BUDGET_MS = 500;
// A line that opens more than 32 quotes or list items: marked recurses
// once per level (deep enough, it overflows the stack after a second's
// work), so such text is shown plain. Each repetition starts on a marker,
// never a blank, so backtracking into the blanks before it fails at once.
const MD_NEST = /^[ \t]*(?:>[ \t]*|(?:[-+*]|\d{1,9}[.)])[ \t]+){33}/m;

// mdSafeHref returns the URL when a link may point there, else "".
function mdSafeHref(url) {
  const u = String(url || "").trim();
  // No whitespace or control characters anywhere (browsers strip some
  // of them from a scheme: "java\nscript:").
  if (!u || /[\u0000-\u0020\u007f-\u009f]/.test(u)) return "";
  return /^(https?:\/\/[^/?#]|mailto:[^/])/i.test(u) ? u : "";
}

// mdTokens lexes text as marked.lexer does, within the bounds above;
// null when the text is to be shown plain.
function mdTokens(text) {
  if (text.length > MD_MAX_CHARS || MD_NEST.test(text)) return null;
  const lexer = new Lexer({ ...getDefaults(), gfm: true, breaks: true });
  try {
    // Lexer.lex, with the inline pass bounded: blockTokens queues each
    // block's inline source with the (empty) token list to fill.
    lexer.blockTokens(text.replace(/\r\n?/g, "\n"), lexer.tokens);
    const start = Date.now();
    for (const q of lexer.inlineQueue) {
      if (q.src.length > MD_MAX_INLINE || Date.now() - start > MD_INLINE_BUDGET_MS) {
        q.tokens.push({ type: "md-source", raw: q.src, text: q.src });
        continue;
      }
      lexer.state.inRawBlock = false;
      lexer.inlineTokens(q.src, q.tokens);
    }
  } catch {
    return null; // a RangeError on deep nesting, or a bug in marked
  }
  return lexer.tokens;
}

// renderMarkdown returns a div.md holding text rendered as markdown.
export function renderMarkdown(text, doc) {
  doc = doc || document;
  const root = mdEl(doc, "div", "md");
  text = String(text ?? "");
  const tokens = mdTokens(text);
  if (!tokens) {
    root.append(doc.createTextNode(text));
    root.classList.add("plain");
    return root;
  }
  mdBlocks(tokens, root, doc, 0);
  return root;
}
globalThis.renderMarkdown = renderMarkdown;

function mdEl(doc, tag, cls) {
  const e = doc.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

// mdSource appends a token's source as text, kept as written.
function mdSource(t, parent, doc) {
  const s = mdEl(doc, "span", "md-source");
  s.append(doc.createTextNode(mdTrimEnd(t.raw ?? t.text)));
  parent.append(s);
}

// mdTrimEnd is s without its final newlines (a loop: /\n+$/ would take
// quadratic time on a long run of newlines inside s).
function mdTrimEnd(s) {
  s = String(s ?? "");
  let end = s.length;
  while (end > 0 && s[end - 1] === "\n") end--;
  return s.slice(0, end);
}

// mdBlocks renders block tokens into parent.
function mdBlocks(tokens, parent, doc, depth) {
  for (const t of tokens || []) mdBlock(t, parent, doc, depth);
}

function mdBlock(t, parent, doc, depth) {
  switch (t.type) {
    case "space":
    case "def": // a link reference definition: its links are resolved
      return;
    case "heading": {
      const h = mdEl(doc, "h" + Math.min(Math.max(Number(t.depth) || 1, 1), 6), "md-h");
      mdInline(t.tokens, h, doc, 0);
      parent.append(h);
      return;
    }
    case "paragraph": {
      const p = mdEl(doc, "p");
      mdInline(t.tokens, p, doc, 0);
      parent.append(p);
      return;
    }
    case "text": // the text of a tight list item
      if (t.tokens) mdInline(t.tokens, parent, doc, 0);
      else parent.append(doc.createTextNode(t.text || ""));
      return;
    case "code": {
      const pre = mdEl(doc, "pre", "md-code");
      const code = mdEl(doc, "code");
      const lang = /^\S+/.exec(t.lang || "");
      if (lang) code.dataset.lang = lang[0];
      code.append(doc.createTextNode(mdTrimEnd(t.text)));
      pre.append(code);
      parent.append(pre);
      return;
    }
    case "html": { // raw HTML: its text
      const p = mdEl(doc, "p", "md-source");
      p.append(doc.createTextNode(mdTrimEnd(t.text)));
      parent.append(p);
      return;
    }
    case "hr":
      parent.append(mdEl(doc, "hr"));
      return;
    case "blockquote": {
      const q = mdEl(doc, "blockquote");
      if (depth < MD_MAX_DEPTH) mdBlocks(t.tokens, q, doc, depth + 1);
      else mdSource(t, q, doc);
      parent.append(q);
      return;
    }
    case "list": {
      const list = mdEl(doc, t.ordered ? "ol" : "ul");
      const start = Number(t.start);
      if (t.ordered && Number.isInteger(start) && start !== 1) list.setAttribute("start", String(start));
      for (const item of t.items || []) {
        const li = mdEl(doc, "li", item.task ? "md-task" : "");
        if (depth < MD_MAX_DEPTH) mdBlocks(item.tokens, li, doc, depth + 1);
        else mdSource(item, li, doc);
        list.append(li);
      }
      parent.append(list);
      return;
    }
    case "table": {
      const table = mdEl(doc, "table", "md-table");
      const row = (cells, tag) => {
        const tr = mdEl(doc, "tr");
        (t.header || []).forEach((_, k) => {
          const cell = (cells || [])[k];
          const c = mdEl(doc, tag);
          const align = (t.align || [])[k];
          if (align === "center" || align === "right") c.className = "align-" + align;
          if (cell) mdInline(cell.tokens, c, doc, 0);
          tr.append(c);
        });
        return tr;
      };
      const thead = mdEl(doc, "thead");
      thead.append(row(t.header, "th"));
      const tbody = mdEl(doc, "tbody");
      for (const r of t.rows || []) tbody.append(row(r, "td"));
      table.append(thead, tbody);
      parent.append(table);
      return;
    }
    case "checkbox": // a task item's box
      parent.append(mdCheckbox(t, doc), doc.createTextNode(" "));
      return;
    default: // a token this file does not know: its source
      mdSource(t, parent, doc);
  }
}

function mdCheckbox(t, doc) {
  const box = mdEl(doc, "input", "md-check");
  box.type = "checkbox";
  box.checked = !!t.checked;
  box.disabled = true;
  return box;
}

// mdInline renders inline tokens into parent.
function mdInline(tokens, parent, doc, depth) {
  for (const t of tokens || []) {
    if (depth >= MD_MAX_INLINE_DEPTH) {
      mdSource(t, parent, doc);
      continue;
    }
    switch (t.type) {
      case "text":
        if (t.tokens) mdInline(t.tokens, parent, doc, depth + 1);
        // escaped: text inside raw HTML, kept as written.
        else parent.append(doc.createTextNode(t.escaped ? t.text : mdDecode(t.text)));
        break;
      case "escape": // a backslash escape: the character
        parent.append(doc.createTextNode(t.text));
        break;
      case "html": // inline raw HTML: its text
        parent.append(doc.createTextNode(t.text));
        break;
      case "codespan": {
        const code = mdEl(doc, "code");
        code.append(doc.createTextNode(t.text));
        parent.append(code);
        break;
      }
      case "strong":
      case "em":
      case "del": {
        const e = mdEl(doc, t.type);
        mdInline(t.tokens, e, doc, depth + 1);
        parent.append(e);
        break;
      }
      case "br":
        parent.append(mdEl(doc, "br"));
        break;
      case "link": {
        const href = mdSafeHref(mdDecode(t.href));
        let a;
        if (href) {
          a = mdAnchor(doc, href);
          if (t.title) a.title = mdDecode(t.title);
        } else {
          a = mdEl(doc, "span", "md-badlink");
          a.title = "link not followed: " + String(t.href).slice(0, 200);
        }
        mdInline(t.tokens, a, doc, depth + 1);
        parent.append(a);
        break;
      }
      case "image": {
        // Never loaded: the alt text, linked to the image when safe.
        const href = mdSafeHref(mdDecode(t.href));
        const a = href ? mdAnchor(doc, href, "md-image") : mdEl(doc, "span", "md-image md-badlink");
        a.append(doc.createTextNode("image: " + (mdPlain(t.tokens) || mdDecode(t.href))));
        parent.append(a);
        break;
      }
      case "checkbox":
        parent.append(mdCheckbox(t, doc), doc.createTextNode(" "));
        break;
      default: // md-source, or a token this file does not know
        mdSource(t, parent, doc);
    }
  }
}

function mdAnchor(doc, href, cls) {
  const a = mdEl(doc, "a", cls);
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  return a;
}

// mdPlain is the text of inline tokens (an image's alt text).
function mdPlain(tokens, depth = 0) {
  let s = "";
  for (const t of tokens || []) {
    if (t.tokens && depth < MD_MAX_INLINE_DEPTH) s += mdPlain(t.tokens, depth + 1);
    else if (t.type === "text" && !t.escaped) s += mdDecode(t.text);
    else if (t.type !== "br") s += t.text ?? t.raw ?? "";
  }
  return s;
}

// Character references. marked leaves them in its tokens for the HTML
// parser it does not get here: text tokens keep named references (with
// numeric ones decoded, "&" as "&amp;" then), link destinations and titles
// keep both. Decoded once, so "&amp;lt;" shows "&lt;"; a name not listed
// stays as written. The result is only ever text.
const MD_ENTITIES = new Map(Object.entries({
  amp: "&", lt: "<", gt: ">", quot: "\"", apos: "'", nbsp: "\u00a0", shy: "\u00ad",
  copy: "©", reg: "®", trade: "™", hellip: "…", mdash: "—", ndash: "–", minus: "−",
  lsquo: "‘", rsquo: "’", ldquo: "“", rdquo: "”", laquo: "«", raquo: "»",
  middot: "·", bull: "•", times: "×", divide: "÷", deg: "°", plusmn: "±", micro: "µ",
  para: "¶", sect: "§", euro: "€", pound: "£", yen: "¥", cent: "¢",
  larr: "←", rarr: "→", uarr: "↑", darr: "↓", harr: "↔", lArr: "⇐", rArr: "⇒",
  le: "≤", ge: "≥", ne: "≠", asymp: "≈", infin: "∞", check: "✓", cross: "✗",
}));

function mdDecode(s) {
  s = String(s ?? "");
  if (!s.includes("&")) return s;
  return s.replace(/&(?:#(\d{1,7})|#[xX]([0-9a-fA-F]{1,6})|([A-Za-z][A-Za-z0-9]{1,31}));/g, (m, dec, hex, name) => {
    if (name) return MD_ENTITIES.get(name) ?? m;
    const cp = dec ? parseInt(dec, 10) : parseInt(hex, 16);
    return cp === 0 || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? "\ufffd" : String.fromCodePoint(cp);
  });
}
