// Errors of the client. Each has a stable `code` to test in catch blocks
// (err.code === "run_not_found") besides its class; the message says what
// to do. No NATS import: the console entry point uses them too.

export class AgentfleetError extends Error {
  /**
   * @param {string} code
   * @param {string} message
   * @param {ErrorOptions} [options]
   */
  constructor(code, message, options) {
    super(message, options);
    this.name = new.target.name;
    this.code = code;
  }
}

/** An argument the protocol refuses (a run id, a queue name, a control key, an empty text). */
export class InvalidArgumentError extends AgentfleetError {
  /** @param {string} message */
  constructor(message) {
    super("invalid_argument", message);
  }
}

/** Neither a record nor a request has this run id. */
export class RunNotFoundError extends AgentfleetError {
  /** @param {string} run */
  constructor(run) {
    super("run_not_found", `no such run: ${run} (neither a record nor a queued request has this id)`);
    this.run = run;
  }
}

/** The request names a queue no worker has declared: nothing would take it. */
export class UnknownQueueError extends AgentfleetError {
  /** @param {string} queue @param {string} run @param {ErrorOptions} [options] */
  constructor(queue, run, options) {
    super(
      "queue_not_declared",
      `submit ${run}: queue "${queue}" is not declared: no worker has ever served it, so nothing would take the request ` +
        `(start a worker with --queue ${queue}; see docs/protocol.md §2)`,
      options,
    );
    this.queue = queue;
  }
}

/** NATS answers, but JetStream does not (a server without JetStream, or one that is starting or recovering). */
export class JetStreamUnavailableError extends AgentfleetError {
  /** @param {string} what @param {ErrorOptions} [options] */
  constructor(what, options) {
    super(
      "jetstream_unavailable",
      `${what}: JetStream is not answering (no responders or a timeout from $JS.API): the NATS server runs without JetStream, ` +
        `or it is starting, recovering or has lost its quorum; retry later`,
      options,
    );
  }
}

/** JetStream answers but the fleet's streams do not exist: no worker has run against this server. */
export class NoStreamsError extends AgentfleetError {
  /** @param {string} stream @param {ErrorOptions} [options] */
  constructor(stream, options) {
    super(
      "no_streams",
      `stream ${stream} does not exist: no agentfleet worker has run against this NATS server yet (a worker creates the streams; start one)`,
      options,
    );
    this.stream = stream;
  }
}

/** No NATS server could be reached (connect). */
export class NatsUnreachableError extends AgentfleetError {
  /** @param {string} servers @param {ErrorOptions} [options] */
  constructor(servers, options) {
    const cause = options?.cause instanceof Error ? `: ${options.cause.message}` : "";
    super("nats_unreachable", `cannot reach NATS at ${servers}${cause} (start a local fleet with: go run ./cmd/worker)`, options);
  }
}

/** The run has finished: a control message would be ignored, so it was not sent. */
export class RunFinishedError extends AgentfleetError {
  /** @param {string} run @param {string} state @param {string} kind */
  constructor(run, state, kind) {
    super("run_finished", `run ${run} is ${state}: the ${kind} was not sent (control messages reaching a finished run are ignored)`);
    this.run = run;
    this.state = state;
  }
}

/** Another request already holds this run id (another queue or another body). */
export class RunIdTakenError extends AgentfleetError {
  /** @param {string} message */
  constructor(message) {
    super("run_id_taken", message);
  }
}

/**
 * A follow that cannot deliver what it was asked for because the events are
 * no longer stored (AGENTS_EVENTS drops them past its max age or byte
 * limit): a run whose record says it finished but none of whose events is
 * stored (the Go client's bus.ErrEventsGone, with its text), or a follow
 * resumed from a stream sequence the stream no longer holds.
 */
export class EventsGoneError extends AgentfleetError {
  /** @param {string} run @param {string} detail what is gone, after "follow <run>: " @param {{state?: string, from?: number}} [fields] */
  constructor(run, detail, fields = {}) {
    super("events_gone", `follow ${run}: ${detail}`);
    this.run = run;
    /** The finished run's state, when its record says it finished. */
    this.state = fields.state;
    /** The stream sequence the follow was to start at, when that is gone. */
    this.from = fields.from;
  }
}

/** Envelopes are missing in an attempt's seq (a stream limit, a bug): reported, and following goes on. */
export class GapError extends AgentfleetError {
  /** @param {string} run @param {number} attempt @param {number} want @param {number} got */
  constructor(run, attempt, want, got) {
    super("gap", `run ${run} attempt ${attempt}: events ${want}..${got - 1} missing`);
    Object.assign(this, { run, attempt, want, got });
  }
}

/** An envelope that does not decode: skipped, and following goes on. */
export class DecodeError extends AgentfleetError {
  /** @param {string} run @param {string} message */
  constructor(run, message) {
    super("decode", `run ${run}: ${message}`);
    this.run = run;
  }
}

/** A console answered with an error status. */
export class ConsoleError extends AgentfleetError {
  /** @param {number} status @param {string} message */
  constructor(status, message) {
    const code =
      status === 404 ? "run_not_found" : status === 409 ? "run_finished" : status === 401 ? "unauthorized" : status === 403 ? "forbidden" : `http_${status}`;
    super(code, message);
    this.status = status;
  }
}

/**
 * A schedule operation a worker refused or could not do (since 1.10,
 * docs/protocol.md §2 Schedules), by code: schedule_invalid (problems
 * lists every problem), schedule_not_found, schedule_exists,
 * schedule_ambiguous (the name is on several queues), schedule_failed
 * (NATS trouble: retry), schedule_no_worker (no worker of the queue
 * answers: start one with --queue).
 */
export class ScheduleError extends AgentfleetError {
  /**
   * @param {string} code
   * @param {string} message
   * @param {{name: string, op: string, queue?: string, problems?: string[]}} fields
   * @param {ErrorOptions} [options]
   */
  constructor(code, message, fields, options) {
    super(code, message, options);
    this.schedule = fields.name;
    this.op = fields.op;
    this.queue = fields.queue;
    this.problems = fields.problems ?? [];
  }
}
