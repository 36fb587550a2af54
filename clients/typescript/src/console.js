// @agentfleet/client/console: follow and control runs through an agentfleet
// console's HTTP API (docs/console.md) with nothing but fetch, so that a web
// page shows a run live without NATS credentials. It runs in browsers and in
// Node (18+); it imports no NATS code.
//
// The console's API is same-origin: it sends no CORS headers, and its
// control POSTs need the CSRF token of GET /api/session and an Origin equal
// to the console's own. A page served by another origin reaches it through
// a reverse proxy that serves both (examples/serve.js is one).
import { AgentfleetError, ConsoleError, InvalidArgumentError, RunFinishedError, RunNotFoundError } from "./errors.js";
import { checkControlKey, checkQueue, checkRunId, newRunId } from "./names.js";
import { decodeEnvelope, Follower, isKnownEventType } from "./reader.js";

export * from "./errors.js";
export { checkControlKey, checkQueue, checkRunId, newRunId } from "./names.js";
export { applyStreamEvent, decodeEnvelope, Follower, formatEnvelope, isKnownEventType, pendingCalls, RAW, textOf, Transcript } from "./reader.js";
export { EVENT_TYPES, PROTOCOL_VERSION, STREAM_EVENT_TYPES } from "./protocol.js";

const sleep = (/** @type {number} */ ms, /** @type {AbortSignal} */ signal) =>
  new Promise((res) => {
    const t = setTimeout(res, ms);
    signal.addEventListener("abort", () => (clearTimeout(t), res(undefined)), { once: true });
  });

/**
 * Server-Sent Events read from a fetch response body: {event, id, data}
 * for each event (comments and retry fields are dropped).
 * @param {ReadableStream<Uint8Array>} body
 */
