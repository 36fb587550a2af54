// Types of @agentfleet/client/console (src/console.js): no NATS import.
import type { Event, RunRecord, RunRequest } from "../types/protocol.js";
import type { Cursor, FollowCursor, Envelope, UnknownEvent } from "./reader.js";

export * from "./errors.js";
export { checkControlKey, checkQueue, checkRunId, newRunId } from "./names.js";
export { applyStreamEvent, decodeEnvelope, Follower, formatEnvelope, isKnownEventType, pendingCalls, RAW, textOf, Transcript } from "./reader.js";
export type { Cursor, Envelope, PendingCall, UnknownEvent } from "./reader.js";
export { EVENT_TYPES, PROTOCOL_VERSION, STREAM_EVENT_TYPES } from "./protocol.js";
export type * from "../types/protocol.js";

export type ConsoleClientOptions = {
  /** The console's URL, e.g. http://127.0.0.1:8080 (default "": this page's origin). */
  baseUrl?: string;
  /** A bearer token (--auth-token-file), sent as Authorization; in a browser the console's cookie (after /?token=) does as well. */
  token?: string;
  /** Extra headers of every request (e.g. basic auth). */
  headers?: Record<string, string>;
  /** default globalThis.fetch */
  fetch?: typeof fetch;
  /** default "same-origin" */
  credentials?: RequestCredentials;
  /** How long a follow of a run the console does not know waits before it looks again (default 5000 ms; then a RunNotFoundError). */
  followStallMs?: number;
};

export type ConsoleFollowOptions = Cursor & {
  includeUnknown?: boolean;
  /** End with a RunNotFoundError when the console does not know the run (GET /api/runs/{id}), now and one stall interval later; default true from the start. */
  mustExist?: boolean;
  signal?: AbortSignal;
  onWarning?: (err: Error) => void;
};

export type Session = { user: string; allowControl: boolean; csrf: string; prefix: string };

/** Server-Sent Events read from a fetch response body. */
export declare function readSSE(body: ReadableStream<Uint8Array>): AsyncGenerator<{ event: string; id: string; data: string }>;

export declare class ConsoleFollowStream implements AsyncIterable<Envelope<Event>> {
  readonly run: string;
  readonly warnings: Error[];
  /** Times the event stream was opened (1 + reconnects). */
  readonly connects: number;
  cursor(): FollowCursor;
  close(): void;
  [Symbol.asyncIterator](): AsyncGenerator<Envelope<Event>, void, undefined>;
}

export declare class ConsoleClient {
  constructor(opts?: ConsoleClientOptions);
  readonly baseUrl: string;
  session(fresh?: boolean): Promise<Session>;
  status(run: string): Promise<RunRecord & { stale?: boolean }>;
  list(opts?: { state?: string; queue?: string; q?: string; limit?: number; after?: number }): Promise<{ version: number; runs: RunRecord[]; total: number; ready: boolean }>;
  follow(run: string, opts?: ConsoleFollowOptions & { includeUnknown?: false }): ConsoleFollowStream;
  follow(run: string, opts: ConsoleFollowOptions & { includeUnknown: true }): AsyncIterable<Envelope<Event | UnknownEvent>> & Omit<ConsoleFollowStream, typeof Symbol.asyncIterator>;
  submit(request: RunRequest, opts?: { queue?: string }): Promise<{ id: string; queue: string; seq: number; duplicate: boolean }>;
  steer(run: string, text: string, opts?: { key?: string }): Promise<{ seq: number }>;
  followUp(run: string, text: string, opts?: { key?: string }): Promise<{ seq: number }>;
  abort(run: string, opts?: { reason?: string; key?: string }): Promise<{ seq: number }>;
  /** POST /api/runs/{id}/approve with the protocol's answer body; 409 when the call does not wait, 422 when its schema refuses the edit. */
  approve(run: string, toolCallId: string, opts?: { reason?: string; arguments?: Record<string, unknown>; key?: string }): Promise<{ seq: number }>;
  deny(run: string, toolCallId: string, opts?: { reason?: string; key?: string }): Promise<{ seq: number }>;
  answer(run: string, toolCallId: string, decision: "approve" | "deny", opts: { reason?: string; arguments?: Record<string, unknown>; key?: string }): Promise<{ seq: number }>;
}
