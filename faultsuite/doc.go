// Package faultsuite is agentfleet's fault-injection suite: it runs the real
// worker binary and real nats-server processes (both built from this
// module) on loopback ports and kills, stops, restarts and partitions them
// while runs are in flight, then checks that no run and no user message was
// lost or doubled.
//
// The tests are behind the build tag "fault", so the default "go test ./..."
// stays fast; .ci/run runs them with
//
//	go test -tags fault -count=1 -timeout 30m ./faultsuite/
//
// Knobs (environment): FAULT_SEED (random seed, printed by every scenario),
// FAULT_ACK_WAIT (worker --ack-wait, default 4s; heartbeats go every
// ack-wait/4), FAULT_KEEP=1 (keep process logs and stores under
// $TMPDIR/agentfleet-faultsuite-*), FAULT_RACE=1 (build the worker with
// -race). Each scenario prints what it checked.
package faultsuite
