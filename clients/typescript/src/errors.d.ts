/** The base of the client's errors: `code` is stable, the message says what to do. */
export declare class AgentfleetError extends Error {
  constructor(code: string, message: string, options?: ErrorOptions);
  readonly code: string;
}
/** An argument the protocol refuses (a run id, a queue name, a control key, an empty text). */
export declare class InvalidArgumentError extends AgentfleetError {
  constructor(message: string);
  readonly code: "invalid_argument";
}
/** Neither a record nor a request has this run id. */
export declare class RunNotFoundError extends AgentfleetError {
  constructor(run: string);
  readonly code: "run_not_found";
  readonly run: string;
}
/** The request names a queue no worker has declared (docs/protocol.md §2). */
export declare class UnknownQueueError extends AgentfleetError {
  constructor(queue: string, run: string, options?: ErrorOptions);
  readonly code: "queue_not_declared";
  readonly queue: string;
}
/** NATS answers but JetStream does not: no responders or a timeout from $JS.API. */
export declare class JetStreamUnavailableError extends AgentfleetError {
  constructor(what: string, options?: ErrorOptions);
  readonly code: "jetstream_unavailable";
}
/** JetStream answers but a stream of the fleet does not exist: no worker has run against this server. */
export declare class NoStreamsError extends AgentfleetError {
  constructor(stream: string, options?: ErrorOptions);
  readonly code: "no_streams";
  readonly stream: string;
}
/** No NATS server could be reached. */
export declare class NatsUnreachableError extends AgentfleetError {
  constructor(servers: string, options?: ErrorOptions);
  readonly code: "nats_unreachable";
}
/** The run has finished: the control message was not sent. */
export declare class RunFinishedError extends AgentfleetError {
  constructor(run: string, state: string, kind: string);
  readonly code: "run_finished";
  readonly run: string;
  readonly state: string;
}
/** Another request already holds this run id. */
export declare class RunIdTakenError extends AgentfleetError {
  constructor(message: string);
  readonly code: "run_id_taken";
}
/**
 * The events a follow needs are no longer stored (past AGENTS_EVENTS' max age
 * or byte limit): a run whose record says it finished and none of whose
 * events is stored ("follow <run>: run finished (<state>) but its events are
 * no longer stored", as the Go client's bus.ErrEventsGone), or a follow
 * resumed from a stream sequence the stream no longer holds (from).
 */
export declare class EventsGoneError extends AgentfleetError {
  constructor(run: string, detail: string, fields?: { state?: string; from?: number });
  readonly code: "events_gone";
  readonly run: string;
  /** The finished run's state (succeeded, failed, aborted), when its record says it finished. */
  readonly state?: string;
  /** The stream sequence the follow was to start at, when the events from there are gone. */
  readonly from?: number;
}
/** Envelopes missing in an attempt's seq: reported (FollowOptions.onWarning), and following goes on. */
export declare class GapError extends AgentfleetError {
  constructor(run: string, attempt: number, want: number, got: number);
  readonly code: "gap";
  readonly run: string;
  readonly attempt: number;
  readonly want: number;
  readonly got: number;
}
/** An envelope that does not decode: reported, skipped, and following goes on. */
export declare class DecodeError extends AgentfleetError {
  constructor(run: string, message: string);
  readonly code: "decode";
  readonly run: string;
}
/** A console answered with an error status (404: run_not_found, 409: run_finished, 401, 403, http_<status>). */
export declare class ConsoleError extends AgentfleetError {
  constructor(status: number, message: string);
  readonly status: number;
}
/**
 * A schedule operation a worker refused or could not do (since 1.10): the
 * message names every problem of a refused definition (problems).
 */
export declare class ScheduleError extends AgentfleetError {
  constructor(code: ScheduleError["code"], message: string, fields: { name: string; op: string; queue?: string; problems?: string[] }, options?: ErrorOptions);
  readonly code: "schedule_invalid" | "schedule_not_found" | "schedule_exists" | "schedule_ambiguous" | "schedule_failed" | "schedule_no_worker";
  /** The schedule's name. */
  readonly schedule: string;
  /** The operation: create, replace, pause, resume, delete or trigger. */
  readonly op: string;
  /** The queue asked, when known. */
  readonly queue?: string;
  /** schedule_invalid: every problem the worker found; else empty. */
  readonly problems: string[];
}
