// @agentfleet/client: submit, follow, steer, abort and inspect agentfleet
// runs from Node over the official NATS client (docs/protocol.md; the Go
// client bus/ is the reference this follows). The browser entry point,
// over a console's HTTP API, is ./console.js.
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { connect as natsConnect, createInbox, credsAuthenticator, headers as natsHeaders, nkeyAuthenticator } from "@nats-io/transport-node";
import { DeliverPolicy, jetstream, jetstreamManager } from "@nats-io/jetstream";
import { Kvm } from "@nats-io/kv";

import {
  AgentfleetError,
  InvalidArgumentError,
  JetStreamUnavailableError,
  NatsUnreachableError,
  NoStreamsError,
  RunFinishedError,
  RunIdTakenError,
  RunNotFoundError,
  ScheduleError,
  UnknownQueueError,
  EventsGoneError,
} from "./errors.js";
import { checkControlKey, checkQueue, checkRunId, DEFAULT_QUEUE, Names, newRunId } from "./names.js";
import { decodeEnvelope, Follower, isKnownEventType, pendingCalls, Transcript } from "./reader.js";

export * from "./errors.js";
export { checkControlKey, checkQueue, checkRunId, DEFAULT_PREFIX, DEFAULT_QUEUE, Names, newRunId } from "./names.js";
export { applyStreamEvent, decodeEnvelope, Follower, formatEnvelope, goCompact, goString, isKnownEventType, pendingCalls, RAW, textOf, Transcript } from "./reader.js";
export { EVENT_TYPES, PROTOCOL_VERSION, STREAM_EVENT_TYPES } from "./protocol.js";

/** How old a running record's heartbeat may be before status and list mark it stale (docs/protocol.md §7). */
export const DEFAULT_STALE_AFTER_MS = 3 * 60_000;
/** How long a follower waits in vain before it checks the stream for events its consumer did not deliver (§4). */
export const DEFAULT_FOLLOW_STALL_MS = 5_000;
/** The inactive threshold of the follow consumers (§4: longer than the 30 s pull expiry). */
const EVENT_READER_IDLE_MS = 45_000;
const MAX_REQUEST_BYTES = 1 << 20;
const MAX_CONTROL_BYTES = 256 << 10;
/** A schedule's definition, its request included (bus.MaxScheduleBytes). */
const MAX_SCHEDULE_BYTES = MAX_REQUEST_BYTES + (16 << 10);
/** How long a schedule operation waits for a worker's reply. */
const SCHEDULE_OP_TIMEOUT_MS = 30_000;
/** A schedule reply's code -> ScheduleError's code. */
const SCHEDULE_CODES = /** @type {Record<string, import("./errors.js").ScheduleError["code"]>} */ ({
  invalid: "schedule_invalid",
  not_found: "schedule_not_found",
  exists: "schedule_exists",
  ambiguous: "schedule_ambiguous",
});
const HEADER_AFTER_FINISH = "Agentfleet-After-Finish";
const FIRST_WINDOW = 128;
const MAX_WINDOW = 8192;
const DEFAULT_LIST_SCAN = 100_000;
/**
 * The waits the waiting index lists (since 1.10, bus.Indexed; children and
 * key waits since the 1.10 child-run fixes): a model's
 * rate-limit wait is not indexed (it comes and goes with each call), so a
 * listing asking for it walks the records, and one from the index skips
 * the "model" entries a 1.9 worker left.
 */
const INDEXED_WAITS = new Set(["approval", "budget", "children", "key"]);

/** Subjects of one batched record read (waitingPage). */
const MULTI_LAST_CHUNK = 256;
const CATCH_UP_ROUNDS = 4;
const REQUEST_SLACK_MS = 60_000;
/**
 * Whether an envelope's JSON may be one pendingCalls folds: the approval
 * reads keep only those (a long run's transcript is never held).
 * @param {string} text
 */
const folded = (text) =>
  ["run_finished", "tool_approval_requested", "tool_approval_resolved", "tool_execution_end"].some((t) => text.includes(`"${t}"`));
/** The runs whose events a page of approvals reads at once. */
const PENDING_READS = 16;

const enc = new TextEncoder();
const dec = new TextDecoder();
const sleep = (/** @type {number} */ ms) => new Promise((r) => setTimeout(r, ms));

/**
 * Connects to NATS and returns a client that owns the connection. Options
 * not given come from the environment, as for the worker and submit
 * (NATS_URL, NATS_USER, NATS_PASSWORD, NATS_TOKEN, NATS_CREDS, NATS_NKEY,
 * NATS_CA, NATS_CERT, NATS_KEY, AGENTS_PREFIX).
 * @param {import("./index.js").ConnectOptions} [opts]
 */
export async function connect(opts = {}) {
  const env = opts.env ?? process.env;
  const servers = opts.servers ?? env.NATS_URL ?? "nats://127.0.0.1:4222";
  /** @type {any} */
  const o = {
    servers: Array.isArray(servers) ? servers : servers.split(",").map((s) => s.trim()),
    name: opts.name ?? "agentfleet-ts",
    maxReconnectAttempts: -1,
    timeout: opts.timeout ?? 5000,
  };
  // Reconnect forever with a capped exponential backoff plus jitter (100 ms
  // doubling to 5 s, as the Go client), so that clients do not stampede a
  // restarting server.
  const backoff = { attempts: 0 };
  o.reconnectDelayHandler = () => {
    const d = Math.min(100 * 2 ** backoff.attempts++, 5000);
    return d + Math.random() * (d / 4);
  };
  const user = opts.user ?? env.NATS_USER;
  const pass = opts.pass ?? env.NATS_PASSWORD;
  const token = opts.token ?? env.NATS_TOKEN;
  if (user) Object.assign(o, { user, pass });
  if (token) o.token = token;
  const creds = opts.credsFile ?? env.NATS_CREDS;
  const nkey = opts.nkeyFile ?? env.NATS_NKEY;
  if (opts.authenticator) o.authenticator = opts.authenticator;
  else if (creds) o.authenticator = credsAuthenticator(readFileSync(creds));
  else if (nkey) o.authenticator = nkeyAuthenticator(enc.encode(readFileSync(nkey, "utf8").trim()));
  const ca = opts.tls?.caFile ?? env.NATS_CA;
  const cert = opts.tls?.certFile ?? env.NATS_CERT;
  const key = opts.tls?.keyFile ?? env.NATS_KEY;
  if (ca || cert || key) o.tls = { ...(ca ? { caFile: ca } : {}), ...(cert ? { certFile: cert, keyFile: key } : {}) };
  let nc;
  try {
    nc = await natsConnect(o);
  } catch (err) {
    throw new NatsUnreachableError(redact(o.servers.join(",")), { cause: err });
  }
  (async () => {
    for await (const s of nc.status()) if (s.type === "reconnect") backoff.attempts = 0;
  })().catch(() => {});
  return new Client(nc, { prefix: opts.prefix ?? env.AGENTS_PREFIX, staleAfterMs: opts.staleAfterMs, followStallMs: opts.followStallMs, own: true });
}

/** A schedule's name: [A-Za-z0-9_-]{1,64}, as a run id. @param {unknown} name */
function checkScheduleName(name) {
  if (typeof name !== "string" || !/^[A-Za-z0-9_-]{1,64}$/.test(name)) {
    throw new InvalidArgumentError(`invalid schedule name "${String(name).slice(0, 80)}": it must match [A-Za-z0-9_-]{1,64}`);
  }
}

/** Server URLs without passwords or tokens, for messages. @param {string} urls */
function redact(urls) {
  return urls.replace(/\/\/[^@/]*@/g, "//REDACTED@");
}

/** @param {any} err */
function isNoResponders(err) {
  for (let e = err; e; e = e.cause) {
    if (e.name === "NoResponders" || (typeof e.isNoResponders === "function" && e.isNoResponders())) return true;
  }
  return false;
}

/**
 * Whether a failure is the connection's close: a request made after it, or
 * one out when it came (a RequestError "connection closed").
 * @param {any} err
 */
function isClosedConnection(err) {
  for (let e = err; e; e = e.cause) {
    if (e.name === "ClosedConnectionError" || (e.name === "RequestError" && /connection closed/i.test(e.message))) return true;
  }
  return false;
}

/** @param {any} err @param {number} code */
function apiCode(err, code) {
  for (let e = err; e; e = e.cause) if (e.code === code && typeof e.apiError === "function") return true;
  return false;
}

/**
 * Whether a NATS or JetStream failure is one that a reconnect, a new
 * leader or JetStream finishing its start cures (the Go client's
 * internal/natserr.Transient).
 * @param {any} err
 */
export function isTransient(err) {
  if (!err) return false;
  if (isNoResponders(err)) return true;
  for (let e = err; e; e = e.cause) {
    if (e.name === "TimeoutError" || e.name === "JetStreamNotEnabled") return true;
    if (typeof e.apiError === "function" && (e.status === 503 || e.status === 429 || e.code === 503)) return true;
    if (e.name === "ConnectionError" && /disconnect|reconnect/i.test(e.message)) return true;
  }
  return false;
}

/** A run record as status and list return it: the stored record, plus stale and its KV revision. */
export class Client {
  /**
   * Wraps a NATS connection (close() closes it only when connect made it).
   * @param {import("@nats-io/transport-node").NatsConnection} nc
   * @param {{prefix?: string, staleAfterMs?: number, followStallMs?: number, own?: boolean}} [opts]
   */
  constructor(nc, opts = {}) {
    this.nc = nc;
    this.names = new Names(opts.prefix);
    this.js = jetstream(nc);
    this.staleAfterMs = opts.staleAfterMs ?? DEFAULT_STALE_AFTER_MS;
    this.followStallMs = opts.followStallMs ?? DEFAULT_FOLLOW_STALL_MS;
    this.own = opts.own ?? false;
    /** @type {Promise<import("@nats-io/jetstream").JetStreamManager> | null} */
    this._jsm = null;
    /** @type {Promise<import("@nats-io/kv").KV> | null} */
    this._kv = null;
    /** @type {Set<FollowStream>} */
    this._follows = new Set();
    /** @type {Set<Promise<void>>} the follows' consumer deletions under way */
    this._cleanups = new Set();
    /** @type {(() => Promise<void> | void) | undefined} tests: a listing read the records' top, not yet the queued runs */
    this.beforeListQueued = undefined;
    this.connected = true;
    (async () => {
      for await (const s of nc.status()) {
        if (s.type === "disconnect") this.connected = false;
        else if (s.type === "reconnect") this.connected = true;
      }
    })().catch(() => {});
  }

