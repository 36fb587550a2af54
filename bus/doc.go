// Package bus is agentfleet's wire protocol (v1, see ProtocolVersion) on
// NATS JetStream and a small client for it: what a client needs, and
// nothing more. It links no nats-server (natsembed has the embedded server)
// and no model provider, and it does not run agents (the worker does).
//
// bus owns:
//
//   - the names: subjects, stream, consumer and KV bucket names, all derived
//     from a subject prefix (default "agents"); see Names;
//   - the validation of run ids and queue names ([A-Za-z0-9_-]{1,64}), which
//     is also the guard against subject injection;
//   - the JSON of the protocol: the run request (RunRequest, decoded and
//     validated with readable errors and size limits by DecodeRunRequest),
//     the event envelope (Envelope, DecodeEnvelope, AppendJSON), the wire
//     form of agent events (AgentEvent), the fleet events (RunStarted,
//     RunFinished, RunResumed), control messages as clients send them
//     (Control) and the run record (RunRecord);
//   - the receiver-side reducer (Transcript) that rebuilds a run's transcript
//     and its partial assistant message from envelopes, skipping event types
//     it does not know;
//   - the client operations, one file each: connecting (connect.go: Connect,
//     ConnectOptions), the streams (streams.go: EnsureStreams, which only
//     ever widens what exists), submitting and following (submit.go: Submit,
//     Follow, ReadEvents, LoadTranscript), controls and records (controls.go:
//     Steer, FollowUp, Abort, Status, List).
//
// What only a worker needs (decoding controls into agent messages, crash
// recovery, message ids) is in internal/workerproto. docs/protocol.md is the
// normative description of the protocol.
package bus
