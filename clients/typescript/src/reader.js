// The readers' side of the protocol, shared by the NATS client (index.js)
// and the console client (console.js), without any NATS import: decoding an
// envelope, the rules of docs/protocol.md §4 "Order and guarantees" (a
// Follower), the transcript reducer, and the envelope's line as `submit
// follow --json` prints it.
import { DecodeError, GapError } from "./errors.js";
import { EVENT_TYPES } from "./protocol.js";

/** The envelope's text as received, kept on decoded envelopes under this symbol (formatEnvelope uses it). */
export const RAW = Symbol.for("agentfleet.raw");
/** Set on decoded envelopes whose event is the last member, after scalars only. */
const EVENT_LAST = Symbol("eventLast");

/** @type {Set<string>} */
const known = new Set(EVENT_TYPES);

/** Whether this version of the package knows an event type. @param {string} type */
export const isKnownEventType = (type) => known.has(type);

/**
 * Decodes an envelope from its JSON text. Throws a DecodeError for JSON
 * that is not an envelope (as the Go client's DecodeEnvelope: an event
 * with a type is required).
 * @param {string} text
 * @param {string} run the run being read, for the error
 * @param {number} [streamSeq]
 */
export function decodeEnvelope(text, run, streamSeq = 0) {
  let env;
  try {
    env = JSON.parse(text);
  } catch (err) {
    throw new DecodeError(run, `envelope: ${/** @type {Error} */ (err).message}`);
  }
  if (env === null || typeof env !== "object" || Array.isArray(env)) throw new DecodeError(run, "envelope: not an object");
  const ev = env.event;
  if (ev === undefined || ev === null) throw new DecodeError(run, "envelope: no event");
  if (typeof ev !== "object" || Array.isArray(ev)) throw new DecodeError(run, "envelope event: not an object");
  if (typeof ev.type !== "string" || ev.type === "") throw new DecodeError(run, "envelope event: no type");
  for (const f of ["seq", "attempt", "ts"]) {
    const v = env[f];
    if (v !== undefined && (typeof v !== "number" || !Number.isInteger(v))) throw new DecodeError(run, `envelope: ${f} is not an integer`);
  }
  let last = "";
  let scalars = true;
  for (const k in env) {
    if (last === "event") scalars = false; // a member after the event
    last = k;
    if (k !== "event" && env[k] !== null && typeof env[k] === "object") scalars = false;
    if (k.charCodeAt(0) <= 0x39) scalars = false; // a key like "0" is listed first, wherever it was
  }
  env.seq ??= 0;
  env.attempt ??= 0;
  env.streamSeq = streamSeq;
  env[RAW] = text;
  env[EVENT_LAST] = scalars && last === "event";
  return env;
}

/**
 * The rules a reader applies to a run's envelopes in stream order
 * (docs/protocol.md §4): envelopes of an attempt older than the newest one
 * seen are skipped (a stalled worker's late events), so is an envelope
 * whose seq is not above the last taken of its attempt (a stored copy), and
 * a hole in an attempt's seq is reported. The run ends at its first
 * run_finished. The state is a cursor: a follower resumed with it goes on
 * as if it had never stopped.
 */
export class Follower {
  /** @param {string} run @param {{from?: number, attempt?: number, seq?: number, finished?: boolean}} [cursor] */
  constructor(run, cursor = {}) {
    this.run = run;
    /** The stream sequence to read next. */
    this.from = Math.max(1, cursor.from ?? 1);
    /** The newest attempt taken. */
    this.attempt = cursor.attempt ?? 0;
    /** The last seq taken of that attempt. */
    this.seq = cursor.seq ?? 0;
    /** The run's run_finished was taken (by this follower or the one whose cursor it resumes). */
    this.finished = cursor.finished === true;
    // Started in the middle of the stream without the state: the first
    // envelope taken cannot tell a gap.
    this.blind = this.from > 1 && cursor.attempt === undefined;
  }

  /**
   * Where to resume: pass it as follow's options. Once the run's
   * run_finished was taken, from is past it and finished is true: a follow
   * resumed from it has nothing more to read and ends at once.
   * @returns {{from: number, attempt: number, seq: number, finished?: true}}
   */
  cursor() {
    return this.finished ? { from: this.from, attempt: this.attempt, seq: this.seq, finished: true } : { from: this.from, attempt: this.attempt, seq: this.seq };
  }

  /** A message at this stream sequence was read (taken or not). @param {number} streamSeq */
  read(streamSeq) {
    if (streamSeq >= this.from) this.from = streamSeq + 1;
  }