  /**
   * Closes the follows and, if the client made it, the connection, once the
   * follows' consumers are deleted (those still being created when their
   * follow was closed included).
   */
  async close() {
    for (const f of this._follows) f.close();
    // Not while NATS is away: a deletion would wait for its timeout, and the
    // consumer goes anyway after its inactive threshold.
    if (this.connected) await Promise.allSettled([...this._cleanups]);
    if (this.own) await this.nc.close();
  }

  /**
   * Keeps a clean-up under way (a follow consumer's deletion) until it
   * settles: close() waits for it. Its failure is no one's concern (an
   * ordered consumer left behind goes after its inactive threshold).
   * @param {Promise<unknown>} p
   */
  cleanup(p) {
    const q = p.then(
      () => {},
      () => {},
    );
    this._cleanups.add(q);
    q.then(() => this._cleanups.delete(q));
  }

  /** @returns {Promise<import("@nats-io/jetstream").JetStreamManager>} */
  jsm() {
    this._jsm ??= jetstreamManager(this.nc, { checkAPI: false });
    return this._jsm;
  }

  /** The records bucket. */
  async records() {
    this._kv ??= new Kvm(this.js).open(this.names.recordsBucket).catch((err) => {
      this._kv = null;
      throw err;
    });
    return this._kv;
  }

  /**
   * Turns a NATS or JetStream failure into the client's errors: "JetStream
   * down" (no responders, a timeout), "no streams" (a fleet stream that does
   * not exist), "NATS unreachable" (the connection is down).
   * @param {unknown} err @param {string} what @param {string} stream
   */
  fleetError(err, what, stream) {
    if (err instanceof AgentfleetError) return err;
    const e = /** @type {any} */ (err);
    if (apiCode(e, 10059) || /stream not found/i.test(e?.message ?? "")) return new NoStreamsError(stream, { cause: err });
    if (!this.connected || this.nc.isClosed() || isClosedConnection(e)) {
      return new NatsUnreachableError(redact(this.nc.getServer?.() ?? "the server"), { cause: err });
    }
    if (isTransient(err) || apiCode(e, 10039)) return new JetStreamUnavailableError(what, { cause: err });
    return /** @type {Error} */ (err);
  }

  // ---- submit ----------------------------------------------------------

  /**
   * Stores a run request on a queue (docs/protocol.md §3) and returns once
   * JetStream has stored it. The run id is the request's idempotency key:
   * submitting the same request with the same id again within the
   * duplicate window (1 hour) stores nothing and answers duplicate: true.
   * @param {import("../types/protocol.js").RunRequest} request
   * @param {{queue?: string, id?: string, headers?: Record<string, string>}} [opts]
   */
  async submit(request, opts = {}) {
    const queue = opts.queue || DEFAULT_QUEUE;
    checkQueue(queue);
    const id = opts.id ?? request.id ?? newRunId();
    checkRunId(id);
    if (request.id !== undefined && request.id !== id) throw new InvalidArgumentError(`request id "${request.id}" differs from the run id "${id}"`);
    const { id: _, ...rest } = request;
    if (rest.priority !== undefined && !["high", "normal", "low"].includes(rest.priority)) {
      throw new InvalidArgumentError(`priority "${String(rest.priority).slice(0, 40)}": use high, normal or low`);
    }
    // normal is the default, left out: a worker before 1.10 refuses the field.
    if (rest.priority === "normal") delete rest.priority;
    // The tenant goes in the subject too (since 1.10): fair share between tenants.
    const subject = this.names.request(queue, rest.priority, id, rest.metadata?.tenant);
    const body = enc.encode(JSON.stringify({ id, ...rest }));
    if (body.length > MAX_REQUEST_BYTES) throw new InvalidArgumentError(`the request is ${body.length} bytes, the limit is ${MAX_REQUEST_BYTES} (1 MiB)`);
    const h = natsHeaders();
    for (const [k, v] of Object.entries(opts.headers ?? {})) h.set(k, v);
    let ack;
    try {
      ack = await this.js.publish(subject, body, { msgID: id, expect: { streamName: this.names.runsStream }, headers: h });
    } catch (err) {
      if (isNoResponders(err)) {
        // No stream takes the subject: an undeclared queue if the runs
        // stream answers, else JetStream (or the streams) are away.
        let exists = false;
        try {
          await (await this.jsm()).streams.info(this.names.runsStream);
          exists = true;
        } catch (ierr) {
          throw this.fleetError(ierr, `submit ${id}`, this.names.runsStream);
        }
        if (exists) throw new UnknownQueueError(queue, id, { cause: err });
      }
      throw this.fleetError(err, `submit ${id}`, this.names.runsStream);
    }
    if (ack.duplicate) await this.sameRequest(ack.seq, queue, id, body);
    return { id, queue, seq: ack.seq, duplicate: ack.duplicate };
  }

  /**
   * Checks that the stored request a duplicate ack points at is this one
   * (same queue, same body), so that a request squatting on the id is not
   * taken for ours; once it was taken, only the record's queue can tell.
   * @param {number} seq @param {string} queue @param {string} id @param {Uint8Array} body
   */
  async sameRequest(seq, queue, id, body) {
    const jsm = await this.jsm();
    let stored;
    try {
      stored = await jsm.streams.getMessage(this.names.runsStream, { seq });
    } catch (err) {
      throw this.fleetError(err, `submit ${id}: checking the duplicate`, this.names.runsStream);
    }
    let storedQueue;
    if (stored) {
      storedQueue = this.names.parseSubmit(stored.subject)?.queue;
      if (storedQueue === queue && this.names.parseSubmit(stored.subject)?.run === id && !sameBytes(stored.data, body)) {
        throw new RunIdTakenError(`submit ${id}: run id taken by another request (sequence ${seq} on queue "${queue}" holds another body); submit with a new id`);
      }
    } else {
      const rec = await this.record(id).catch(() => null);
      if (!rec) return;
      storedQueue = rec.queue;
    }
    if (storedQueue !== queue) {
      throw new RunIdTakenError(`submit ${id}: run id taken by another request (stored on queue "${storedQueue}", not "${queue}"); submit with a new id`);
    }
  }

  // ---- records ------------------------------------------------------------

  /** A run's stored record, or null. @param {string} run */
  async record(run) {
    let e;
    try {
      e = await (await this.records()).get(run);
    } catch (err) {
      throw this.fleetError(err, `record of ${run}`, this.names.recordsStream);
    }
    if (!e || e.operation !== "PUT") return null;
    /** @type {any} */
    const r = e.json();
    Object.defineProperty(r, "revision", { value: e.revision, enumerable: false });
    return r;
  }

  /** @param {any} r @param {number} now */
  markStale(r, now) {
    if (r.state !== "running") return;
    const hb = Date.parse(r.heartbeatAt ?? r.startedAt ?? "");
    if (!Number.isNaN(hb) && now - hb > this.staleAfterMs) r.stale = true;
  }

  /**
   * A run's record (docs/protocol.md §7), stale marked; a run with only a
   * request is queued; neither is a RunNotFoundError. The record is read,
   * then the request, then the record again: a run found by none of the
   * three did not exist when status began.
   * @param {string} run
   */
  async status(run) {
    checkRunId(run);
    const r = await this.record(run);
    if (r) {
      this.markStale(r, Date.now());
      return r;
    }
    let m;
    try {
      const q = /** @type {any} */ ({ seq: 1, next_by_subj: this.names.submit("*", run) }); // MSG.GET next by subject
      m = await (await this.jsm()).streams.getMessage(this.names.runsStream, q);
      if (!m) {
        // A lane's request (since 1.10).
        const l = /** @type {any} */ ({ seq: 1, next_by_subj: `${this.names.prefix}.lane.*.*.*.${run}` });
        m = await (await this.jsm()).streams.getMessage(this.names.runsStream, l);
      }
    } catch (err) {
      throw this.fleetError(err, `status of ${run}`, this.names.runsStream);
    }
    if (!m) {
      // The run may have finished between the two reads: its record is
      // written before its request is removed.
      const again = await this.record(run);
      if (again) {
        this.markStale(again, Date.now());
        return again;
      }
      throw new RunNotFoundError(run);
    }
    const p = this.names.parseSubmit(m.subject);
    return queuedRecord(run, p?.queue ?? "", m.time.toISOString(), m.seq, p?.priority);
  }

  // ---- schedules (protocol 1.10) -------------------------------------------

  /**
   * Every schedule (docs/protocol.md §2, Schedules), by name: its
   * definition, its def message's sequence, and its newest run (last).
   */
  async schedules() {
    const stream = this.names.schedulesStream;
    const out = [];
    try {
      const jsm = await this.jsm();
      const info = await jsm.streams.info(stream, { subjects_filter: this.names.schedule("*", "*", "def") });
      for (const subject of Object.keys(info.state.subjects ?? {})) {
        const m = await jsm.streams.getMessage(stream, { last_by_subj: subject });
        if (!m || m.header?.get("Agentfleet-Schedule-Deleted")) continue;
        const s = m.json();
        const last = await jsm.streams.getMessage(stream, { last_by_subj: this.names.schedule(s.queue, s.name, "last") });
        out.push({ ...s, seq: m.seq, last: last ? last.json() : null });
      }
    } catch (err) {
      throw this.fleetError(err, "schedules", stream);
    }
    return out.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  }

  /**
   * Asks a worker of the schedule's queue to store a new schedule (since
   * 1.10: only workers write AGENTS_SCHEDULES); with replace, one of the
   * same name and queue may be replaced. The worker checks the
   * definition: a refused one throws a ScheduleError naming every problem.
   * Returns the def message's sequence.
   * @param {import("./index.js").ScheduleInput} schedule
   * @param {{replace?: boolean, timeoutMs?: number}} [opts]
   */
  async createSchedule(schedule, opts = {}) {
    const s = { ...schedule, queue: schedule.queue || DEFAULT_QUEUE };
    checkScheduleName(s.name);
    checkQueue(s.queue);
    const op = opts.replace ? "replace" : "create";
    const r = await this.scheduleOp(s.queue, s.name, op, s, opts.timeoutMs);
    return r.seq ?? 0;
  }

