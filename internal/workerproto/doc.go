// Package workerproto is the worker's half of the bus protocol: what only a
// worker writes or reads, kept out of bus so that clients stay small.
//
//   - events: the Nats-Msg-Id of an envelope (MsgID) and the wire form of an
//     agent event (NewAgentEvent);
//   - controls: decoding a steer or follow-up into the user message it
//     queues (DecodeUserControl), an abort's reason (DecodeAbort), and the
//     kind of a control subject (ControlKind);
//   - recovery: what a new attempt restores from the events of earlier
//     attempts (Recover, EndsWithAnswer).
package workerproto
