// agentfleet console: a small Markdown renderer that builds DOM nodes and
// never parses HTML. Model text is hostile input: raw HTML stays text,
// links are made only to http(s) and mailto URLs, images are not loaded
// (their alt text is shown, linked when the URL is safe). What it knows:
// ATX headings, paragraphs (a line break is kept), fenced code, block
// quotes, lists (nested by indentation), GFM tables, rules; inline code,
// strong, emphasis, strikethrough, links, autolinks and bare URLs, and
// backslash escapes. Anything else is shown as the text it is.
"use strict";

const MD_MAX_DEPTH = 12; // nested quotes and lists
const MD_MAX_CHARS = 200000; // longer text is shown as plain text
// MD_SCAN bounds the search for a closing delimiter, so hostile text of
// many openers costs its length times this, not its length squared.
const MD_SCAN = 4000;

// mdSafeHref returns the URL when a link may point there, else "".
function mdSafeHref(url) {
  const u = String(url || "").trim();
  // No whitespace or control characters anywhere (browsers strip some
  // of them from a scheme: "java\nscript:").
  if (!u || /[\u0000-\u0020\u007f-\u009f]/.test(u)) return "";
  return /^(https?:\/\/[^/?#]|mailto:[^/])/i.test(u) ? u : "";
}

function renderMarkdown(text, doc) {
  doc = doc || document;
  const frag = doc.createElement("div");
  frag.className = "md";
  text = String(text || "");
  if (text.length > MD_MAX_CHARS) {
    frag.append(doc.createTextNode(text));
    frag.classList.add("plain");
    return frag;
  }
  mdBlocks(text.replace(/\r\n?/g, "\n").split("\n"), frag, doc, 0);
  return frag;
}

function mdEl(doc, tag, cls) {
  const e = doc.createElement(tag);
  if (cls) e.className = cls;
  return e;
}

const MD_FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)[^`]*$/;
const MD_HEADING = /^ {0,3}(#{1,6})(?:[ \t]|$)/;
const MD_RULE = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const MD_QUOTE = /^ {0,3}> ?(.*)$/;
const MD_ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])([ \t]+(.*))?$/;
const MD_TABLE_SEP = /^ {0,3}\|?[ \t]*:?-+:?[ \t]*(\|[ \t]*:?-+:?[ \t]*)*\|?[ \t]*$/;

function mdStartsBlock(line) {
  return MD_FENCE.test(line) || MD_HEADING.test(line) || MD_RULE.test(line) || MD_QUOTE.test(line) || MD_ITEM.test(line);
}

// mdBlocks renders lines as blocks into parent.
function mdBlocks(lines, parent, doc, depth) {
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (!line.trim()) { i++; continue; }
    let m;
    if ((m = MD_FENCE.exec(line))) {
      const fence = m[1];
      const body = [];
      i++;
      while (i < lines.length && !(lines[i].trim().startsWith(fence) && lines[i].trim().replace(new RegExp("^\\" + fence[0] + "+"), "").trim() === "")) body.push(lines[i++]);
      i++; // the closing fence (or the end)
      const pre = mdEl(doc, "pre", "md-code");
      const code = mdEl(doc, "code");
      if (m[2]) code.dataset.lang = m[2];
      code.append(doc.createTextNode(body.join("\n")));
      pre.append(code);
      parent.append(pre);
      continue;
    }
    if ((m = MD_HEADING.exec(line))) {
      const h = mdEl(doc, "h" + m[1].length, "md-h");
      // The text without a closing run of #s.
      let t = line.slice(m[0].length).trim();
      let k = t.length;
      while (k > 0 && t[k - 1] === "#") k--;
      if (k === 0 || /[ \t]/.test(t[k - 1])) t = t.slice(0, k).trim();
      mdInline(t, h, doc, 0);
      parent.append(h);
      i++;
      continue;
    }
    if (MD_RULE.test(line)) {
      parent.append(mdEl(doc, "hr"));
      i++;
      continue;
    }
    if (MD_QUOTE.test(line)) {
      const inner = [];
      while (i < lines.length && lines[i].trim() && (m = MD_QUOTE.exec(lines[i]) || (inner.length && !mdStartsBlock(lines[i]) ? [null, lines[i]] : null))) {
        inner.push(m[1]);
        i++;
      }
      const q = mdEl(doc, "blockquote");
      if (depth < MD_MAX_DEPTH) mdBlocks(inner, q, doc, depth + 1);
      else q.append(doc.createTextNode(inner.join("\n")));
      parent.append(q);
      continue;
    }
    if ((m = MD_ITEM.exec(line))) {
      i = mdList(lines, i, parent, doc, depth);
      continue;
    }
    if (line.includes("|") && i + 1 < lines.length && MD_TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes("-")) {
      i = mdTable(lines, i, parent, doc);
      continue;
    }
    // A paragraph: lines up to a blank one or another block.
    const para = [line];
    i++;
    while (i < lines.length && lines[i].trim() && !mdStartsBlock(lines[i]) &&
      !(lines[i].includes("|") && i + 1 < lines.length && MD_TABLE_SEP.test(lines[i + 1]))) para.push(lines[i++]);
    const p = mdEl(doc, "p");
    para.forEach((l, k) => {
      if (k > 0) p.append(mdEl(doc, "br"));
      mdInline(l.trim(), p, doc, 0);
    });
    parent.append(p);
  }
}

// mdList renders the list starting at lines[i]; returns the next line.
function mdList(lines, i, parent, doc, depth) {
  const first = MD_ITEM.exec(lines[i]);
  const indent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const list = mdEl(doc, ordered ? "ol" : "ul");
  if (ordered) {
    const start = parseInt(first[2], 10);
    if (start !== 1) list.setAttribute("start", String(start));
  }
  while (i < lines.length) {
    const m = MD_ITEM.exec(lines[i]);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered) break;
    const content = indent + m[2].length + 1;
    const body = [m[4] || ""];
    i++;
    // The item's other lines: indented past its marker, or a lazy
    // continuation of its paragraph; a blank line only inside.
    while (i < lines.length) {
      const l = lines[i];
      const lead = l.length - l.trimStart().length;
      if (!l.trim()) {
        if (i + 1 < lines.length && lines[i + 1].trim() && lines[i + 1].length - lines[i + 1].trimStart().length >= content) {
          body.push("");
          i++;
          continue;
        }
        break;
      }
      if (lead >= content) body.push(l.slice(Math.min(lead, content)));
      else if (lead > indent && MD_ITEM.test(l)) body.push(l.slice(lead));
      else if (!mdStartsBlock(l) && body[body.length - 1].trim()) body.push(l.trim());
      else break;
      i++;
    }
    const li = mdEl(doc, "li");
    if (depth < MD_MAX_DEPTH && (body.length > 1)) mdBlocks(body, li, doc, depth + 1);
    else mdInline(body.join(" ").trim(), li, doc, 0);
    // A single paragraph in an item is shown without its margins.
    if (li.children.length === 1 && li.children[0].tagName === "P") li.children[0].classList.add("tight");
    list.append(li);
    while (i < lines.length && !lines[i].trim() && i + 1 < lines.length && MD_ITEM.test(lines[i + 1]) && MD_ITEM.exec(lines[i + 1])[1].length === indent) i++;
  }
  parent.append(list);
  return i;
}

// mdTable renders a GFM table starting at lines[i]; returns the next line.
function mdTable(lines, i, parent, doc) {
  const cells = (l) => {
    let s = l.trim();
    if (s.startsWith("|")) s = s.slice(1);
    if (s.endsWith("|") && !s.endsWith("\\|")) s = s.slice(0, -1);
    const out = [];
    let cur = "";
    for (let k = 0; k < s.length; k++) {
      if (s[k] === "\\" && s[k + 1] === "|") { cur += "|"; k++; continue; }
      if (s[k] === "|") { out.push(cur.trim()); cur = ""; continue; }
      cur += s[k];
    }
    out.push(cur.trim());
    return out;
  };
  const head = cells(lines[i]);
  const align = cells(lines[i + 1]).map((c) => c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : "");
  const table = mdEl(doc, "table", "md-table");
  const row = (vals, tag) => {
    const tr = mdEl(doc, "tr");
    head.forEach((_, k) => {
      const c = mdEl(doc, tag);
      if (align[k]) c.className = "align-" + align[k];
      mdInline(vals[k] || "", c, doc, 0);
      tr.append(c);
    });
    return tr;
  };
  const thead = mdEl(doc, "thead");
  thead.append(row(head, "th"));
  const tbody = mdEl(doc, "tbody");
  i += 2;
  while (i < lines.length && lines[i].trim() && lines[i].includes("|")) tbody.append(row(cells(lines[i++]), "td"));
  table.append(thead, tbody);
  parent.append(table);
  return i;
}

const MD_PUNCT = /[!-/:-@[-`{-~\s]/;
const MD_URL = /https?:\/\/[^\s<>"]+/iy; // sticky: matched at lastIndex

// mdInline renders inline markdown of s into parent.
function mdInline(s, parent, doc, depth) {
  let text = "";
  const flush = () => {
    if (text) parent.append(doc.createTextNode(text));
    text = "";
  };
  const isSpace = (c) => c === undefined || /\s/.test(c);
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (c === "\\" && i + 1 < s.length && /[!-/:-@[-`{-~]/.test(s[i + 1])) {
      text += s[i + 1];
      i += 2;
      continue;
    }
    if (c === "`") {
      let n = 1;
      while (s[i + n] === "`") n++;
      const fence = "`".repeat(n);
      const end = s.indexOf(fence, i + n);
      if (end > 0 && end - i < MD_SCAN && s[end + n] !== "`") {
        flush();
        const code = mdEl(doc, "code");
        let body = s.slice(i + n, end);
        if (body.length > 2 && body.startsWith(" ") && body.endsWith(" ")) body = body.slice(1, -1);
        code.append(doc.createTextNode(body));
        parent.append(code);
        i = end + n;
        continue;
      }
      text += fence;
      i += n;
      continue;
    }
    if ((c === "*" || c === "_" || c === "~") && depth < MD_MAX_DEPTH) {
      let n = 1;
      while (s[i + n] === c) n++;
      const run = Math.min(n, c === "~" ? 2 : 3);
      const prev = s[i - 1];
      const next = s[i + n];
      // Opens: not before a space; "_" not inside a word.
      const opens = !isSpace(next) && (c !== "_" || prev === undefined || MD_PUNCT.test(prev)) && (c !== "~" || n === 2);
      if (opens) {
        const want = run === 3 ? 3 : run;
        const close = mdCloser(s, i + n, c, want);
        if (close > 0) {
          flush();
          const inner = s.slice(i + n, close);
          let node;
          if (c === "~") node = mdEl(doc, "del");
          else if (want === 3) { node = mdEl(doc, "strong"); const em = mdEl(doc, "em"); mdInline(inner, em, doc, depth + 1); node.append(em); }
          else node = mdEl(doc, want === 2 ? "strong" : "em");
          if (want !== 3 || c === "~") mdInline(inner, node, doc, depth + 1);
          parent.append(node);
          i = close + want;
          continue;
        }
      }
      text += s.slice(i, i + n);
      i += n;
      continue;
    }
    if (c === "[" || (c === "!" && s[i + 1] === "[")) {
      const img = c === "!";
      const link = mdLink(s, img ? i + 1 : i);
      if (link) {
        flush();
        const href = mdSafeHref(link.url);
        let node;
        if (img) {
          // Never loaded: the alt text, linked to the image when safe.
          node = href ? mdEl(doc, "a", "md-image") : mdEl(doc, "span", "md-image md-badlink");
          node.append(doc.createTextNode("image: " + (link.label || link.url)));
        } else if (href) {
          node = mdEl(doc, "a");
          if (depth < MD_MAX_DEPTH) mdInline(link.label, node, doc, depth + 1);
          else node.append(doc.createTextNode(link.label));
        } else {
          node = mdEl(doc, "span", "md-badlink");
          node.append(doc.createTextNode(link.label));
          node.title = "link not followed: " + link.url.slice(0, 200);
        }
        if (href) {
          node.href = href;
          node.rel = "noopener noreferrer nofollow";
          node.target = "_blank";
        }
        parent.append(node);
        i = link.end;
        continue;
      }
    }
    if (c === "<") {
      const end = s.indexOf(">", i);
      const inner = end > 0 ? s.slice(i + 1, end) : "";
      if (end > 0 && mdSafeHref(inner) && !/\s/.test(inner)) {
        flush();
        parent.append(mdAnchor(doc, inner, inner));
        i = end + 1;
        continue;
      }
    }
    if ((c === "h" || c === "H") && (i === 0 || /[\s(]/.test(s[i - 1]))) {
      MD_URL.lastIndex = i;
      const m = MD_URL.exec(s);
      if (m) {
        // Trailing punctuation is the sentence's; a ")" only when
        // unbalanced.
        let url = m[0];
        let open = url.split("(").length - 1;
        let shut = url.split(")").length - 1;
        while (/[.,:;!?)\]'"]$/.test(url) && !(url.endsWith(")") && shut <= open)) {
          if (url.endsWith(")")) shut--;
          url = url.slice(0, -1);
        }
        if (mdSafeHref(url)) {
          flush();
          parent.append(mdAnchor(doc, url, url));
          i += url.length;
          continue;
        }
      }
    }
    text += c;
    i++;
  }
  flush();
}

function mdAnchor(doc, href, label) {
  const a = mdEl(doc, "a");
  a.append(doc.createTextNode(label));
  a.href = href;
  a.rel = "noopener noreferrer nofollow";
  a.target = "_blank";
  return a;
}

// mdCloser finds the closing run of n c's for an opener before from.
function mdCloser(s, from, c, n) {
  const run = c.repeat(n);
  let k = from;
  while ((k = s.indexOf(run, k)) > from && k - from < MD_SCAN) {
    const prev = s[k - 1];
    const after = s[k + n];
    const closes = !/\s/.test(prev) && prev !== c && (c !== "_" || after === undefined || MD_PUNCT.test(after)) && after !== c;
    if (closes) return k;
    k += n;
  }
  return -1;
}

// mdLink parses [label](url "title") at s[i] === "[".
function mdLink(s, i) {
  let depth = 0;
  let k = i;
  const stop = Math.min(s.length, i + MD_SCAN);
  for (; k < stop; k++) {
    if (s[k] === "\\") { k++; continue; }
    if (s[k] === "[") depth++;
    else if (s[k] === "]" && --depth === 0) break;
  }
  if (k >= stop || s[k + 1] !== "(") return null;
  const label = s.slice(i + 1, k);
  let j = k + 2;
  let parens = 1;
  let url = "";
  const urlStop = Math.min(s.length, j + MD_SCAN);
  for (; j < urlStop; j++) {
    if (s[j] === "(") parens++;
    else if (s[j] === ")" && --parens === 0) break;
    url += s[j];
  }
  if (j >= urlStop) return null;
  url = url.trim().replace(/\s+("[^"]*"|'[^']*')$/, "");
  if (url.startsWith("<") && url.endsWith(">")) url = url.slice(1, -1);
  return { label, url, end: j + 1 };
}
