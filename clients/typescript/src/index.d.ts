// Types of @agentfleet/client (src/index.js). The protocol's own types are
// generated from the JSON Schema: ../types/protocol.d.ts.
import type { NatsConnection } from "@nats-io/transport-node";
import type { JetStreamClient, JetStreamManager } from "@nats-io/jetstream";
import type { ControlMessage, Event, Message, RunRecord as WireRunRecord, RunRequest, Schedule, Usage } from "../types/protocol.js";
import type { Cursor, FollowCursor, Envelope, PendingCall, Transcript, UnknownEvent } from "./reader.js";
import type { Names, ScheduleOp } from "./names.js";

export * from "./errors.js";
export * from "./names.js";
export * from "./reader.js";
export * from "./protocol.js";
export type * from "../types/protocol.js";
// The reader's Envelope (with streamSeq) is the one follow yields; the
// wire type stays available as WireEnvelope.
export type { Envelope } from "./reader.js";
export type { Envelope as WireEnvelope } from "../types/protocol.js";

export declare const DEFAULT_STALE_AFTER_MS: number;
export declare const DEFAULT_FOLLOW_STALL_MS: number;

export type ConnectOptions = {
  /** NATS server URL(s), an array or comma-separated [NATS_URL] (default nats://127.0.0.1:4222). */
  servers?: string | string[];
  /** Subject prefix [AGENTS_PREFIX] (default agents). */
  prefix?: string;
  /** Connection name shown in server monitoring (default agentfleet-ts). */
  name?: string;
  /** [NATS_USER], [NATS_PASSWORD] */
  user?: string;
  pass?: string;
  /** [NATS_TOKEN] */
  token?: string;
  /** A .creds file (JWT and seed) [NATS_CREDS]. */
  credsFile?: string;
  /** A file holding an NKey user seed [NATS_NKEY]. */
  nkeyFile?: string;
  /** An authenticator of @nats-io/transport-node, instead of the above. */
  authenticator?: unknown;
  /** [NATS_CA], [NATS_CERT], [NATS_KEY] */
  tls?: { caFile?: string; certFile?: string; keyFile?: string };
  /** Connect timeout in ms (default 5000). */
  timeout?: number;
  staleAfterMs?: number;
  followStallMs?: number;
  /** The environment to read (default process.env). */
  env?: Record<string, string | undefined>;
};

/** Connects to NATS (reconnecting forever) and returns a client that owns the connection. A NatsUnreachableError when no server answers. */
export declare function connect(opts?: ConnectOptions): Promise<Client>;

/** Whether a NATS or JetStream failure is one a reconnect or JetStream's recovery cures. */
export declare function isTransient(err: unknown): boolean;

export type SubmitOptions = {
  /** The queue (default "default"): a queue no worker declared is an UnknownQueueError. */
  queue?: string;
  /** The run id (default request.id, else a fresh one): the idempotency key of the submit. */
  id?: string;
  /** Extra NATS headers (e.g. traceparent). */
  headers?: Record<string, string>;
};

export type SubmitResult = {
  id: string;
  queue: string;
  /** The AGENTS_RUNS sequence of the request. */
  seq: number;
  /** A request with this id was already stored (and it is this one): nothing was stored now. */
  duplicate: boolean;
};

export type ControlOptions = {
  /**
   * Idempotency key ([A-Za-z0-9._:-]{1,128}; submit's --key, the console's
   * Idempotency-Key): the message goes out with Nats-Msg-Id
   * "<run>:<kind>:<key>", so a retry with the same key and body within the
   * control stream's duplicate window (2 minutes) is stored once and
   * answers the first copy's sequence, even once the run has finished.
   */
  key?: string;
  headers?: Record<string, string>;
};

export type ControlResult = {
  /** The AGENTS_CONTROL sequence (the controlSeq of the user message it becomes). */
  seq: number;
  /** A retry: the first copy's sequence. */
  duplicate: boolean;
};

