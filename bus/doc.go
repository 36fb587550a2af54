// Package bus is agentfleet's wire protocol (v1) on NATS JetStream and a
// small client for it. It is used by the worker, by cmd/submit and by tests.
//
// bus owns:
//
//   - the names: subjects, stream, consumer and KV bucket names, all derived
//     from a subject prefix (default "agents"); see Names;
//   - the validation of run ids and queue names ([A-Za-z0-9_-]{1,64}), which
//     is also the guard against subject injection;
//   - the JSON of the protocol: the run request (RunRequest, decoded and
//     validated with readable errors and size limits by DecodeRunRequest),
//     the event envelope (Envelope), the wire form of agent events
//     (AgentEvent), the fleet events (RunStarted, RunFinished, RunResumed),
//     control messages (Control) and the run record (RunRecord);
//   - the receiver-side reducer (Transcript) that rebuilds a run's transcript
//     and its partial assistant message from envelopes;
//   - the client operations: Connect, EnsureStreams, Submit, Follow, Steer,
//     FollowUp, Abort, Status, List;
//   - an embedded nats-server with JetStream (StartServer) for tests and the
//     worker's default.
//
// bus does not run agents and does not import any model provider: the worker
// does that. docs/protocol.md is the normative description of the protocol.
package bus