  /**
   * Stores the schedule over the stored one of the same name and queue
   * (its createdAt kept), or as a new one when there is none; a name on
   * another queue is schedule_exists.
   * @param {import("./index.js").ScheduleInput} schedule
   * @param {{timeoutMs?: number}} [opts]
   */
  replaceSchedule(schedule, opts = {}) {
    return this.createSchedule(schedule, { ...opts, replace: true });
  }

  /** Keeps the definition without the server's schedule, so nothing fires. @param {string} name @param {{timeoutMs?: number}} [opts] */
  async pauseSchedule(name, opts = {}) {
    await this.scheduleOpByName(name, "pause", opts.timeoutMs);
  }

  /** Makes a paused schedule fire again (an @every one counts from the resume). @param {string} name @param {{timeoutMs?: number}} [opts] */
  async resumeSchedule(name, opts = {}) {
    await this.scheduleOpByName(name, "resume", opts.timeoutMs);
  }

  /** Removes a schedule (a tombstone replaces it); its runs are left alone. @param {string} name @param {{timeoutMs?: number}} [opts] */
  async deleteSchedule(name, opts = {}) {
    await this.scheduleOpByName(name, "delete", opts.timeoutMs);
  }

  /** Fires a schedule now, paused or not; returns the run id the fire submits. @param {string} name @param {{timeoutMs?: number}} [opts] */
  async triggerSchedule(name, opts = {}) {
    const r = await this.scheduleOpByName(name, "trigger", opts.timeoutMs);
    return r.run ?? "";
  }

  /**
   * Looks the schedule up by name (on whichever queue, as the Go client),
   * then asks a worker of its queue.
   * @param {string} name @param {import("./names.js").ScheduleOp} op @param {number} [timeoutMs]
   */
  async scheduleOpByName(name, op, timeoutMs) {
    const queue = await this.scheduleQueue(name, op);
    return this.scheduleOp(queue, name, op, null, timeoutMs);
  }

  /**
   * The queue holding the schedule of the name (bus findSchedule): each
   * queue's def subject on its own, tombstones, fired-over defs and bodies
   * naming another schedule left out.
   * @param {string} name @param {string} op
   */
  async scheduleQueue(name, op) {
    checkScheduleName(name);
    const stream = this.names.schedulesStream;
    const queues = [];
    try {
      const jsm = await this.jsm();
      const info = await jsm.streams.info(stream, { subjects_filter: this.names.schedule("*", name, "def") });
      for (const subject of Object.keys(info.state.subjects ?? {})) {
        const m = await jsm.streams.getMessage(stream, { last_by_subj: subject });
        if (!m || m.header?.get("Agentfleet-Schedule-Deleted") || m.header?.get("Nats-Scheduler")) continue;
        const queue = subject.slice(this.names.prefix.length + ".schedule.".length).split(".")[0];
        let s;
        try {
          s = m.json();
        } catch {
          continue;
        }
        if (s?.queue === queue && s?.name === name) queues.push(queue);
      }
    } catch (err) {
      throw this.fleetError(err, `schedule ${name}`, stream);
    }
    if (queues.length === 0) throw new ScheduleError("schedule_not_found", `schedule ${name}: ${op}: schedule not found: ${name}`, { name, op });
    if (queues.length > 1) {
      queues.sort();
      throw new ScheduleError("schedule_ambiguous", `schedule ${name}: ${op}: schedule ${name} is on queues ${queues.join(", ")}; delete all but one`, { name, op });
    }
    return queues[0];
  }

  /**
   * A schedule operation: a core NATS request on
   * agents.schedop.<queue>.<name>.<op> that one worker of the queue answers
   * with {seq?, run?, code?, error?, problems?} (docs/protocol.md §2).
   * @param {string} queue @param {string} name @param {import("./names.js").ScheduleOp} op @param {object | null} body @param {number} [timeoutMs]
   * @returns {Promise<{seq?: number, run?: string}>}
   */
  async scheduleOp(queue, name, op, body, timeoutMs = SCHEDULE_OP_TIMEOUT_MS) {
    const data = enc.encode(body ? JSON.stringify(body) : "{}");
    if (data.length > MAX_SCHEDULE_BYTES) {
      throw new InvalidArgumentError(`schedule ${name}: ${data.length} bytes, the limit is ${MAX_SCHEDULE_BYTES}`);
    }
    let m;
    try {
      m = await this.nc.request(this.names.scheduleOp(queue, name, op), data, { timeout: timeoutMs });
    } catch (err) {
      if (isNoResponders(err)) {
        throw new ScheduleError(
          "schedule_no_worker",
          `schedule ${name}: ${op}: no worker of queue "${queue}" answers schedule operations (start a worker of protocol 1.10 or later with --queue ${queue})`,
          { name, op, queue },
          { cause: err },
        );
      }
      const why = err instanceof Error ? err.message : String(err);
      throw new ScheduleError("schedule_failed", `schedule ${name}: ${op}: ${why}`, { name, op, queue }, { cause: err });
    }
    /** @type {{seq?: number, run?: string, code?: string, error?: string, problems?: string[]}} */
    let r;
    try {
      r = JSON.parse(dec.decode(m.data));
    } catch (err) {
      throw new ScheduleError("schedule_failed", `schedule ${name}: ${op}: a worker's reply does not decode: ${err}`, { name, op, queue }, { cause: err });
    }
    if (!r.code) return r;
    const problems = Array.isArray(r.problems) ? r.problems : [];
    const code = SCHEDULE_CODES[r.code] ?? "schedule_failed";
    // Every problem, not the worker's error text (which may cut the list).
    const detail = code === "schedule_invalid" && problems.length ? `bad request: ${problems.join("; ")}` : (r.error ?? r.code);
    throw new ScheduleError(code, `schedule ${name}: ${op}: ${detail}`, { name, op, queue, problems });
  }

  // ---- follow -------------------------------------------------------------

  /**
   * A run's envelopes from the first (or from the cursor's stream
   * sequence), then live, ending after its run_finished (docs/protocol.md
   * §4, "Following a run"). Iterate it with for await; its cursor() says
   * where to resume.
   * @param {string} run
   * @param {import("./index.js").FollowOptions} [opts]
   */
  follow(run, opts = {}) {
    return new FollowStream(this, run, opts);
  }

  /**
   * Whether a run has none of its request, its record and a stored event
   * (docs/protocol.md §4, "A run that does not exist"); an error reading
   * them is no answer (false).
   * @param {string} run
   */
  async absent(run) {
    try {
      await this.status(run);
      return false;
    } catch (err) {
      if (!(err instanceof RunNotFoundError)) return false;
    }
    return (await this.lastEventSeq(run).catch(() => -1)) === 0;
  }

  /**
   * The stream sequence of a run's last stored event (0: none).
   * @param {string} run
   */
  async lastEventSeq(run) {
    const m = await this.lastEvent(run);
    return m ? m.seq : 0;
  }

  /**
   * A run's last stored event (its stream sequence and data), or null.
   * @param {string} run
   */
  async lastEvent(run) {
    return (await (await this.jsm()).streams.getMessage(this.names.eventsStream, { last_by_subj: this.names.events(run) })) ?? null;
  }

  /**
   * An ordered consumer on a run's events (inactive threshold 45 s).
   * @param {string} run
   * @param {Partial<import("@nats-io/jetstream").OrderedConsumerOptions>} cfg
   */
  async orderedEvents(run, cfg) {
    try {
      return await this.js.consumers.get(this.names.eventsStream, {
        filter_subjects: [this.names.events(run)],
        inactive_threshold: EVENT_READER_IDLE_MS,
        ...cfg,
      });
    } catch (err) {
      throw this.fleetError(err, `events of ${run}`, this.names.eventsStream);
    }
  }

  /**
   * A run's envelopes stored now (since a time, if given), decoded, in
   * stream order; it does not wait for more.
   * @param {string} run @param {Date} [since] @param {(json: string) => boolean} [keep] keeps an envelope by its JSON
   */
  async storedEvents(run, since, keep) {
    checkRunId(run);
    const cons = await this.orderedEvents(run, since ? { deliver_policy: DeliverPolicy.StartTime, opt_start_time: since.toISOString() } : { deliver_policy: DeliverPolicy.All });
    /** @type {any[]} */
    const out = [];
    try {
      const info = await cons.info(true);
      if (info.num_pending === 0) return out;
      const msgs = await cons.consume({ max_messages: 256 });
      for await (const m of msgs) {
        try {
          const text = m.string();
          if (!keep || keep(text)) out.push(decodeEnvelope(text, run, m.seq));
        } catch {
          // an envelope that does not decode is skipped
        }
        if (m.info.pending === 0) break;
      }
    } finally {
      cons.delete().catch(() => {});
    }
    return out;
  }

  /**
   * Replays a run into its transcript; waits for a running run to end
   * (stop it with signal).
   * @param {string} run @param {{signal?: AbortSignal}} [opts]
   */
  async transcript(run, opts = {}) {
    const t = new Transcript();
    for await (const env of this.follow(run, { signal: opts.signal })) t.apply(env);
    return t;
  }

  /**
   * A run's outcome: its final answer, status and usage (what `submit
   * result --json` prints), and its messages. Waits for a running run to
   * finish unless wait is false.
   * @param {string} run @param {{wait?: boolean, signal?: AbortSignal}} [opts]
   */
  async result(run, opts = {}) {
    const rec = await this.status(run);
    if (opts.wait === false && !isFinished(rec.state)) throw new AgentfleetError("run_not_finished", `run ${run} is ${rec.state}`);
    const t = await this.transcript(run, { signal: opts.signal });
    const f = t.finished;
    if (!f) throw new AgentfleetError("no_run_finished", `run ${run} has no run_finished`);
    return { run, status: f.status, reason: f.reason ?? "", error: f.error ?? "", text: t.finalText(), turns: f.turns, usage: f.usage, cost: f.cost, messages: t.messages };
  }