/** A run record as status and list return it (queued: a request without a record). */
/** A run's transcript snapshot (§2 Transcript snapshots). */
export interface Snapshot {
  /** run, attempt (the one that finished the run), messages, bytes (the body's size), from (the run it continued, or ""). */
  header: { run: string; attempt: number; messages: number; bytes: number; from: string };
  messages: Message[];
}

export type RunRecord = Omit<WireRunRecord, "state"> & {
  state: WireRunRecord["state"];
  /** The KV revision (records stream sequence) it was read at; not enumerable. */
  readonly revision?: number;
};

export type FollowOptions = Cursor & {
  /** Yield envelopes of event types this version does not know (as `submit follow --json` prints them); default false: skipped, as docs/protocol.md asks of readers. */
  includeUnknown?: boolean;
  /**
   * End with a RunNotFoundError when the run has no request, record or
   * event at the start and again one stall interval (5 s) later, while
   * nothing was delivered (docs/protocol.md §4, "A run that does not
   * exist"); default true when following from the start. false: wait for
   * the run however long.
   */
  mustExist?: boolean;
  /**
   * Stops the follow at once, whatever it waits for (its consumer's
   * creation included): the loop ends with the signal's reason thrown; an
   * already aborted signal throws it before anything is asked.
   */
  signal?: AbortSignal;
  /** Problems that do not stop the follow: a GapError, a DecodeError. */
  onWarning?: (err: Error) => void;
};

/** One follow of a run: iterate it once with for await. */
export declare class FollowStream implements AsyncIterable<Envelope<Event>> {
  readonly run: string;
  /** Problems that did not stop the follow (gaps, envelopes that did not decode). */
  readonly warnings: Error[];
  /** Where to resume: pass it to follow. */
  cursor(): FollowCursor;
  /** Ends the iteration at once, whatever it waits for; a consumer still being created is deleted once made (Client.close waits for that). */
  close(): void;
  [Symbol.asyncIterator](): AsyncGenerator<Envelope<Event>, void, undefined>;
}

export type ListOptions = {
  /** "" for all; queued, running, succeeded, failed, aborted, stale, waiting. */
  state?: "" | "queued" | "running" | "succeeded" | "failed" | "aborted" | "stale" | "waiting";
  /** With state "waiting": only the records waiting for this ("approval", "model"). */
  waitingFor?: string;
  queue?: string;
  /** 0: no limit. */
  limit?: number;
  /** A page's nextCursor (or its next, a records-stream sequence), or a time: records last written before it. With state "waiting" and no before or since, pages come from the waiting index (since 1.9), the oldest wait first, with "w.<seq>" cursors. */
  before?: string | number | Date;
  /** Records last written at or after this time. */
  since?: Date;
  /** Records read at most (default 100,000); -1: no bound. */
  maxScan?: number;
};

export type ApprovalsOptions = {
  queue?: string;
  /** Runs a page lists at most; 0 (default): no bound. */
  limit?: number;
  /** A page's nextCursor. */
  before?: string;
  /** Records read at most (default 100,000); -1: no bound. */
  maxScan?: number;
};

export type ApprovalsPage = {
  calls: PendingCall[];
  /** Pass as before for the next page; "" at the end. */
  nextCursor: string;
  scanned: number;
  truncated: boolean;
};

export type RunPage = {
  records: RunRecord[];
  /** The records-stream sequence below which the next page's records are; 0 when nothing older is left. It skips the queued runs a full page left: page with nextCursor. */
  next: number;
  /** Pass as before for the next page: every run listed once, queued ones too, except one whose record is rewritten between pages of queued runs (§7, Listing runs); "" at the end. */
  nextCursor: string;
  scanned: number;
  /** maxScan stopped the read before limit matches, or, on a page of queued runs, before the read of the records written since the listing began reached its start (runs picked up since may then be missing from the page). A truncated page still has a nextCursor unless nothing is left: when the read above top spent maxScan, it points at the records. */
  truncated: boolean;
};

