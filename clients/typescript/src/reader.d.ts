import type { AssistantMessage, Event, Message, RunFinishedEvent, RunResumedEvent, RunStartedEvent, TranscriptRestoredEvent, Envelope as WireEnvelope } from "../types/protocol.js";
import type { GapError } from "./errors.js";

/** The envelope's JSON text as received (formatEnvelope uses it). */
export declare const RAW: unique symbol;

/** An envelope as follow yields it: the wire envelope, its AGENTS_EVENTS stream sequence, and its text. */
export type Envelope<E extends { type: string } = Event> = Omit<WireEnvelope, "event"> & {
  event: E;
  /** The AGENTS_EVENTS sequence (the console's SSE id): resume after it with {from: streamSeq + 1}. */
  streamSeq: number;
  [RAW]?: string;
};

/** An event of a type this version does not know (follow yields them only with includeUnknown). */
export type UnknownEvent = { type: string; [field: string]: unknown };

/** Where a follow stands: pass it as follow's options to go on from there. */
export type Cursor = {
  /** The AGENTS_EVENTS stream sequence to read next (1: from the start). */
  from?: number;
  /** The newest attempt taken. */
  attempt?: number;
  /** The last seq taken of that attempt. */
  seq?: number;
  /** The run's run_finished was taken: a follow resumed from this cursor ends at once, reading nothing. */
  finished?: boolean;
};
/** A follow's cursor as cursor() reports it: finished is there once the run's run_finished was taken. */
export type FollowCursor = Required<Omit<Cursor, "finished">> & { finished?: true };

export declare function isKnownEventType(type: string): boolean;
/** Decodes an envelope's JSON text; throws a DecodeError unless it is an envelope with an event type. */
export declare function decodeEnvelope(text: string, run: string, streamSeq?: number): Envelope<Event | UnknownEvent>;

/** The readers' rules of docs/protocol.md §4 over a run's envelopes in stream order. */
export declare class Follower {
  constructor(run: string, cursor?: Cursor);
  readonly run: string;
  from: number;
  attempt: number;
  seq: number;
  finished: boolean;
  /** Resumed mid-stream without the state (a cursor with from alone): the first envelope taken cannot tell a gap. */
  blind: boolean;
  cursor(): FollowCursor;
  /** A message at this stream sequence was read. */
  read(streamSeq: number): void;
  /** Whether to take the envelope (false: an older attempt's, a copy, or after run_finished), and a gap before it. */
  accept(env: { attempt: number; seq: number; event: { type: string } }): { take: boolean; gap?: GapError };
}

/** A string as Go's encoding/json writes it (HTML-safe). */
export declare function goString(s: string): string;
/** JSON text as Go's json.Compact with HTML escaping leaves it. */
export declare function goCompact(s: string): string;
/** The text of a top-level member's value in an object's JSON text. */
export declare function rawMember(s: string, key: string): string | undefined;
/** The envelope as one line of `submit follow --json` (without the newline): byte for byte for envelopes read from the stream. */
export declare function formatEnvelope(env: Partial<Omit<WireEnvelope, "event">> & { event: unknown; [RAW]?: string }): string;

/** Folds a run's envelopes into its transcript (the Go client's bus.Transcript). */
export declare class Transcript {
  messages: Message[];
  started: RunStartedEvent | null;
  resumed: RunResumedEvent | null;
  /** transcript_restored (since 1.9): the run this one continues, whose first `messages` messages are not among `messages`; null without continueFrom. */
  restored: TranscriptRestoredEvent | null;
  finished: RunFinishedEvent | null;
  /** The successful compaction_end events (since 1.10), in order; from the last on the model was sent its summary and the messages from its firstKeptIndex. */
  compactions: import("../types/protocol.js").CompactionEndEvent[];
  attempt: number;
  lastSeq: number;
  /** The assistant message being streamed, or null. */
  partial: AssistantMessage | null;
  /** The usage of earlier attempts' model calls the messages do not have (run_resumed's cutOffUsage, since 1.8). */
  cutOffUsage: import("../types/protocol.js").Usage | null;
  apply(env: { attempt: number; seq: number; event: Event | UnknownEvent }): void;
  /** The text of the last assistant message. */
  finalText(): string;
}
/** The text blocks of a message, joined. */
export declare function textOf(m: { content?: unknown }): string;
/** Folds one assistant stream step into a partial message. */
export declare function applyStreamEvent(msg: AssistantMessage, ev: import("../types/protocol.js").AssistantMessageEvent): void;

/** A gated tool call waiting for its answer (§13). */
export type PendingCall = {
  run: string;
  queue?: string;
  /** The run's record's title (approvals, approvalsPage). */
  title?: string;
  toolCallId: string;
  toolName: string;
  /** The arguments the model chose. */
  args?: Record<string, unknown>;
  requestedAt: Date;
  waitingSince: Date;
  expiresAt?: Date;
};
/** The pending gated calls of a run's envelopes in stream order. */
export declare function pendingCalls(envs: Iterable<{ run: string; attempt: number; seq: number; ts: number; event: Event | UnknownEvent }>): PendingCall[];
