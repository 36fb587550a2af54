// Names of the protocol (docs/protocol.md §1): subjects, streams and the
// bucket derived from a subject prefix, and the checks that keep ids and
// queue names valid subject tokens.
import { InvalidArgumentError } from "./errors.js";

export const DEFAULT_PREFIX = "agents";
export const DEFAULT_QUEUE = "default";

const token = /^[A-Za-z0-9_-]{1,64}$/;
const controlKey = /^[A-Za-z0-9._:-]{1,128}$/;

/** @param {unknown} s */
const cut = (s) => (String(s).length > 80 ? String(s).slice(0, 80) + "…" : String(s));

/** @param {unknown} id */
export function checkRunId(id) {
  if (typeof id !== "string" || !token.test(id)) {
    throw new InvalidArgumentError(`invalid run id "${cut(id)}": it must match [A-Za-z0-9_-]{1,64}`);
  }
}

/** @param {unknown} q */
export function checkQueue(q) {
  if (typeof q !== "string" || !token.test(q)) {
    throw new InvalidArgumentError(`invalid queue name "${cut(q)}": it must match [A-Za-z0-9_-]{1,64}`);
  }
}

/** An idempotency key of a control message (submit's --key, the console's Idempotency-Key). @param {unknown} k */
export function checkControlKey(k) {
  if (typeof k !== "string" || !controlKey.test(k)) {
    throw new InvalidArgumentError(`invalid control key "${cut(k)}": it must match [A-Za-z0-9._:-]{1,128}`);
  }
}

/** A fresh run id: 26 lower-case base32 characters, as the Go client makes them. */
export function newRunId() {
  const b = new Uint8Array(16);
  globalThis.crypto.getRandomValues(b);
  const alphabet = "abcdefghijklmnopqrstuvwxyz234567";
  let out = "";
  let bits = 0;
  let value = 0;
  for (const byte of b) {
    value = (value << 8) | byte;
    bits += 8;
    while (bits >= 5) {
      out += alphabet[(value >>> (bits - 5)) & 31];
      bits -= 5;
    }
  }
  if (bits > 0) out += alphabet[(value << (5 - bits)) & 31];
  return out;
}

/** Every subject, stream and bucket name for a prefix. */
export class Names {
  /** @param {string} [prefix] */
  constructor(prefix = DEFAULT_PREFIX) {
    prefix ||= DEFAULT_PREFIX;
    for (const t of prefix.split(".")) {
      if (!token.test(t)) throw new InvalidArgumentError(`invalid subject prefix "${cut(prefix)}": use dot-separated tokens of [A-Za-z0-9_-]`);
    }
    const flat = prefix.replaceAll(".", "_");
    this.prefix = prefix;
    this.runsStream = flat.toUpperCase() + "_RUNS";
    this.eventsStream = flat.toUpperCase() + "_EVENTS";
    this.controlStream = flat.toUpperCase() + "_CONTROL";
    this.recordsBucket = flat + "_runs";
    this.recordsStream = "KV_" + flat + "_runs";
    /** The waiting-run index (since 1.9, docs/protocol.md §7). */
    this.waitingStream = flat.toUpperCase() + "_WAITING";
    /** Schedules, their fires and last runs (since 1.10, docs/protocol.md §2). */
    this.schedulesStream = flat.toUpperCase() + "_SCHEDULES";
    /** Finished runs' transcript snapshots (since 1.9, docs/protocol.md §2): an object store. */
    this.transcriptsBucket = flat + "_transcripts";
    this.transcriptsStream = "OBJ_" + flat + "_transcripts";
  }
  /**
   * The subject of run's snapshot's object info: the object's name (the
   * run id, ASCII) in padded base64url, as the object store writes it.
   * @param {string} run
   */
  snapshotMeta(run) {
    return `$O.${this.transcriptsBucket}.M.${btoa(run).replaceAll("+", "-").replaceAll("/", "_")}`;
  }
  /** The subject of a snapshot's chunks, by its object's nuid. @param {string} nuid */
  snapshotChunks(nuid) {
    return `$O.${this.transcriptsBucket}.C.${nuid}`;
  }
  /** A schedule's subject (since 1.10): kind def, fire or last. @param {string} queue @param {string} name @param {"def"|"fire"|"last"} kind */
  schedule(queue, name, kind) {
    return `${this.prefix}.schedule.${queue}.${name}.${kind}`;
  }

  /** A schedule operation's request subject (since 1.10): a worker of the queue answers. @param {string} queue @param {string} name @param {string} op */
  scheduleOp(queue, name, op) {
    return `${this.prefix}.schedop.${queue}.${name}.${op}`;
  }
  /** @param {string} queue @param {string} run */
  submit(queue, run) {
    return `${this.prefix}.submit.${queue}.${run}`;
  }
  /**
   * The subject of a request of this priority and tenant (since 1.10,
   * docs/protocol.md §3 Priority lanes): the old subject for normal or none
   * without a tenant, else the lane, tenant token "_" when the tenant is no
   * valid token (workers share slots fairly between tenant lanes).
   * @param {string} queue @param {string | undefined} priority @param {string} run @param {string} [tenant]
   */
  request(queue, priority, run, tenant) {
    const t = tenant && tenant !== "_" && /^[A-Za-z0-9_-]{1,64}$/.test(tenant) ? tenant : "_";
    const p = priority || "normal";
    if (p === "normal" && t === "_") return this.submit(queue, run);
    return `${this.prefix}.lane.${queue}.${p}.${t}.${run}`;
  }
  /** @param {string} run */
  events(run) {
    return `${this.prefix}.run.${run}.events`;
  }
  /** @param {string} run @param {string} kind */
  control(run, kind) {
    return `${this.prefix}.run.${run}.${kind}`;
  }
  /** @param {string} run */
  record(run) {
    return `$KV.${this.recordsBucket}.${run}`;
  }
  /** @param {string} subject @returns {{queue: string, run: string, priority?: any} | null} */
  parseSubmit(subject) {
    const lane = this.prefix + ".lane.";
    if (subject.startsWith(lane)) {
      // <queue>.<priority>.<tenant>.<run> (since 1.10)
      const [queue, priority, tenant, run, ...rest] = subject.slice(lane.length).split(".");
      if (rest.length || !token.test(queue ?? "") || !["high", "normal", "low"].includes(priority ?? "") || !token.test(tenant ?? "") || !token.test(run ?? "")) return null;
      return { queue, run, priority };
    }
    const head = this.prefix + ".submit.";
    if (!subject.startsWith(head)) return null;
    const [queue, run, ...rest] = subject.slice(head.length).split(".");
    if (rest.length || !token.test(queue ?? "") || !token.test(run ?? "")) return null;
    return { queue, run };
  }
}