export type RunResult = {
  run: string;
  status: "succeeded" | "failed" | "aborted";
  reason: string;
  error: string;
  /** The text of the last assistant message. */
  text: string;
  turns: number;
  usage: Usage;
  cost: number;
  messages: Message[];
};

/**
 * A schedule's definition to create or replace (since 1.10, docs/protocol.md
 * §2 Schedules): queue defaults to "default"; the worker sets createdAt and
 * updatedAt. Exactly one of cron (+ timeZone), every, at.
 */
export type ScheduleInput = Omit<Schedule, "queue" | "request" | "createdAt" | "updatedAt"> & {
  queue?: string;
  /** The run request each fire submits, without id. */
  request: Omit<RunRequest, "id">;
};

/** Options of the schedule operations. */
export type ScheduleOpOptions = {
  /** How long to wait for a worker's reply (default 30 s). */
  timeoutMs?: number;
};

export declare class Client {
  /** Wraps a connection; close() closes it only when own is true. */
  constructor(nc: NatsConnection, opts?: { prefix?: string; staleAfterMs?: number; followStallMs?: number; own?: boolean });
  readonly nc: NatsConnection;
  readonly js: JetStreamClient;
  readonly names: Names;
  staleAfterMs: number;
  followStallMs: number;
  close(): Promise<void>;
  jsm(): Promise<JetStreamManager>;

  /** Stores a run request (§3); errors: UnknownQueueError, RunIdTakenError, JetStreamUnavailableError, NoStreamsError. */
  submit(request: RunRequest, opts?: SubmitOptions): Promise<SubmitResult>;
  /** A run's record, stale marked; queued for a request without one; RunNotFoundError for neither. */
  status(run: string): Promise<RunRecord>;
  /** Every schedule (since 1.10), by name, with its def message's sequence and its newest run. */
  schedules(): Promise<Array<Schedule & { seq: number; last: { run: string; plannedAt: string; firedAt: string; trigger?: boolean; fireSeq?: number } | null }>>;
  /**
   * Schedule operations (since 1.10): core NATS requests a worker of the
   * schedule's queue answers (only workers write AGENTS_SCHEDULES). A refusal
   * is a ScheduleError: schedule_invalid (problems: every problem),
   * schedule_not_found, schedule_exists, schedule_ambiguous, schedule_failed,
   * schedule_no_worker (no worker of the queue runs).
   * createSchedule returns the def message's sequence; replace: true stores
   * over the schedule of the same name and queue.
   */
  createSchedule(schedule: ScheduleInput, opts?: ScheduleOpOptions & { replace?: boolean }): Promise<number>;
  /** createSchedule with replace: the stored one's createdAt is kept. */
  replaceSchedule(schedule: ScheduleInput, opts?: ScheduleOpOptions): Promise<number>;
  /** Keeps the definition but nothing fires. */
  pauseSchedule(name: string, opts?: ScheduleOpOptions): Promise<void>;
  /** A paused schedule fires again (an @every one counts from the resume). */
  resumeSchedule(name: string, opts?: ScheduleOpOptions): Promise<void>;
  /** Removes the schedule; its runs are left alone. */
  deleteSchedule(name: string, opts?: ScheduleOpOptions): Promise<void>;
  /** Fires the schedule now, paused or not: the run id the fire submits. */
  triggerSchedule(name: string, opts?: ScheduleOpOptions): Promise<string>;
  /** The queue holding the schedule of the name (ScheduleError schedule_not_found, schedule_ambiguous). */
  scheduleQueue(name: string, op: string): Promise<string>;
  /** One operation on a queue's schedule: the worker's reply, or a ScheduleError. */
  scheduleOp(queue: string, name: string, op: ScheduleOp, body: object | null, timeoutMs?: number): Promise<{ seq?: number; run?: string }>;
  /** scheduleQueue, then scheduleOp. */
  scheduleOpByName(name: string, op: ScheduleOp, timeoutMs?: number): Promise<{ seq?: number; run?: string }>;
  /** A run's stored record, or null. */
  record(run: string): Promise<RunRecord | null>;
  /**
   * The run's envelopes from the start (or a cursor), live, to its
   * run_finished (§4). Ends with a RunNotFoundError (see mustExist), or an
   * EventsGoneError when the run finished and its events are no longer
   * stored, or the cursor's stream sequence is gone.
   */
  follow(run: string, opts?: FollowOptions & { includeUnknown?: false }): FollowStream;
  follow(run: string, opts: FollowOptions & { includeUnknown: true }): AsyncIterable<Envelope<Event | UnknownEvent>> & Omit<FollowStream, typeof Symbol.asyncIterator>;
  /** The envelopes stored now (since a time), in stream order; does not wait. */
  /** keep, given an envelope's JSON, says whether to keep it (the approval reads keep only what they fold). */
  storedEvents(run: string, since?: Date, keep?: (json: string) => boolean): Promise<Envelope<Event | UnknownEvent>[]>;
  /** Whether the run has none of its request, its record and a stored event. */
  absent(run: string): Promise<boolean>;
  /** The stream sequence of the run's last stored event (0: none). */
  lastEventSeq(run: string): Promise<number>;
  /** Replays the run into its transcript (waits for a running run). */
  transcript(run: string, opts?: { signal?: AbortSignal }): Promise<Transcript>;
  /** The run's outcome and final answer (waits unless wait is false). */
  result(run: string, opts?: { wait?: boolean; signal?: AbortSignal }): Promise<RunResult>;
  /**
   * A finished run's transcript snapshot (since 1.9, §2 Transcript snapshots): its
   * header and messages in one read; null when it has none to trust (read its
   * events: transcript). An error past maxBytes, or when the body does not match.
   */
  loadSnapshot(run: string, opts?: { maxBytes?: number }): Promise<Snapshot | null>;