  /**
   * A finished run's transcript snapshot (since 1.9, docs/protocol.md §2
   * "Transcript snapshots"): its header and its messages (pi JSON, the
   * context the model was last sent), read from the object store
   * agents_transcripts. null when the run has none to trust: a run of a
   * worker before 1.9, one that finished without running, a write that
   * failed, or a snapshot whose attempt is not the record's (an attempt
   * that lost its lease at its end may have written one); then read its
   * events (transcript). A snapshot larger than opts.maxBytes, or whose
   * body does not match its header or digest, is an error.
   * @param {string} run @param {{maxBytes?: number}} [opts]
   */
  async loadSnapshot(run, opts = {}) {
    checkRunId(run);
    const rec = await this.status(run);
    const stream = this.names.transcriptsStream;
    let meta;
    try {
      meta = await (await this.jsm()).streams.getMessage(stream, { last_by_subj: this.names.snapshotMeta(run) });
    } catch (err) {
      const e = this.fleetError(err, `snapshot of ${run}`, stream);
      if (e instanceof NoStreamsError) return null; // a fleet before 1.9
      throw e;
    }
    if (!meta) return null;
    /** @type {any} */
    const info = meta.json();
    if (info.deleted) return null;
    const md = info.metadata ?? {};
    const header = { run: md.run, attempt: Number(md.attempt), messages: Number(md.messages), bytes: Number(info.size ?? 0), from: md.from ?? "" };
    if (header.run !== run || !Number.isInteger(header.attempt) || !Number.isInteger(header.messages) || header.messages < 0) {
      throw new AgentfleetError("bad_snapshot", `snapshot of run ${run}: its header is not a snapshot's`);
    }
    if (header.attempt !== rec.attempt) return null;
    if (opts.maxBytes !== undefined && header.bytes > opts.maxBytes) {
      throw new AgentfleetError("snapshot_too_large", `snapshot of run ${run}: ${header.bytes} bytes, more than ${opts.maxBytes}`);
    }
    const body = await this.snapshotBody(run, info);
    /** @type {any} */
    let messages;
    try {
      messages = JSON.parse(new TextDecoder().decode(body));
    } catch (err) {
      throw new AgentfleetError("bad_snapshot", `snapshot of run ${run}: the body is not JSON`, { cause: err });
    }
    if (!Array.isArray(messages) || messages.length !== header.messages) {
      throw new AgentfleetError("bad_snapshot", `snapshot of run ${run}: the body is not an array of its header's ${header.messages} messages`);
    }
    return { header, messages };
  }

  /**
   * A snapshot's body: its chunks, read with an ordered push consumer (the
   * readers' permissions: no pull), checked against the object's size and
   * SHA-256 digest.
   * @param {string} run @param {any} info the object's info
   */
  async snapshotBody(run, info) {
    const size = Number(info.size ?? 0);
    const chunks = Number(info.chunks ?? 0);
    const out = new Uint8Array(size);
    let n = 0;
    if (chunks > 0) {
      const cons = await this.js.consumers.getPushConsumer(this.names.transcriptsStream, {
        filter_subjects: [this.names.snapshotChunks(info.nuid)],
        deliver_policy: DeliverPolicy.All,
      });
      const msgs = await cons.consume();
      try {
        let got = 0;
        for await (const m of msgs) {
          if (n + m.data.length > size) throw new AgentfleetError("bad_snapshot", `snapshot of run ${run}: more bytes than its size ${size}`);
          out.set(m.data, n);
          n += m.data.length;
          if (++got === chunks || m.info.pending === 0) break;
        }
      } finally {
        await msgs.close().catch(() => {});
      }
    }
    const digest = "SHA-256=" + createHash("sha256").update(out.subarray(0, n)).digest("base64url") + "=";
    if (n !== size || digest !== info.digest) {
      throw new AgentfleetError("bad_snapshot", `snapshot of run ${run}: ${n} of ${size} bytes read, or its digest does not match`);
    }
    return out;
  }

  // ---- control ------------------------------------------------------------

  /**
   * Steers a run (taken after its current turn): a text, or a pi user message.
   * @param {string} run @param {string | import("../types/protocol.js").ControlMessage} text
   * @param {import("./index.js").ControlOptions} [opts]
   */
  async steer(run, text, opts) {
    return this.sendControl(run, "steer", steerBody(text, "steering"), opts);
  }

  /**
   * Queues a follow-up (taken when the run would otherwise stop).
   * @param {string} run @param {string | import("../types/protocol.js").ControlMessage} text
   * @param {import("./index.js").ControlOptions} [opts]
   */
  async followUp(run, text, opts) {
    return this.sendControl(run, "followup", steerBody(text, "follow-up"), opts);
  }

  /**
   * Asks a run to stop (it finishes aborted / aborted_by_user).
   * @param {string} run @param {import("./index.js").ControlOptions & {reason?: string}} [opts]
   */
  async abort(run, opts = {}) {
    return this.sendControl(run, "abort", opts.reason ? { reason: opts.reason } : {}, opts);
  }

  /**
   * Compacts the run's context at its next model call (since 1.10, §16);
   * instructions, if any, focus the summary.
   * @param {string} run @param {import("./index.js").ControlOptions & {instructions?: string}} [opts]
   */
  async compact(run, opts = {}) {
    return this.sendControl(run, "compact", opts.instructions ? { text: opts.instructions } : {}, opts);
  }

  /**
   * Approves a gated tool call (§13), with edited arguments if given.
   * @param {string} run @param {string} toolCallId
   * @param {import("./index.js").ControlOptions & {by?: string, reason?: string, arguments?: Record<string, unknown>}} [opts]
   */
  async approve(run, toolCallId, opts = {}) {
    return this.sendControl(run, "approve", approvalAnswer(toolCallId, "approve", opts), opts);
  }

  /**
   * Denies a gated tool call: its result is an error carrying the reason,
   * which the model sees.
   * @param {string} run @param {string} toolCallId
   * @param {import("./index.js").ControlOptions & {by?: string, reason?: string}} [opts]
   */
  async deny(run, toolCallId, opts = {}) {
    return this.sendControl(run, "approve", approvalAnswer(toolCallId, "deny", opts), opts);
  }

  /**
   * Publishes a control body on the run's subject of a kind through
   * JetStream (docs/protocol.md §6) after checking the run has not
   * finished. With a key, a retry within the control stream's duplicate
   * window is stored once and answers the first copy's sequence.
   * @param {string} run @param {"steer" | "followup" | "abort" | "approve" | "compact"} kind @param {object} body
   * @param {import("./index.js").ControlOptions} [opts]
   * @returns {Promise<{seq: number, duplicate: boolean}>}
   */
  async sendControl(run, kind, body, opts = {}) {
    checkRunId(run);
    if (!["steer", "followup", "abort", "approve", "compact"].includes(kind)) throw new InvalidArgumentError(`unknown control kind "${kind}"`);
    const key = opts.key;
    if (key !== undefined) checkControlKey(key);
    const data = enc.encode(JSON.stringify(body));
    if (data.length > MAX_CONTROL_BYTES) throw new InvalidArgumentError(`the ${kind} body is ${data.length} bytes, the limit is ${MAX_CONTROL_BYTES} (256 KiB)`);
    const rec = await this.record(run);
    const finished = rec && isFinished(rec.state) ? new RunFinishedError(run, rec.state, kindName(kind)) : null;
    if (finished && key === undefined) throw finished;
    const h = natsHeaders();
    for (const [k, v] of Object.entries(opts.headers ?? {})) h.set(k, v);
    /** @type {any} */
    const popts = { expect: { streamName: this.names.controlStream }, headers: h };
    if (key !== undefined) {
      popts.msgID = `${run}:${kind}:${key}`;
      if (finished) h.set(HEADER_AFTER_FINISH, "1");
    }
    let ack;
    try {
      ack = await this.js.publish(this.names.control(run, kind), data, popts);
    } catch (err) {
      throw this.fleetError(err, `${kind} ${run}`, this.names.controlStream);
    }
    if (!finished) return { seq: ack.seq, duplicate: ack.duplicate };
    if (!ack.duplicate) throw finished; // stored now, it reached a finished run: ignored
    // The first copy: taken if stored before the finish, ignored if it was
    // itself sent after it (it carries the mark).
    let first;
    try {
      first = await (await this.jsm()).streams.getMessage(this.names.controlStream, { seq: ack.seq });
    } catch (err) {
      throw this.fleetError(err, `${kind} ${run}: reading the first copy`, this.names.controlStream);
    }
    if (!first || first.header?.get(HEADER_AFTER_FINISH)) throw finished;
    return { seq: ack.seq, duplicate: true };
  }

  // ---- list ---------------------------------------------------------------

