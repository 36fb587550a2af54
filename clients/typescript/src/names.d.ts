export declare const DEFAULT_PREFIX: "agents";
/** A schedule operation (since 1.10), the last token of its request subject. */
export type ScheduleOp = "create" | "replace" | "pause" | "resume" | "delete" | "trigger";
export declare const DEFAULT_QUEUE: "default";
/** Throws an InvalidArgumentError unless id matches [A-Za-z0-9_-]{1,64}. */
export declare function checkRunId(id: unknown): asserts id is string;
/** Throws an InvalidArgumentError unless q matches [A-Za-z0-9_-]{1,64}. */
export declare function checkQueue(q: unknown): asserts q is string;
/** Throws an InvalidArgumentError unless k matches [A-Za-z0-9._:-]{1,128}. */
export declare function checkControlKey(k: unknown): asserts k is string;
/** A fresh run id: 26 lower-case base32 characters. */
export declare function newRunId(): string;
/** Every subject, stream and bucket name for a subject prefix (docs/protocol.md §1). */
export declare class Names {
  constructor(prefix?: string);
  readonly prefix: string;
  readonly runsStream: string;
  readonly eventsStream: string;
  readonly controlStream: string;
  readonly recordsBucket: string;
  readonly recordsStream: string;
  /** The waiting-run index stream (since 1.9). */
  readonly waitingStream: string;
  /** Schedules, their fires and last runs (since 1.10). */
  readonly schedulesStream: string;
  /** Finished runs' transcript snapshots (since 1.9, §2): the object store and its stream. */
  readonly transcriptsBucket: string;
  readonly transcriptsStream: string;
  /** The subject of a run's snapshot's object info. */
  snapshotMeta(run: string): string;
  /** The subject of a snapshot's chunks, by its object's nuid. */
  snapshotChunks(nuid: string): string;
  /** A schedule's subject (since 1.10). */
  schedule(queue: string, name: string, kind: "def" | "fire" | "last"): string;
  /** A schedule operation's request subject (since 1.10), answered by a worker of the queue. */
  scheduleOp(queue: string, name: string, op: ScheduleOp): string;
  submit(queue: string, run: string): string;
  /** The subject of a request of this priority and tenant (since 1.10): the old subject for normal or none without a tenant, else agents.lane.<queue>.<priority>.<tenant or _>.<run>. */
  request(queue: string, priority: "high" | "normal" | "low" | undefined, run: string, tenant?: string): string;
  events(run: string): string;
  control(run: string, kind: string): string;
  record(run: string): string;
  parseSubmit(subject: string): { queue: string; run: string; priority?: "high" | "normal" | "low" } | null;
}