  /** Steering, taken after the current turn. RunFinishedError once the run finished. */
  steer(run: string, text: string | ControlMessage, opts?: ControlOptions): Promise<ControlResult>;
  /** A follow-up, taken when the run would stop. */
  followUp(run: string, text: string | ControlMessage, opts?: ControlOptions): Promise<ControlResult>;
  abort(run: string, opts?: ControlOptions & { reason?: string }): Promise<ControlResult>;
  /** Compacts the run's context at its next model call (since 1.10, §16); instructions focus the summary. */
  compact(run: string, opts?: ControlOptions & { instructions?: string }): Promise<ControlResult>;
  /** Approves a gated tool call (§13), with edited arguments if given. */
  approve(run: string, toolCallId: string, opts?: ControlOptions & { by?: string; reason?: string; arguments?: Record<string, unknown> }): Promise<ControlResult>;
  /** Denies a gated tool call; the model sees the reason. */
  deny(run: string, toolCallId: string, opts?: ControlOptions & { by?: string; reason?: string }): Promise<ControlResult>;
  sendControl(run: string, kind: "steer" | "followup" | "abort" | "approve" | "compact", body: object, opts?: ControlOptions): Promise<ControlResult>;

  /** A page of records, newest first (§7). */
  list(opts?: ListOptions): Promise<RunPage>;
  /** A run's pending gated calls. */
  pendingOf(run: string): Promise<PendingCall[]>;
  /** A waiting record's pending calls, read from its events since shortly before its oldest listed request. */
  pendingOfRecord(record: RunRecord): Promise<PendingCall[]>;
  /** The fleet's pending approvals: every page's calls (one page with limit). */
  approvals(opts?: ApprovalsOptions): Promise<PendingCall[]>;
  /** A page of the pending approvals (§13): at most limit runs, the most recently written record first; on the page the oldest request first. */
  approvalsPage(opts?: ApprovalsOptions): Promise<ApprovalsPage>;
}
