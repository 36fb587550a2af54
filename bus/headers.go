package bus

// Dead-letter headers: a request whose deliveries ran out is published to
// the dead-letter subject with these (docs/protocol.md, give-up).
const (
	HeaderDeadReason     = "Agentfleet-Dead-Reason"
	HeaderDeadDeliveries = "Agentfleet-Deliveries"
	HeaderDeadSubject    = "Agentfleet-Subject"
	HeaderDeadRequestSeq = "Agentfleet-Request-Seq"
)

// Requeue headers: a request whose deliveries ran out while its run was
// waiting (handed back by drains) is published again; the copy names the
// request it replaces and the attempts already used.
const (
	HeaderRequeuedFrom = "Agentfleet-Requeued-From"
	HeaderAttemptBase  = "Agentfleet-Attempt-Base"
)