  /**
   * A page of run records, the newest first (docs/protocol.md §7, "Listing
   * runs"): queued runs first on the first page, then records by when they
   * were last written. It reads only what the page needs. Pass the page's
   * nextCursor as before for the next page (next, a sequence, skips the
   * queued runs a full page left).
   * @param {import("./index.js").ListOptions} [o]
   * @returns {Promise<import("./index.js").RunPage>}
   */
  async list(o = {}) {
    const limit = o.limit ?? 0;
    const state = o.state ?? "";
    const queue = o.queue ?? "";
    const waitingFor = state === "waiting" ? (o.waitingFor ?? "") : "";
    if (queue) checkQueue(queue);
    if (state === "waiting" && !o.since && (!waitingFor || INDEXED_WAITS.has(waitingFor)) && (o.before === undefined || (typeof o.before === "string" && o.before.startsWith("w.")))) {
      // The waiting index, oldest first; the records walk when there is none.
      const page = await this.waitingPage(o, waitingFor);
      if (page) return page;
      if (o.before !== undefined) throw new InvalidArgumentError(`page cursor "${String(o.before).slice(0, 80)}": no waiting index (${this.names.waitingStream})`);
    }
    let beforeSeq = typeof o.before === "number" ? o.before : 0;
    /** @type {ListCursor | null} */
    let qc = null;
    if (typeof o.before === "string") {
      const cur = parseListCursor(o.before);
      if (cur.waiting) throw new InvalidArgumentError(`page cursor "${o.before.slice(0, 80)}": only for the waiting runs`);
      if (cur.queued) qc = cur;
      else beforeSeq = cur.seq;
    }
    const beforeTime = o.before instanceof Date ? o.before : null;
    const since = o.since ?? null;
    /** @type {import("./index.js").RunPage} */
    const page = { records: [], next: 0, nextCursor: "", scanned: 0, truncated: false };
    const first = beforeSeq === 0 && !beforeTime && !qc;
    const want = () => limit <= 0 || page.records.length < limit;
    try {
      const jsm = await this.jsm();
      const stream = this.names.recordsStream;
      // The records' top is read before the queued runs: a run listed as
      // queued has no record at or below it (§7, Listing runs).
      const info = await jsm.streams.info(stream);
      let lo = info.state.first_seq;
      let hi = info.state.last_seq;
      const top = hi;
      const g = new DirectGetter(this, stream);
      const now = Date.now();
      const maxScan = o.maxScan ?? DEFAULT_LIST_SCAN;
      let queuedN = 0; // the page's records from the queued part (catchUp keeps them first)
      if ((first || qc) && (state === "" || state === "queued")) {
        await this.beforeListQueued?.();
        const queued = await this.listQueued(queue);
        /** @type {ListCursor} */
        const cur = qc ?? { queued: true, seq: 0, top, runsTop: queued.runsTop, after: "" };
        // A run picked up since top was read (on this page, between the
        // stream info and the queued runs, or between pages) has a record
        // above top only: read up to the end as it is now.
        const last = (await jsm.streams.info(stream)).state.last_seq;
        const q = mergeByID(queued.runs, await this.pickedUp(g, cur, last, state, queue, maxScan, page, now));
        for (const r of q) {
          if (r.id <= cur.after) continue;
          if (!want()) { // queued runs are left: the next page goes on after the last listed
            page.nextCursor = listCursorString({ ...cur, after: page.records[page.records.length - 1].id });
            if (cur.top > 0) page.next = cur.top + 1;
            return page;
          }
          page.records.push(r);
          queuedN++;
        }
      }
      if (state === "queued") return page;
      if (qc) beforeSeq = qc.top + 1; // the queued runs are done: the records as they were then
      if (!want()) {
        if (qc) hi = Math.min(hi, qc.top);
        if (hi > 0) {
          page.next = hi + 1;
          page.nextCursor = String(page.next);
        }
        return page;
      }
      const keyPrefix = `$KV.${this.names.recordsBucket}.`;
      if (beforeSeq > 0) hi = Math.min(hi, beforeSeq - 1);
      if (beforeTime) {
        const seq = await g.seqAt(beforeTime, keyPrefix + ">");
        if (seq > 0) hi = Math.min(hi, seq - 1);
      }
      if (since) {
        const seq = await g.seqAt(since, keyPrefix + ">");
        if (seq === 0) return page; // nothing written since
        lo = Math.max(lo, seq);
      }
      let window = FIRST_WINDOW;
      if (limit > 0 && state === "" && queue === "") window = 2 * limit + 8;
      while (hi >= lo && hi > 0 && want()) {
        if (maxScan > 0 && page.scanned >= maxScan) {
          page.truncated = true;
          // The bound was spent before the records (by the read of the
          // records written above a queued cursor's top): the next page
          // starts at them.
          if (page.next === 0) page.next = hi + 1;
          break;
        }
        const from = hi - lo + 1 > window ? hi - window + 1 : lo;
        const msgs = await g.range(from, hi);
        for (let i = msgs.length - 1; i >= 0 && want(); i--) {
          const m = msgs[i];
          page.next = m.seq;
          if (!m.data || !m.subject.startsWith(keyPrefix)) continue; // a delete or purge marker
          page.scanned++;
          const r = this.listed(m, state, queue, now, waitingFor);
          if (r) page.records.push(r);
        }
        if (!want()) break;
        page.next = from;
        hi = from - 1;
        window = Math.min(window * 2, MAX_WINDOW);
      }
      if (hi < lo || hi === 0) page.next = 0;
      if (first) await this.catchUp(g, page, state, queue, limit, top, queuedN, now, waitingFor);
      if (page.next > 0) page.nextCursor = String(page.next);
    } catch (err) {
      if (err instanceof InvalidArgumentError) throw err;
      throw this.fleetError(err, "list", this.names.recordsStream);
    }
    return page;
  }

  /**
   * A page of the waiting runs from the waiting index (docs/protocol.md §7,
   * "The waiting-run index"; bus/waiting_index.go): entries oldest first
   * from after the cursor, each checked against its record (one multi-last
   * read per window), so a stale or forged entry is never listed. Null when
   * the index does not exist (a fleet before 1.9): the caller walks the
   * records.
   * @param {import("./index.js").ListOptions} o @param {string} waitingFor
   * @returns {Promise<import("./index.js").RunPage | null>}
   */
  async waitingPage(o, waitingFor) {
    const limit = o.limit ?? 0;
    const queue = o.queue ?? "";
    const after = typeof o.before === "string" ? parseListCursor(o.before).seq : 0;
    /** @type {import("./index.js").RunPage} */
    const page = { records: [], next: 0, nextCursor: "", scanned: 0, truncated: false };
    const want = () => limit <= 0 || page.records.length < limit;
    const stream = this.names.waitingStream;
    try {
      const jsm = await this.jsm();
      let info;
      try {
        info = await jsm.streams.info(stream);
      } catch (err) {
        const e = /** @type {any} */ (err);
        if (apiCode(e, 10059) || /stream not found/i.test(e?.message ?? "")) return null;
        throw err;
      }
      if (after >= info.state.last_seq) return page; // nothing after the cursor
      let lo = Math.max(info.state.first_seq, after + 1);
      const hi = info.state.last_seq;
      const maxScan = o.maxScan ?? DEFAULT_LIST_SCAN;
      const g = new DirectGetter(this, stream);
      const recs = new DirectGetter(this, this.names.recordsStream);
      const entryPrefix = this.names.prefix + ".waiting.";
      let window = limit > 0 ? 2 * limit + 8 : FIRST_WINDOW;
      let next = after; // the last sequence the page consumed
      let more = false; // the page stopped inside a window
      let read = 0; // sequences read, holes too: what maxScan bounds here
      const now = Date.now();
      while (lo <= hi && want()) {
        if (maxScan > 0 && read >= maxScan) {
          page.truncated = true;
          break;
        }
        const to = Math.min(hi, lo + window - 1);
        read += to - lo + 1;
        /** @type {Array<{seq: number, subject: string}>} */
        const cands = [];
        for (const m of await g.range(lo, to)) {
          if (!m || !m.data || !m.subject.startsWith(entryPrefix)) continue;
          const [q, run, ...rest] = m.subject.slice(entryPrefix.length).split(".");
          if (rest.length || !run || !/^[A-Za-z0-9_-]{1,64}$/.test(run) || (queue && q !== queue)) continue;
          let e;
          try {
            e = JSON.parse(dec.decode(m.data));
          } catch {
            continue;
          }
          if (!INDEXED_WAITS.has(e?.for) || (waitingFor && e?.for !== waitingFor)) continue; // a hint only: a kind change rewrites the entry
          cands.push({ seq: m.seq, subject: this.names.record(run) });
        }
        /** @type {Map<string, any>} */
        const got = new Map();
        for (let i = 0; i < cands.length; i += MULTI_LAST_CHUNK) {
          for (const r of await recs.multiLast(cands.slice(i, i + MULTI_LAST_CHUNK).map((c) => c.subject))) {
            if (r) got.set(r.subject, r);
          }
        }
        for (const c of cands) {
          if (!want()) {
            more = true;
            break;
          }
          next = c.seq;
          page.scanned++;
          const m = got.get(c.subject);
          if (!m || !m.data) continue; // stale: the record is gone
          const r = this.listed(m, "waiting", queue, now, waitingFor);
          if (r && INDEXED_WAITS.has(r.waiting?.for)) page.records.push(r);
        }
        if (!more) next = to;
        lo = to + 1;
        window = Math.min(window * 2, MAX_WINDOW);
      }
      if (more || lo <= hi) page.nextCursor = `w.${next}`;
    } catch (err) {
      if (err instanceof InvalidArgumentError) throw err;
      throw this.fleetError(err, "list", stream);
    }
    return page;
  }

  /**
   * Decodes a stored record and says whether the listing keeps it.
   * @param {{seq: number, data: Uint8Array | null}} m @param {string} state @param {string} queue @param {number} now
   * @param {string} [waitingFor] of the waiting records, those waiting for this ("": all)
   */
  listed(m, state, queue, now, waitingFor = "") {
    let r;
    try {
      r = JSON.parse(dec.decode(/** @type {Uint8Array} */ (m.data)));
    } catch {
      return null;
    }
    if (!r || typeof r !== "object") return null;
    Object.defineProperty(r, "revision", { value: m.seq, enumerable: false });
    this.markStale(r, now);
    const ok =
      (state === "" || r.state === state || (state === "stale" && r.stale) || (state === "waiting" && r.state === "running" && r.waiting)) &&
      (queue === "" || r.queue === queue) &&
      (waitingFor === "" || (typeof r.waiting === "object" && r.waiting?.for === waitingFor));
    return ok ? r : null;
  }

  /**
   * Completes a first page with the records written while it was read
   * (§7 step 4): they are the newest, so they go after the queued runs;
   * an older copy of one the page holds is dropped.
   * @param {DirectGetter} g @param {import("./index.js").RunPage} page @param {string} state @param {string} queue
   * @param {number} limit @param {number} top @param {number} queuedN the page's records from the queued part
   * @param {number} now @param {string} [waitingFor]
   */
  async catchUp(g, page, state, queue, limit, top, queuedN, now, waitingFor = "") {
    const jsm = await this.jsm();
    /** @type {Array<{seq: number, subject: string, data: Uint8Array | null}>} */
    const msgs = [];
    for (let round = 0; round < CATCH_UP_ROUNDS; round++) {
      const info = await jsm.streams.info(g.stream);
      const last = info.state.last_seq;
      if (last <= top) break;
      while (top < last) {
        const to = Math.min(last, top + MAX_WINDOW);
        msgs.push(...(await g.range(top + 1, to)));
        top = to;
      }
    }
    if (msgs.length === 0) return;
    const keyPrefix = `$KV.${this.names.recordsBucket}.`;
    const moved = new Set();
    const newer = [];
    for (let i = msgs.length - 1; i >= 0; i--) {
      const m = msgs[i];
      if (!m.subject.startsWith(keyPrefix)) continue;
      const id = m.subject.slice(keyPrefix.length);
      if (moved.has(id)) continue;
      moved.add(id);
      if (!m.data) continue; // deleted since
      page.scanned++;
      const r = this.listed(m, state, queue, now, waitingFor);
      if (r) newer.push(r);
    }
    /** @type {any[]} */
    const out = [];
    for (const r of page.records.slice(0, queuedN)) if (!moved.has(r.id)) out.push(r); // queued runs stay first
    const rest = page.records.slice(queuedN);
    out.push(...newer);
    for (const r of rest) if (!moved.has(r.id)) out.push(r);
    if (limit > 0 && out.length > limit) {
      out.length = limit;
      page.next = out[out.length - 1].revision;
    }
    if (limit > 0 && out.length === limit) page.truncated = false;
    page.records = out;
  }