  /**
   * Applies the rules to a decoded envelope.
   * @param {{attempt: number, seq: number, event: {type: string}}} env
   * @returns {{take: boolean, gap?: GapError}}
   */
  accept(env) {
    if (this.finished || env.attempt < this.attempt) return { take: false };
    let gap;
    if (this.blind) {
      this.blind = false;
      this.attempt = env.attempt;
    } else if (env.attempt > this.attempt) {
      this.attempt = env.attempt;
      if (env.seq > 1) gap = new GapError(this.run, env.attempt, 1, env.seq);
    } else if (env.seq <= this.seq) {
      return { take: false }; // a copy
    } else if (env.seq !== this.seq + 1) {
      gap = new GapError(this.run, this.attempt, this.seq + 1, env.seq);
    }
    this.seq = env.seq;
    if (env.event.type === "run_finished") this.finished = true;
    return gap ? { take: true, gap } : { take: true };
  }
}

// ---- submit follow --json ----------------------------------------------

const hex = "0123456789abcdef";

/**
 * A string as Go's encoding/json writes it (HTML-safe: <, > and & escaped,
 * as are U+2028 and U+2029).
 * @param {string} s
 */
export function goString(s) {
  let out = '"';
  let start = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let esc;
    if (c < 0x20) {
      esc = c === 8 ? "\\b" : c === 12 ? "\\f" : c === 10 ? "\\n" : c === 13 ? "\\r" : c === 9 ? "\\t" : "\\u00" + hex[c >> 4] + hex[c & 15];
    } else if (c === 0x22) esc = '\\"';
    else if (c === 0x5c) esc = "\\\\";
    else if (c === 0x3c) esc = "\\u003c";
    else if (c === 0x3e) esc = "\\u003e";
    else if (c === 0x26) esc = "\\u0026";
    else if (c === 0x2028) esc = "\\u2028";
    else if (c === 0x2029) esc = "\\u2029";
    else if (c >= 0xd800 && c <= 0xdfff) {
      const lead = c <= 0xdbff && i + 1 < s.length && s.charCodeAt(i + 1) >= 0xdc00 && s.charCodeAt(i + 1) <= 0xdfff;
      if (lead) {
        i++;
        continue;
      }
      esc = "\\ufffd"; // a lone surrogate: Go writes invalid UTF-8 so
    } else continue;
    out += s.slice(start, i) + esc;
    start = i + 1;
  }
  return out + s.slice(start) + '"';
}

const jsonTokens = /("[^"\\]*(?:\\.[^"\\]*)*")|[ \t\n\r]+/g;
const htmlUnsafe = /[<>&\u2028\u2029]/g;
/** @param {string} c */
const htmlEscape = (c) => (c === "<" ? "\\u003c" : c === ">" ? "\\u003e" : c === "&" ? "\\u0026" : c === "\u2028" ? "\\u2028" : "\\u2029");

/**
 * JSON text compacted as Go's json.Compact with HTML escaping does (what
 * its encoder does to a json.RawMessage): white space between tokens goes,
 * <, >, &, U+2028 and U+2029 are escaped (in JSON text they occur only
 * inside strings, unescaped), everything else is kept as is.
 * @param {string} s
 */
export function goCompact(s) {
  if (/[ \t\n\r]/.test(s)) s = s.replace(jsonTokens, "$1");
  htmlUnsafe.lastIndex = 0;
  return htmlUnsafe.test(s) ? s.replace(htmlUnsafe, htmlEscape) : s;
}

/** @param {string} s @param {number} i */
function skipSpace(s, i) {
  for (;;) {
    const c = s.charCodeAt(i);
    if (c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d) i++;
    else return i;
  }
}

/** @param {string} s @param {number} i at a value's first character: returns the index after it */
function skipValue(s, i) {
  let depth = 0;
  for (; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c === 0x22) {
      for (i++; i < s.length; i++) {
        const d = s.charCodeAt(i);
        if (d === 0x5c) i++;
        else if (d === 0x22) break;
      }
      if (depth === 0) return i + 1;
    } else if (c === 0x7b || c === 0x5b) depth++;
    else if (c === 0x7d || c === 0x5d) {
      depth--;
      if (depth === 0) return i + 1;
      if (depth < 0) return i;
    } else if (depth === 0 && (c === 0x2c || c === 0x20 || c === 0x09 || c === 0x0a || c === 0x0d)) return i;
  }
  return i;
}

/**
 * The text of a top-level member's value in an object's JSON text (the
 * last one, when a key is there twice: what a decoder keeps).
 * @param {string} s @param {string} key
 */