export async function* readSSE(body) {
  const reader = body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  let event = "";
  let id = "";
  /** @type {string[]} */
  let data = [];
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buf += dec.decode(value, { stream: true });
      let nl;
      while ((nl = buf.indexOf("\n")) >= 0) {
        let line = buf.slice(0, nl);
        buf = buf.slice(nl + 1);
        if (line.endsWith("\r")) line = line.slice(0, -1);
        if (line === "") {
          if (data.length || event) yield { event: event || "message", id, data: data.join("\n") };
          event = "";
          data = [];
          continue;
        }
        if (line.startsWith(":")) continue;
        const colon = line.indexOf(":");
        const field = colon < 0 ? line : line.slice(0, colon);
        let value = colon < 0 ? "" : line.slice(colon + 1);
        if (value.startsWith(" ")) value = value.slice(1);
        if (field === "event") event = value;
        else if (field === "data") data.push(value);
        else if (field === "id") id = value;
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

/** Follows and controls runs through a console. */
export class ConsoleClient {
  /**
   * @param {import("./console.js").ConsoleClientOptions} [opts]
   */
  constructor(opts = {}) {
    this.baseUrl = (opts.baseUrl ?? "").replace(/\/+$/, "");
    this.token = opts.token;
    this.fetch = opts.fetch ?? globalThis.fetch.bind(globalThis);
    this.credentials = opts.credentials ?? "same-origin";
    this.headers = opts.headers ?? {};
    /** How long a follow of a run the console does not know waits before it looks again (then a RunNotFoundError). */
    this.followStallMs = opts.followStallMs ?? 5000;
    /** @type {Promise<any> | null} */
    this._session = null;
  }

  /** @param {Record<string, string>} [extra] */
  requestHeaders(extra = {}) {
    /** @type {Record<string, string>} */
    const h = { ...this.headers, ...extra };
    if (this.token) h.Authorization = `Bearer ${this.token}`;
    return h;
  }

  /** @param {string} path @param {RequestInit} [init] */
  async request(path, init = {}) {
    let res;
    try {
      res = await this.fetch(this.baseUrl + path, { credentials: this.credentials, ...init });
    } catch (err) {
      if (/** @type {any} */ (err)?.name === "AbortError") throw err;
      throw new AgentfleetError("console_unreachable", `cannot reach the console at ${this.baseUrl || "this origin"}: ${/** @type {Error} */ (err).message}`, { cause: err });
    }
    return res;
  }

  /** @param {Response} res @param {string} run @param {string} what */
  async error(res, run, what) {
    let text = "";
    try {
      const b = await res.json();
      text = b.error ?? "";
    } catch {
      // not JSON
    }
    text ||= `${res.status} ${res.statusText}`;
    if (res.status === 404 && run) return Object.assign(new RunNotFoundError(run), { status: 404 });
    // An approval's 409 is its call no longer waiting, the run may go on.
    if (res.status === 409 && what !== "approval answer") {
      const e = new RunFinishedError(run, "finished", what);
      return Object.assign(e, { message: `${text}: the ${what} was not sent`, status: 409 });
    }
    return new ConsoleError(res.status, `${what}${run ? " " + run : ""}: the console answered ${res.status}: ${text}`);
  }

  /** The console's session: {user, allowControl, csrf, prefix}; cached. @param {boolean} [fresh] */
  session(fresh = false) {
    if (fresh || !this._session) {
      this._session = (async () => {
        const res = await this.request("/api/session", { headers: this.requestHeaders() });
        if (!res.ok) throw await this.error(res, "", "session");
        return res.json();
      })();
      this._session.catch(() => (this._session = null));
    }
    return this._session;
  }

  /** A run's record (or queued). @param {string} run */
  async status(run) {
    checkRunId(run);
    const res = await this.request(`/api/runs/${run}`, { headers: this.requestHeaders() });
    if (!res.ok) throw await this.error(res, run, "status");
    return res.json();
  }

  /**
   * The runs the console knows, newest first: {version, runs, total, ready}.
   * With after (a version), waits up to 25 s for a change.
   * @param {{state?: string, queue?: string, q?: string, limit?: number, after?: number}} [o]
   */
  async list(o = {}) {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(o)) if (v !== undefined && v !== "") p.set(k, String(v));
    const res = await this.request(`/api/runs${p.size ? "?" + p : ""}`, { headers: this.requestHeaders() });
    if (!res.ok) throw await this.error(res, "", "list");
    return res.json();
  }

  /**
   * A run's envelopes through the console's event stream, from the start
   * (or a cursor), live, to its run_finished; reconnects after the stream
   * breaks, from the next stream sequence, with the readers' rules of
   * docs/protocol.md §4 applied.
   * @param {string} run @param {import("./console.js").ConsoleFollowOptions} [opts]
   */
  follow(run, opts = {}) {
    return new ConsoleFollowStream(this, run, opts);
  }

  /**
   * A control POST: the CSRF token from the session (fetched again once if
   * the console restarted and refuses it), an Idempotency-Key (a fresh one
   * unless given) so that a retry after a lost answer or a 502/503/504
   * reaches the run once; retried twice, after 250 and 500 ms.
   * @param {string} path @param {object} body @param {string} run @param {string} what @param {string} [key]
   */
  async post(path, body, run, what, key) {
    if (key !== undefined) checkControlKey(key);
    const idem = key ?? (path.endsWith("/api/runs") ? undefined : `ts-${newRunId()}`);
    let csrfRetried = false;
    for (let attempt = 0; ; attempt++) {
      const s = await this.session();
      /** @type {Record<string, string>} */
      const extra = { "Content-Type": "application/json", "X-CSRF-Token": s.csrf };
      if (idem) extra["Idempotency-Key"] = idem;
      let res;
      try {
        res = await this.request(path, { method: "POST", headers: this.requestHeaders(extra), body: JSON.stringify(body) });
      } catch (err) {
        if (attempt < 2 && idem) {
          await new Promise((r) => setTimeout(r, 250 << attempt));
          continue;
        }
        throw err;
      }
      if (res.ok) return res.json();
      if (res.status === 403 && !csrfRetried) {
        const text = await res.clone().text();
        if (text.includes("X-CSRF-Token")) {
          csrfRetried = true;
          await this.session(true);
          attempt--;
          continue;
        }
      }
      if ((res.status === 502 || res.status === 503 || res.status === 504) && attempt < 2 && idem) {
        await new Promise((r) => setTimeout(r, 250 << attempt));
        continue;
      }
      throw await this.error(res, run, what);
    }
  }

  /**
   * Submits a run through the console (it needs --allow-control):
   * {id, queue, seq, duplicate}.
   * @param {import("../types/protocol.js").RunRequest} request @param {{queue?: string}} [opts]
   */
  submit(request, opts = {}) {
    if (opts.queue) checkQueue(opts.queue);
    const body = opts.queue ? { ...request, queue: opts.queue } : request;
    return this.post("/api/runs", body, request.id ?? "", "submit");
  }

  /**
   * @param {string} run @param {"steer" | "followup"} action @param {string} text @param {string} what @param {string} [key]
   */
  async text(run, action, text, what, key) {
    checkRunId(run);
    if (typeof text !== "string" || text.trim() === "") throw new InvalidArgumentError(`empty ${what} text`);
    const r = await this.post(`/api/runs/${run}/${action}`, { text }, run, what, key);
    return { seq: r.controlSeq };
  }

  /** Steers a run. @param {string} run @param {string} text @param {{key?: string}} [opts] */
  steer(run, text, opts = {}) {
    return this.text(run, "steer", text, "steering", opts.key);
  }

  /** Queues a follow-up. @param {string} run @param {string} text @param {{key?: string}} [opts] */
  followUp(run, text, opts = {}) {
    return this.text(run, "followup", text, "follow-up", opts.key);
  }

  /** Aborts a run. @param {string} run @param {{reason?: string, key?: string}} [opts] */
  async abort(run, opts = {}) {
    checkRunId(run);
    const r = await this.post(`/api/runs/${run}/abort`, opts.reason ? { reason: opts.reason } : {}, run, "abort", opts.key);
    return { seq: r.controlSeq };
  }

  /**
   * Approves a gated tool call through the console (docs/console.md:
   * POST /api/runs/{id}/approve with the protocol's answer body, §13:
   * toolCallId, decision, arguments, reason; the console sets `by`). A
   * call that no longer waits is a 409, an edit its tool's schema refuses
   * a 422, both ConsoleErrors.
   * @param {string} run @param {string} toolCallId @param {{reason?: string, arguments?: Record<string, unknown>, key?: string}} [opts]
   */
  async approve(run, toolCallId, opts = {}) {
    return this.answer(run, toolCallId, "approve", opts);
  }

  /** Denies a gated tool call through the console (see approve). @param {string} run @param {string} toolCallId @param {{reason?: string, key?: string}} [opts] */
  async deny(run, toolCallId, opts = {}) {
    return this.answer(run, toolCallId, "deny", { reason: opts.reason, key: opts.key });
  }

  /** @param {string} run @param {string} toolCallId @param {"approve"|"deny"} decision @param {{reason?: string, arguments?: Record<string, unknown>, key?: string}} opts */
  async answer(run, toolCallId, decision, opts) {
    checkRunId(run);
    const body = { toolCallId, decision, ...(opts.reason ? { reason: opts.reason } : {}), ...(opts.arguments ? { arguments: opts.arguments } : {}) };
    const r = await this.post(`/api/runs/${run}/approve`, body, run, "approval answer", opts.key);
    return { seq: r.controlSeq };
  }
}

/** One follow of a run through a console: iterate it once with for await. */
export class ConsoleFollowStream {
  /** @param {ConsoleClient} client @param {string} run @param {import("./console.js").ConsoleFollowOptions} opts */
  constructor(client, run, opts) {
    this.client = client;
    this.run = run;
    this.opts = opts;
    this.follower = new Follower(run, opts);
    this.abort = new AbortController();
    /** @type {Error[]} */
    this.warnings = [];
    /** Times the event stream was opened (1 + reconnects). */
    this.connects = 0;
  }

  cursor() {
    return this.follower.cursor();
  }

  close() {
    this.abort.abort();
  }

  [Symbol.asyncIterator]() {
    return this.iterate();
  }

  /** @param {Error} w */
  warn(w) {
    this.warnings.push(w);
    this.opts.onWarning?.(w);
  }

  async *iterate() {
    const { client, run, follower: f, opts } = this;
    checkRunId(run);
    const signal = this.abort.signal;
    const outer = opts.signal;
    outer?.throwIfAborted(); // before anything is asked, as the NATS client's follow
    const onAbort = () => this.abort.abort(outer?.reason);
    outer?.addEventListener("abort", onAbort, { once: true });
    try {
      // A run that does not exist would be waited for forever: the console
      // must know it (its request or record), now or one stall interval
      // later (one look would end a follower started just before the run's
      // submitter published; docs/protocol.md §4, "A run that does not exist").
      if (opts.mustExist !== false && f.from === 1 && f.attempt === 0) {
        try {
          await client.status(run);
        } catch (err) {
          if (!(err instanceof RunNotFoundError)) throw err;
          await sleep(client.followStallMs, signal);
          if (!signal.aborted) await client.status(run);
        }
      }
      let pause = 250;
      while (!f.finished && !signal.aborted) {
        const path = `/api/runs/${run}/events${f.from > 1 ? `?after=${f.from - 1}` : ""}`;
        let res;
        try {
          res = await client.request(path, { headers: client.requestHeaders({ Accept: "text/event-stream" }), signal, cache: "no-store" });
        } catch (err) {
          if (signal.aborted) break;
          await sleep(pause, signal); // the console away: try again
          pause = Math.min(pause * 2, 5000);
          continue;
        }
        if (!res.ok) {
          const err = await client.error(res, run, "follow");
          if (res.status < 500) throw err;
          await sleep(pause, signal);
          pause = Math.min(pause * 2, 5000);
          continue;
        }
        this.connects++;
        try {
          for await (const ev of readSSE(/** @type {ReadableStream<Uint8Array>} */ (res.body))) {
            if (ev.event === "end") {
              f.finished = true; // also a resume after the end: nothing more comes
              break;
            }
            if (ev.event !== "envelope") continue;
            pause = 250;
            const streamSeq = Number(ev.id);
            f.read(streamSeq);
            let env;
            try {
              env = decodeEnvelope(ev.data, run, streamSeq);
            } catch (err) {
              this.warn(/** @type {Error} */ (err));
              continue;
            }
            const { take, gap } = f.accept(env);
            if (gap) this.warn(gap);
            if (take && (opts.includeUnknown || isKnownEventType(env.event.type))) yield env;
            if (f.finished) break;
          }
        } catch (err) {
          if (signal.aborted) break;
          // the stream broke: reconnect from the next stream sequence
        }
        if (!f.finished && !signal.aborted) {
          await sleep(pause, signal);
          pause = Math.min(pause * 2, 5000);
        }
      }
      outer?.throwIfAborted();
    } finally {
      outer?.removeEventListener("abort", onAbort);
      this.abort.abort();
    }
  }
}