  /**
   * The records written above a queued cursor's top (up to last) for
   * requests at or below its runsTop, after its id: runs queued when the
   * listing began and picked up since, which the records up to top do not
   * hold. It reads at most maxScan sequences (less what the page scanned;
   * -1 for no bound), the newest first: when the bound stops it short of
   * top, the page is marked truncated (runs picked up in what it did not
   * read are missing from it).
   * @param {DirectGetter} g @param {ListCursor} cur @param {number} last @param {string} state @param {string} queue
   * @param {number} maxScan @param {import("./index.js").RunPage} page @param {number} now
   */
  async pickedUp(g, cur, last, state, queue, maxScan, page, now) {
    const keyPrefix = `$KV.${this.names.recordsBucket}.`;
    const seen = new Set();
    const out = [];
    for (let to = last; to > cur.top; ) { // newest first: a key's last write counts
      let n = Math.min(to - cur.top, MAX_WINDOW);
      if (maxScan > 0) {
        const left = maxScan - page.scanned;
        if (left <= 0) {
          page.truncated = true;
          break;
        }
        n = Math.min(n, left);
      }
      const from = to - n + 1;
      const msgs = await g.range(from, to);
      page.scanned += n; // sequences read, holes included: the bound is on the reads
      for (let i = msgs.length - 1; i >= 0; i--) {
        const m = msgs[i];
        if (!m.subject.startsWith(keyPrefix)) continue;
        const id = m.subject.slice(keyPrefix.length);
        if (seen.has(id)) continue;
        seen.add(id);
        if (!m.data || id <= cur.after) continue;
        const r = this.listed(m, state, queue, now);
        if (r && !((r.requestSeq ?? 0) > cur.runsTop)) out.push(r); // a later request: a run submitted since
      }
      to = from - 1;
    }
    return out;
  }

  /**
   * The requests that have no record yet, by id: the runs stream's pending
   * subjects (the backlog and the running runs), without those with a
   * record (multi-last direct gets, 1,024 keys a request); runsTop is the
   * stream's last sequence (a later request is a run submitted since).
   * @param {string} queue
   * @returns {Promise<{runs: any[], runsTop: number}>}
   */
  async listQueued(queue) {
    const jsm = await this.jsm();
    const filter = `${this.names.prefix}.submit.${queue || "*"}.*`;
    const info = await jsm.streams.info(this.names.runsStream, { subjects_filter: filter });
    const runsTop = info.state.last_seq;
    // The lanes' requests too (since 1.10).
    const lanes = await jsm.streams.info(this.names.runsStream, { subjects_filter: `${this.names.prefix}.lane.${queue || "*"}.*.*.*` });
    /** @type {any[]} */
    const pending = [];
    for (const subj of [...Object.keys(info.state.subjects ?? {}), ...Object.keys(lanes.state.subjects ?? {})]) {
      const p = this.names.parseSubmit(subj);
      if (p) pending.push(queuedRecord(p.run, p.queue, undefined, undefined, p.priority));
    }
    if (pending.length === 0) return { runs: [], runsTop };
    const g = new DirectGetter(this, this.names.recordsStream);
    const have = new Set();
    const prefix = `$KV.${this.names.recordsBucket}.`;
    for (let i = 0; i < pending.length; i += 1024) {
      const subjects = pending.slice(i, i + 1024).map((r) => prefix + r.id);
      for (const m of await g.multiLast(subjects)) if (m.data) have.add(m.subject.slice(prefix.length));
    }
    return { runs: pending.filter((r) => !have.has(r.id)).sort(byID), runsTop };
  }

  // ---- approvals ------------------------------------------------------------

  /**
   * A run's gated calls that wait for an answer, from its events as stored now.
   * @param {string} run
   */
  async pendingOf(run) {
    return pendingCalls(await this.storedEvents(run, undefined, folded));
  }

  /**
   * The pending approvals across the fleet (docs/protocol.md §13): the
   * calls of approvalsPage (every page unless limit is given).
   * @param {{queue?: string, maxScan?: number, limit?: number, before?: string}} [o]
   */
  async approvals(o = {}) {
    return (await this.approvalsPage(o)).calls;
  }

  /**
   * A page of the pending approvals (§13, "Listing pending approvals"):
   * the records waiting for approval in listing order (the waiting index's:
   * the oldest wait first; without an index, the most recently written
   * first), at most limit runs, each run's pending calls read
   * from its events since shortly before its oldest request (with the
   * arguments the model chose), PENDING_READS runs at a time; on the page
   * the oldest request first. Pass nextCursor as before for the next page.
   * @param {{queue?: string, maxScan?: number, limit?: number, before?: string}} [o]
   * @returns {Promise<{calls: any[], nextCursor: string, scanned: number, truncated: boolean}>}
   */
  async approvalsPage(o = {}) {
    const page = await this.list({ state: "waiting", waitingFor: "approval", queue: o.queue, maxScan: o.maxScan, limit: o.limit ?? 0, before: o.before });
    const recs = page.records;
    /** @type {any[][]} */
    const calls = new Array(recs.length);
    let next = 0;
    const worker = async () => {
      while (next < recs.length) {
        const i = next++;
        calls[i] = await this.pendingOfRecord(recs[i]);
      }
    };
    await Promise.all(Array.from({ length: Math.min(PENDING_READS, recs.length) }, worker));
    /** @type {any[]} */
    const out = [];
    recs.forEach((r, i) => {
      for (const p of calls[i]) {
        p.queue = r.queue;
        if (r.title) p.title = r.title;
        const w = r.waiting;
        if (typeof w === "object" && w.since) p.waitingSince = new Date(w.since);
        out.push(p);
      }
    });
    out.sort((a, b) => a.requestedAt - b.requestedAt || (a.run < b.run ? -1 : a.run > b.run ? 1 : 0));
    return { calls: out, nextCursor: page.nextCursor, scanned: page.scanned, truncated: page.truncated };
  }

  /**
   * A waiting record's pending calls: its events since shortly before its
   * oldest listed request, all of them if a listed request is not there.
   * @param {any} r
   */
  async pendingOfRecord(r) {
    const listed = r.waiting?.approvals ?? [];
    if (listed.length === 0) return this.pendingOf(r.id);
    const oldest = Math.min(...listed.map((/** @type {any} */ a) => a.requestedAt));
    const envs = await this.storedEvents(r.id, new Date(oldest - REQUEST_SLACK_MS), folded);
    const asked = new Set(envs.filter((e) => e.event.type === "tool_approval_requested").map((e) => e.event.toolCallId));
    return listed.every((/** @type {any} */ a) => asked.has(a.toolCallId)) ? pendingCalls(envs) : this.pendingOf(r.id);
  }
}

/** @param {string} state */
const isFinished = (state) => state === "succeeded" || state === "failed" || state === "aborted";

/** @param {string} kind */
const kindName = (kind) => ({ steer: "steering", followup: "follow-up", abort: "abort", approve: "approval answer", compact: "compaction" })[kind] ?? kind;