export function rawMember(s, key) {
  let i = skipSpace(s, 0);
  if (s.charCodeAt(i) !== 0x7b) return undefined;
  let found;
  i = skipSpace(s, i + 1);
  while (i < s.length && s.charCodeAt(i) !== 0x7d) {
    const kEnd = skipValue(s, i);
    const k = JSON.parse(s.slice(i, kEnd));
    i = skipSpace(s, kEnd);
    i = skipSpace(s, i + 1); // the colon
    const vEnd = skipValue(s, i);
    if (k === key) found = s.slice(i, vEnd);
    i = skipSpace(s, vEnd);
    if (s.charCodeAt(i) === 0x2c) i = skipSpace(s, i + 1);
  }
  return found;
}

/**
 * The envelope as one line of `submit follow --json` (without the newline):
 * the Go client decodes it and encodes it again, its fields in a fixed order
 * and its event as received, compacted and HTML-escaped. Byte for byte the
 * same for an envelope received from the stream (it keeps its text).
 * @param {{run?: string, seq?: number, attempt?: number, worker?: string, ts?: number, controlSeq?: number, interrupted?: boolean, event: unknown, [RAW]?: string, [EVENT_LAST]?: boolean}} env
 */
export function formatEnvelope(env) {
  const raw = env[RAW];
  let event;
  if (raw !== undefined) {
    const i = env[EVENT_LAST] ? raw.indexOf(',"event":') : -1;
    // The event is the last member and every member before it a scalar
    // (the worker's envelopes): its text runs from there to the closing
    // brace; a quote after a comma cannot be inside a string.
    event = i > 0 && raw.indexOf(',"event":', i + 9) < 0 ? raw.slice(i + 9, raw.lastIndexOf("}")) : rawMember(raw, "event");
  }
  let out = `{"run":${goString(env.run ?? "")},"seq":${env.seq ?? 0},"attempt":${env.attempt ?? 0},"worker":${goString(env.worker ?? "")},"ts":${env.ts ?? 0}`;
  if (env.controlSeq) out += `,"controlSeq":${env.controlSeq}`;
  if (env.interrupted === true) out += `,"interrupted":true`;
  return out + `,"event":${event !== undefined ? goCompact(event) : goCompact(JSON.stringify(env.event))}}`;
}

// ---- transcript -----------------------------------------------------------

/**
 * Folds a run's envelopes (in stream order, as follow yields them) into its
 * transcript: the messages, the assistant message being streamed, and the
 * fleet events (docs/protocol.md §4; the Go client's bus.Transcript).
 */
export class Transcript {
  constructor() {
    /** @type {any[]} */
    this.messages = [];
    /** @type {any} */
    this.started = null;
    /** @type {any} */
    this.resumed = null;
    /**
     * transcript_restored (since 1.9): the run whose first `messages`
     * messages this run continues; they are not among `messages` (the
     * continued run's snapshot holds them). null without continueFrom.
     * @type {any}
     */
    this.restored = null;
    /** @type {any} */
    this.finished = null;
    /**
     * The successful compaction_end events (since 1.10), in order over
     * every attempt: from the last on, the model was sent its summary and
     * the messages from its firstKeptIndex (docs/protocol.md §16).
     * @type {any[]}
     */
    this.compactions = [];
    this.attempt = 0;
    this.lastSeq = 0;
    /** @type {any} the assistant message being streamed */
    this.partial = null;
    /** @type {any[]} */
    this.prev = [];
    /**
     * The usage of model calls of earlier attempts that the messages do not
     * have (run_resumed's cutOffUsage, since 1.8): charged to the run beyond
     * its messages' usage; null when none.
     * @type {any}
     */
    this.cutOffUsage = null;
    /** @type {any} */
    this.prevCutOff = null;
  }

  /** @param {{attempt: number, seq: number, event: any}} env */
  apply(env) {
    if (env.attempt < this.attempt || this.finished) return;
    if (env.attempt === this.attempt && this.attempt !== 0 && env.seq !== 0 && env.seq <= this.lastSeq) return;
    if (env.attempt > this.attempt) {
      // A new attempt starts over unless run_resumed says otherwise; one
      // that never published run_resumed died before deciding anything.
      if (this.attempt <= 1 || this.resumed) {
        this.prev = this.messages;
        this.prevCutOff = this.cutOffUsage;
      }
      this.messages = [];
      this.cutOffUsage = null;
      this.attempt = env.attempt;
      this.partial = null;
      this.resumed = null;
    }
    this.lastSeq = env.seq;
    const ev = env.event;
    switch (ev.type) {
      case "run_started":
        this.started = ev;
        break;
      case "run_resumed": {
        this.resumed = ev;
        const n = Math.min(Math.max(ev.messagesRestored ?? 0, 0), this.prev.length);
        this.messages = [...this.prev.slice(0, n), ...this.messages];
        if (ev.cutOffUsage) this.cutOffUsage = ev.cutOffUsage;
        break;
      }
      case "transcript_restored":
        this.restored = ev;
        break;
      case "compaction_end":
        if (!ev.error) this.compactions.push(ev);
        break;
      case "run_finished":
        this.finished = ev;
        this.partial = null;
        break;
      case "message_start":
        if (ev.message?.role === "assistant") this.partial = { ...ev.message, content: [] };
        break;
      case "message_update":
        if (this.partial && ev.assistantMessageEvent) applyStreamEvent(this.partial, ev.assistantMessageEvent);
        break;
      case "message_end":
        if (ev.message) this.messages.push(ev.message);
        this.partial = null;
        break;
    }
  }

