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

// HeaderWokenFrom marks a wake (since 1.9): a copy of a parked run's request,
// published by a worker when an answer or an abort came (or a parked call's
// approval timed out). Its value is the record's parked.seq; a request
// whose header the record does not confirm is dropped (docs/protocol.md).
const HeaderWokenFrom = "Agentfleet-Woken-From"

// HeaderWakeKey (since 1.10) is a random key a worker puts on a parked
// run's kept request copy (AGENTS_PARKED, which only workers read); a
// wake carries it, and a wake without the kept copy's key is dropped: the
// run's owner has the request's bytes, and could otherwise wake its
// parked run with no answer (docs/protocol.md §13, Parking).
const HeaderWakeKey = "Agentfleet-Wake-Key"

// HeaderParkedState (since 1.10) carries a parked run's events, as its
// parking attempt stored them, on the kept request copy and on its wakes:
// the woken attempt resumes from it instead of reading the run's events.
// Its value is base64 (standard, padded) of the gzip of a JSON array of
// the event envelopes in stream order; the record's parked.state is its
// SHA-256, and a wake whose value does not match it reads the events.
const HeaderParkedState = "Agentfleet-Parked-State"