/** @param {Uint8Array} a @param {Uint8Array} b */
function sameBytes(a, b) {
  if (a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** @param {{id: string}} a @param {{id: string}} b */
const byID = (a, b) => (a.id < b.id ? -1 : a.id > b.id ? 1 : 0);

/**
 * A page cursor (§7, Listing runs): a records-stream sequence, or, while
 * queued runs are left, "q.<top>.<runsTop>.<id>", or "w.<seq>": a page of
 * the waiting index going on after seq.
 * @typedef {{queued: boolean, seq: number, top: number, runsTop: number, after: string, waiting?: boolean}} ListCursor
 */

/** @param {string} s @returns {ListCursor} */
function parseListCursor(s) {
  if (/^[0-9]+$/.test(s) && Number(s) > 0) return { queued: false, seq: Number(s), top: 0, runsTop: 0, after: "" };
  const w = /^w\.([0-9]{1,20})$/.exec(s);
  if (w) return { queued: false, waiting: true, seq: Number(w[1]), top: 0, runsTop: 0, after: "" };
  const m = /^q\.([0-9]+)\.([0-9]+)\.([A-Za-z0-9_-]{1,64})$/.exec(s);
  if (!m) throw new InvalidArgumentError(`invalid page cursor "${s.slice(0, 80)}"`);
  return { queued: true, seq: 0, top: Number(m[1]), runsTop: Number(m[2]), after: m[3] };
}

/** @param {ListCursor} c */
function listCursorString(c) {
  return c.queued ? `q.${c.top}.${c.runsTop}.${c.after}` : String(c.seq);
}

/**
 * Queued runs and records by id, a record replacing the queued run of its id.
 * @param {any[]} queued @param {any[]} recs
 */
function mergeByID(queued, recs) {
  const have = new Set(recs.map((r) => r.id));
  return queued.filter((r) => !have.has(r.id)).concat(recs).sort(byID);
}

/** @param {string} id @param {string} queue @param {string} [submittedAt] @param {number} [requestSeq] @param {string} [priority] */
function queuedRecord(id, queue, submittedAt, requestSeq, priority) {
  /** @type {any} */
  const r = { id, queue, state: "queued", attempt: 0, turns: 0, usage: zeroUsage(), cost: 0 };
  if (priority && priority !== "normal") r.priority = priority;
  if (requestSeq) r.requestSeq = requestSeq;
  if (submittedAt) r.submittedAt = submittedAt;
  return r;
}

const zeroUsage = () => ({ input: 0, output: 0, cacheRead: 0, cacheWrite: 0, totalTokens: 0, cost: { input: 0, output: 0, cacheRead: 0, cacheWrite: 0, total: 0 } });

/** @param {unknown} text @param {string} what */
function steerBody(text, what) {
  if (typeof text === "string") {
    if (text.trim() === "") throw new InvalidArgumentError(`empty ${what} text`);
    return { text };
  }
  if (text && typeof text === "object" && /** @type {any} */ (text).role === "user") return { message: text };
  throw new InvalidArgumentError(`a ${what} is a text or a pi user message ({role: "user", content})`);
}

const printable = /^[^\x00-\x1f\x7f]*$/;

/** @param {string} toolCallId @param {"approve" | "deny"} decision @param {{by?: string, reason?: string, arguments?: Record<string, unknown>}} o */
function approvalAnswer(toolCallId, decision, o) {
  const problems = [];
  if (typeof toolCallId !== "string" || toolCallId === "" || enc.encode(toolCallId).length > 256 || !printable.test(toolCallId)) {
    problems.push(`toolCallId "${String(toolCallId).slice(0, 64)}" must be 1..256 printable bytes`);
  }
  if (o.by !== undefined && (enc.encode(o.by).length > 128 || !printable.test(o.by))) problems.push("by must be at most 128 printable bytes");
  if (o.reason !== undefined && enc.encode(o.reason).length > 4096) problems.push(`reason is ${enc.encode(o.reason).length} bytes, the limit is 4096`);
  if (o.arguments !== undefined && decision === "deny") problems.push("arguments are only for approve");
  if (problems.length) throw new InvalidArgumentError(`approval answer: ${problems.join("; ")}`);
  /** @type {any} */
  const a = { toolCallId, decision };
  if (o.reason) a.reason = o.reason;
  if (o.by) a.by = o.by;
  if (o.arguments) a.arguments = o.arguments;
  return a;
}

/**
 * The direct get API of a stream (allow_direct, which KV buckets have),
 * spoken as docs/protocol.md §7 says: one request per sequence, all sent
 * before the first answer is read.
 */
class DirectGetter {
  /** @param {Client} c @param {string} stream */
  constructor(c, stream) {
    this.nc = c.nc;
    this.stream = stream;
    const prefix = /** @type {any} */ (c.js).apiPrefix ?? "$JS.API";
    this.subject = `${prefix}.DIRECT.GET.${stream}`;
  }

  /** @param {import("@nats-io/transport-node").Msg} m */
  decode(m) {
    const h = m.headers;
    if (h && h.code !== 0 && h.code !== 200 && m.data.length === 0) {
      if (h.code === 404) return null;
      if (h.code === 503) throw new JetStreamUnavailableError(`direct get on ${this.stream}`);
      throw new AgentfleetError("direct_get", `direct get on ${this.stream}: ${h.code} ${h.description}`);
    }
    const op = h?.get("KV-Operation");
    return {
      subject: h?.get("Nats-Subject") ?? "",
      seq: Number(h?.get("Nats-Sequence") ?? 0),
      time: h?.get("Nats-Time-Stamp") ?? "",
      data: op === "DEL" || op === "PURGE" ? null : m.data,
    };
  }

  /**
   * The stored messages of sequences from..to, in order (a deleted sequence
   * answers 404 and is left out).
   * @param {number} from @param {number} to
   */
  async range(from, to) {
    if (to < from) return [];
    const inbox = createInbox();
    const n = to - from + 1;
    /** @type {Array<ReturnType<DirectGetter["decode"]>>} */
    const out = [];
    let got = 0;
    /** @type {(v?: unknown) => void} */
    let done = () => {};
    /** @type {(e: unknown) => void} */
    let fail = () => {};
    const finished = new Promise((res, rej) => ((done = res), (fail = rej)));
    const sub = this.nc.subscribe(inbox + ".*", {
      callback: (err, m) => {
        if (err) return fail(err);
        try {
          const d = this.decode(m);
          if (d) out.push(d);
        } catch (e) {
          return fail(e);
        }
        if (++got === n) done();
      },
    });
    const timer = setTimeout(() => fail(new AgentfleetError("timeout", `direct get on ${this.stream}: timeout`)), 10_000);
    try {
      for (let seq = from; seq <= to; seq++) this.nc.publish(this.subject, `{"seq":${seq}}`, { reply: `${inbox}.${seq}` });
      await finished;
    } finally {
      clearTimeout(timer);
      sub.unsubscribe();
    }
    const kept = /** @type {Array<NonNullable<ReturnType<DirectGetter["decode"]>>>} */ (out.filter(Boolean));
    return kept.sort((a, b) => a.seq - b.seq);
  }

  /**
   * One batched request's messages, up to the end-of-batch status.
   * @param {object} req @param {boolean} multi
   */
  async request(req, multi) {
    const inbox = createInbox();
    /** @type {any[]} */
    const out = [];
    /** @type {(v?: unknown) => void} */
    let done = () => {};
    /** @type {(e: unknown) => void} */
    let fail = () => {};
    const finished = new Promise((res, rej) => ((done = res), (fail = rej)));
    const sub = this.nc.subscribe(inbox, {
      callback: (err, m) => {
        if (err) return fail(err);
        if (m.headers?.code === 204 && m.data.length === 0) return done();
        try {
          const d = this.decode(m);
          if (!d) return done();
          out.push(d);
          if (!multi) done();
        } catch (e) {
          fail(e);
        }
      },
    });
    const timer = setTimeout(() => fail(new AgentfleetError("timeout", `direct get on ${this.stream}: timeout`)), 10_000);
    try {
      this.nc.publish(this.subject, JSON.stringify(req), { reply: inbox });
      await finished;
    } finally {
      clearTimeout(timer);
      sub.unsubscribe();
    }
    return out;
  }

  /** The last message of each subject that has one. @param {string[]} subjects */
  multiLast(subjects) {
    return this.request({ multi_last: subjects }, true);
  }

  /** The sequence of the first message stored at or after t (0: none). @param {Date} t @param {string} filter */
  async seqAt(t, filter) {
    const msgs = await this.request({ start_time: t.toISOString(), next_by_subj: filter }, false);
    return msgs.length ? msgs[0].seq : 0;
  }
}

/**
 * Timers a stop clears at once: wait(ms) resolves true after ms, or false
 * as soon as stop() is called (at once when it was called before).
 */
class Waits {
  constructor() {
    this.stopped = false;
    /** @type {Set<{t: ReturnType<typeof setTimeout>, res: (v: boolean) => void}>} */
    this.pending = new Set();
  }

  /** @param {number} ms @returns {Promise<boolean>} */
  wait(ms) {
    if (this.stopped) return Promise.resolve(false);
    return new Promise((res) => {
      const w = {
        t: setTimeout(() => {
          this.pending.delete(w);
          res(true);
        }, ms),
        res,
      };
      this.pending.add(w);
    });
  }

  stop() {
    this.stopped = true;
    for (const w of this.pending) {
      clearTimeout(w.t);
      w.res(false);
    }
    this.pending.clear();
  }
}

/** A look's answer: the run's run_finished is stored before where the follow starts (it read it already). */
const FINISHED_BEFORE = Symbol("finished before");

/** Whether a stored message holds a run_finished envelope; the cheap test first. @param {Uint8Array} data */
function isRunFinished(data) {
  const text = dec.decode(data);
  if (!text.includes('"run_finished"')) return false;
  try {
    return JSON.parse(text)?.event?.type === "run_finished";
  } catch {
    return false;
  }
}

/** What a wait of unlessClosed ended by close() resolves to. */
const CLOSED = Symbol("closed");

/**
 * One follow of a run: an async iterable of its envelopes (see
 * Client.follow). Iterate it once.
 */
export class FollowStream {
  /** @param {Client} client @param {string} run @param {import("./index.js").FollowOptions} opts */
  constructor(client, run, opts) {
    this.client = client;
    this.run = run;
    this.opts = opts;
    this.follower = new Follower(run, opts);
    this.closed = false;
    /** @type {{stop(): void} | null} the consumer being drained */
    this.current = null;
    /** @type {Error[]} problems that did not stop the follow: gaps, envelopes that did not decode */
    this.warnings = [];
    /** The follow's own pauses (retries of the consumer's creation): close() ends them. */
    this.waits = new Waits();
    /**
     * The waits for a reply under way (unlessClosed): close() ends them and
     * hands what they bring to their discard. Each leaves the set when it
     * settles, so nothing of it is kept until close().
     * @type {Set<{p: Promise<any>, discard?: (v: any) => unknown, end: () => void, taken: boolean}>}
     */
    this.inflight = new Set();
    /** @type {import("@nats-io/jetstream").Consumer | null} the consumer being drained: close() deletes it */
    this.cons = null;
    /** Messages this follow has taken from its consumers. */
    this.delivered = 0;
    /** Looks at the run (a request, record or event) that found it missing or finished without events: tests wait on it. */
    this.missingLooks = 0;
    // RunNotFoundError only for a follow from the start, unless said.
    this.mustExist = opts.mustExist ?? (this.follower.from === 1 && this.follower.attempt === 0);
  }

  /** Where to resume: pass it to follow as options. */
  cursor() {
    return this.follower.cursor();
  }

  /** Ends the iteration: a wait for the consumer, its creation or a retry ends at once. */
  close() {
    if (this.closed) return;
    this.closed = true;
    const { client } = this;
    // The deletions are the client's clean-ups from now: Client.close(),
    // which closes its follows first, waits for them.
    for (const e of this.inflight) {
      e.taken = true;
      const { discard } = e;
      if (discard) client.cleanup(e.p.then((v) => discard(v)));
      e.end();
    }
    this.inflight.clear();
    this.waits.stop();
    this.current?.stop();
    const cons = this.cons;
    this.cons = null;
    if (cons) client.cleanup(cons.delete());
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
    const signal = opts.signal;
    // An aborted signal ends the follow before it asks anything.
    signal?.throwIfAborted();
    if (f.finished || this.closed) return; // resumed from the cursor of a follow that read run_finished
    const onAbort = () => this.close();
    signal?.addEventListener("abort", onAbort, { once: true });
    client._follows.add(this);
    try {
      if (f.from > 1) await this.checkStart();
      while (!f.finished && !this.closed) {
        const cons = await this.open(); // this.cons from its reply on: close() deletes it
        if (!cons || this.closed) break;
        try {
          yield* this.drain(cons);
        } finally {
          if (this.cons === cons) { // else close() deleted it
            this.cons = null;
            client.cleanup(cons.delete());
          }
        }
        if (!f.finished && !this.closed && client.nc.isClosed()) {
          throw new AgentfleetError("closed", `follow ${run}: the NATS connection was closed before the run finished`);
        }
      }
      signal?.throwIfAborted();
    } finally {
      signal?.removeEventListener("abort", onAbort);
      client._follows.delete(this);
      this.close();
    }
  }

  /**
   * Waits for a reply unless the follow is closed first: then null, and
   * what the reply brings (a consumer) is handed to discard, whose promise
   * (a deletion) is a clean-up of the client from close() on. A reply with
   * a discard becomes the follow's consumer (this.cons), which close()
   * deletes.
   * @template T @param {Promise<T>} p @param {(v: T) => unknown} [discard]
   * @returns {Promise<T | null>}
   */
  async unlessClosed(p, discard) {
    if (this.closed) {
      if (discard) this.client.cleanup(p.then((v) => discard(v)));
      return null;
    }
    /** @type {() => void} */
    let end = () => {};
    const ended = new Promise((res) => (end = () => res(CLOSED)));
    const e = { p, discard, end, taken: false };
    this.inflight.add(e);
    try {
      const r = await Promise.race([p, ended]);
      if (e.taken) return null;
      // What has a discard is the follow's consumer from now: close() deletes it.
      if (discard) this.cons = /** @type {any} */ (r);
      return /** @type {T} */ (r);
    } catch (err) {
      if (e.taken) return null; // failed after the close: no one's concern
      throw err;
    } finally {
      this.inflight.delete(e);
    }
  }

  /**
   * A follow resumed from a stream sequence the events stream no longer
   * holds (its first is past it) would silently start later: unless the
   * run's first stored event there provably comes right after the cursor
   * (the next seq of its attempt, the first of a newer attempt, or the run's
   * very first event), it ends with an EventsGoneError. A read that fails
   * is no answer.
   */
  async checkStart() {
    const { client, run, follower: f } = this;
    const stream = client.names.eventsStream;
    let first, next;
    try {
      const jsm = await client.jsm();
      const info = await this.unlessClosed(jsm.streams.info(stream));
      if (!info) return;
      first = info.state.first_seq;
      if (f.from >= first) return;
      const q = /** @type {any} */ ({ seq: f.from, next_by_subj: client.names.events(run) });
      next = await this.unlessClosed(jsm.streams.getMessage(stream, q));
    } catch {
      return;
    }
    if (!next) return; // closed, or none stored: the looks beside the consumer tell
    let env;
    try {
      env = decodeEnvelope(next.string(), run, next.seq);
    } catch {
      return;
    }
    const blind = f.blind;
    const follows = blind ? env.attempt <= 1 && env.seq === 1 : (env.attempt === f.attempt && env.seq === f.seq + 1) || (env.attempt > f.attempt && env.seq === 1);
    if (follows) return;
    throw new EventsGoneError(run, `its events from stream sequence ${f.from} are no longer stored (${stream} now starts at ${first})`, { from: f.from });
  }

  /**
   * An ordered consumer from the follower's next stream sequence; its
   * creation is retried (100 ms doubling to 2 s) while NATS or JetStream
   * are away, until the follow is closed. Closed while a creation is under
   * way: null at once, and the consumer is deleted once created.
   */
  async open() {
    const { client, run, follower: f } = this;
    let pause = 100;
    for (;;) {
      if (this.closed) return null;
      const cfg = f.from > 1 ? { deliver_policy: DeliverPolicy.StartSequence, opt_start_seq: f.from } : { deliver_policy: DeliverPolicy.All };
      try {
        const cons = await this.unlessClosed(client.orderedEvents(run, cfg), (c) => c.delete());
        if (!cons) return null;
        return cons;
      } catch (err) {
        const cause = /** @type {any} */ (err).cause ?? err;
        if (!(err instanceof JetStreamUnavailableError || err instanceof NatsUnreachableError || isTransient(cause))) throw err;
      }
      if (!(await this.waits.wait(pause))) return null;
      pause = Math.min(pause * 2, 2000);
    }
  }

  /**
   * Yields a consumer's envelopes until the run finishes, the follow is
   * closed, the watch ends it (a run that does not exist, one whose events
   * are gone, one whose run_finished was read before the cursor), or the
   * watch finds the consumer silent while the stream has more (then the
   * caller opens a new one).
   * @param {import("@nats-io/jetstream").Consumer} cons
   */
  async *drain(cons) {
    const { client, run, follower: f, opts } = this;
    const msgs = await cons.consume({ max_messages: 1000 });
    const it = msgs[Symbol.asyncIterator]();
    /** The stall watch's state, shared with the loop below. */
    const w = {
      /** The loop waits for the consumer. */
      waiting: false,
      /** The stream sequence of the last message taken (or the one before the start). */
      seen: f.from - 1,
      stalled: false,
      /** @type {Error | typeof FINISHED_BEFORE | null} why the watch ended the follow */
      ended: null,
      done: false,
      waits: new Waits(),
    };
    this.current = {
      stop: () => {
        w.waits.stop();
        msgs.stop();
      },
    };
    try {
      if (this.closed) return; // closed between the consumer's creation and now
      this.watch(msgs, w).catch(() => {});
      for (;;) {
        if (w.ended) {
          if (this.delivered === 0) break;
          // The watch ended the follow on a look made before the run's
          // first event, which came meanwhile: the run exists, and a new
          // consumer goes on after what was delivered.
          return;
        }
        if (w.stalled) return;
        w.waiting = true;
        let r;
        try {
          r = await it.next();
        } finally {
          w.waiting = false;
        }
        if (r.done) {
          if (w.ended && this.delivered === 0) break;
          return; // closed, stalled, or the connection closed
        }
        const m = r.value;
        f.read(m.seq);
        w.seen = m.seq;
        this.delivered++;
        let env;
        try {
          env = decodeEnvelope(m.string(), run, m.seq);
        } catch (err) {
          this.warn(/** @type {Error} */ (err));
          continue;
        }
        const { take, gap } = f.accept(env);
        if (gap) this.warn(gap);
        if (take && (opts.includeUnknown || isKnownEventType(env.event.type))) yield env;
        if (f.finished || this.closed) return;
      }
    } catch (err) {
      if (!w.ended || this.delivered !== 0) {
        if (w.stalled || this.closed) return;
        throw client.fleetError(err, `follow ${run}`, client.names.eventsStream);
      }
    } finally {
      w.done = true;
      w.waits.stop();
      msgs.stop();
    }
    // Ended by the watch before anything was delivered.
    if (w.ended === FINISHED_BEFORE) f.finished = true;
    else if (w.ended) throw w.ended;
  }

  /**
   * The stall watch, beside the consumer (bus.Client.Follow's): while the
   * follow has delivered nothing it looks for the run at once (a run that
   * exists costs no wait), then, after two intervals spent waiting with
   * nothing delivered, asks for the run's last stored event; if it is past
   * the last one delivered, it stops the consumer (the caller makes a new
   * one). The check backs off to every 16 intervals while the run is idle.
   * @param {{stop(): void}} msgs @param {{waiting: boolean, seen: number, stalled: boolean, ended: any, done: boolean, waits: Waits}} w
   */
  async watch(msgs, w) {
    const { client, run } = this;
    if (this.delivered === 0 && (await this.missing(msgs, w))) return;
    let last = w.seen;
    let idle = 0;
    let due = 2;
    while (await w.waits.wait(client.followStallMs)) {
      const cur = w.seen;
      if (!w.waiting || cur !== last) {
        last = cur;
        idle = 0;
        due = 2;
        continue;
      }
      if (++idle < due) continue;
      idle = 0;
      let stored;
      try {
        stored = await client.lastEventSeq(run);
      } catch {
        continue; // NATS away: ask again, as often, once it is back
      }
      if (w.done) return;
      if (stored === 0 && this.delivered === 0 && (await this.missing(msgs, w))) return;
      if (stored <= cur || w.seen !== cur || !w.waiting) {
        due = Math.min(2 * due, 16); // nothing missed, or it moved meanwhile
        continue;
      }
      w.stalled = true;
      msgs.stop();
      return;
    }
  }

  /**
   * Looks for a run nothing was delivered of, twice, a stall interval
   * apart, and ends the follow when both looks say so (one look would end
   * a follower started just before the run's submitter published, or one
   * that looked between a refused request's final record and its events);
   * a run_finished stored before the cursor ends it at the first look (a
   * stored run_finished is final). Reports whether the watch is done.
   * @param {{stop(): void}} msgs @param {{ended: any, done: boolean, waits: Waits}} w
   */
  async missing(msgs, w) {
    let why = await this.look();
    if (!why || w.done) return false;
    if (why !== FINISHED_BEFORE) {
      if (!(await w.waits.wait(this.client.followStallMs))) return true;
      why = await this.look();
      if (!why || w.done) return false;
    }
    if (this.delivered !== 0) return false; // an event came meanwhile: the run exists
    w.ended = why;
    msgs.stop();
    return true;
  }

  /**
   * Why a follow that has delivered nothing should end, or null (the run is
   * there, something was delivered, or a read failed: no answer): its
   * run_finished is stored before the cursor (FINISHED_BEFORE); its record
   * says it finished and none of its events is stored (EventsGoneError); it
   * has no stored event, record or request (RunNotFoundError, when the run
   * must exist).
   */
  async look() {
    const { client, run, follower: f } = this;
    let last;
    try {
      last = await client.lastEvent(run);
    } catch {
      return null;
    }
    if (this.delivered !== 0) return null;
    if (last) return last.seq < f.from && isRunFinished(last.data) ? (this.missingLooks++, FINISHED_BEFORE) : null;
    /** @type {any} */
    let rec = null;
    try {
      rec = await client.status(run);
    } catch (err) {
      if (!(err instanceof RunNotFoundError)) return null;
    }
    if (rec && !isFinished(rec.state)) return null;
    // Read again after the record: events stored before a finished record
    // was read are not taken for gone.
    let stored;
    try {
      stored = await client.lastEventSeq(run);
    } catch {
      return null;
    }
    if (stored !== 0 || this.delivered !== 0) return null;
    if (!rec && !this.mustExist) return null;
    this.missingLooks++;
    return rec ? new EventsGoneError(run, `run finished (${rec.state}) but its events are no longer stored`, { state: rec.state }) : new RunNotFoundError(run);
  }
}