  /** The text of the last assistant message. */
  finalText() {
    for (let i = this.messages.length - 1; i >= 0; i--) {
      const m = this.messages[i];
      if (m.role === "assistant") return textOf(m);
    }
    return "";
  }
}

/** The text blocks of a message, joined. @param {any} m */
export function textOf(m) {
  if (typeof m.content === "string") return m.content;
  return (m.content ?? [])
    .filter((/** @type {any} */ c) => c.type === "text")
    .map((/** @type {any} */ c) => c.text ?? "")
    .join("");
}

/**
 * Folds one assistant stream step into a partial message (docs/protocol.md
 * §4, "Rebuilding the partial assistant message"); a step whose
 * contentIndex does not fit is ignored.
 * @param {any} msg @param {any} ev
 */
export function applyStreamEvent(msg, ev) {
  const i = ev.contentIndex;
  const blocks = msg.content;
  /** @param {any} c */
  const put = (c) => {
    if (i === blocks.length) blocks.push(c);
    else if (i >= 0 && i < blocks.length) blocks[i] = c;
  };
  /** @param {string} type */
  const at = (type) => (i >= 0 && i < blocks.length && blocks[i].type === type ? blocks[i] : null);
  let c;
  switch (ev.type) {
    case "text_start":
      put(ev.signature ? { type: "text", text: "", textSignature: ev.signature } : { type: "text", text: "" });
      break;
    case "thinking_start":
      put(ev.signature ? { type: "thinking", thinking: "", thinkingSignature: ev.signature } : { type: "thinking", thinking: "" });
      break;
    case "toolcall_start":
      put({ type: "toolCall", id: ev.id, name: ev.name, arguments: {} });
      break;
    case "text_delta":
      if ((c = at("text"))) c.text += ev.delta ?? "";
      break;
    case "thinking_delta":
      if ((c = at("thinking"))) c.thinking += ev.delta ?? "";
      break;
    case "text_end":
      if ((c = at("text"))) {
        c.text = ev.content ?? "";
        if (ev.signature) c.textSignature = ev.signature;
      }
      break;
    case "thinking_end":
      if ((c = at("thinking"))) {
        c.thinking = ev.content ?? "";
        if (ev.signature) c.thinkingSignature = ev.signature;
      }
      break;
    case "toolcall_end":
      if (at("toolCall") && ev.toolCall) blocks[i] = ev.toolCall;
      break;
  }
}

/**
 * The gated calls of a run that wait for an answer, from its envelopes in
 * stream order (the Go client's PendingCalls): a tool_approval_requested
 * with neither tool_approval_resolved nor tool_execution_end (in any
 * attempt); none once the run finished.
 * @param {Iterable<any>} envs
 */
export function pendingCalls(envs) {
  /** @type {any[]} */
  let out = [];
  /** @type {Map<number, number>} */
  const last = new Map();
  for (const env of envs) {
    if (env.seq !== 0 && env.seq <= (last.get(env.attempt) ?? 0)) continue;
    last.set(env.attempt, env.seq);
    const ev = env.event;
    if (ev.type === "run_finished") return [];
    if (ev.type !== "tool_approval_requested" && ev.type !== "tool_approval_resolved" && ev.type !== "tool_execution_end") continue;
    if (!ev.toolCallId) continue;
    if (ev.type !== "tool_approval_requested") {
      const i = out.findIndex((p) => p.toolCallId === ev.toolCallId);
      if (i >= 0) out = [...out.slice(0, i), ...out.slice(i + 1)];
      continue;
    }
    /** @type {any} */
    const p = { run: env.run, toolCallId: ev.toolCallId, toolName: ev.toolName ?? "", args: ev.args, requestedAt: new Date(env.ts), waitingSince: new Date(env.ts) };
    if (ev.expiresAt > 0) p.expiresAt = new Date(ev.expiresAt);
    out.push(p);
  }
  return out;
}
