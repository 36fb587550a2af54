package bus

import (
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Priorities of a run request (since 1.10): the request field "priority"
// and the priority token of a lane subject.
const (
	PriorityHigh   = "high"
	PriorityNormal = "normal"
	PriorityLow    = "low"
)

// Priorities lists the priorities, highest first: the order in which a
// worker asks its lanes for requests.
var priorities = [...]string{PriorityHigh, PriorityNormal, PriorityLow}

// Priorities returns the priorities, highest first.
func Priorities() []string { return append([]string(nil), priorities[:]...) }

// ValidPriority reports whether p is a priority ("" is not: it means
// normal in a request, but a lane subject always names one).
func ValidPriority(p string) bool {
	return p == PriorityHigh || p == PriorityNormal || p == PriorityLow
}

// NoTenant is the tenant token of a lane subject whose request names no
// tenant lane.
const NoTenant = "_"

// Lane is where a request waits: its queue, priority and tenant token. The
// zero Priority and Tenant name the queue's old subject
// (<prefix>.submit.<queue>.<run>), which is its normal lane.
type Lane struct {
	Queue    string
	Priority string // "" for the old subject
	Tenant   string // "" for the old subject
}

// Old reports whether the lane is the queue's old subject.
func (l Lane) Old() bool { return l.Priority == "" }

// EffectivePriority is the lane's priority, normal for the old subject.
func (l Lane) EffectivePriority() string {
	if l.Priority == "" {
		return PriorityNormal
	}
	return l.Priority
}

// RecordPriority is the lane's priority as records and listings show it:
// "" for normal.
func (l Lane) RecordPriority() string {
	if l.Priority == PriorityNormal {
		return ""
	}
	return l.Priority
}

// Lanes are a queue's lanes in the order a worker asks them, highest
// priority first; the old subject is the first normal lane.
func Lanes(queue string) []Lane {
	return []Lane{
		{Queue: queue, Priority: PriorityHigh, Tenant: NoTenant},
		{Queue: queue},
		{Queue: queue, Priority: PriorityNormal, Tenant: NoTenant},
		{Queue: queue, Priority: PriorityLow, Tenant: NoTenant},
	}
}

// LaneOf is the lane a request of this priority and tenant takes: the old
// subject for normal (or none) without a tenant, so that workers before
// 1.10 take it; else the lane <priority>.<tenant>, NoTenant for a tenant
// that is no valid token (it then shares the no-tenant lane).
func LaneOf(queue, priority, tenant string) Lane {
	if priority == "" {
		priority = PriorityNormal
	}
	if !ValidTenant(tenant) {
		tenant = NoTenant
	}
	if priority == PriorityNormal && tenant == NoTenant {
		return Lane{Queue: queue}
	}
	return Lane{Queue: queue, Priority: priority, Tenant: tenant}
}

// ValidTenant reports whether t may be a tenant lane's token: a queue-like
// token ([A-Za-z0-9_-]{1,64}) other than NoTenant.
func ValidTenant(t string) bool { return t != NoTenant && tokenRE.MatchString(t) }

// TenantMetadataKey is the request metadata key whose value a client puts
// in the lane subject's tenant token: the budgets' default tenant key.
const TenantMetadataKey = "tenant"

// LaneRequest is the subject of a request in a lane (since 1.10):
// <prefix>.lane.<queue>.<priority>.<tenant>.<run>.
func (n Names) LaneRequest(queue, priority, tenant, run string) string {
	return n.prefix + ".lane." + queue + "." + priority + "." + tenant + "." + run
}

// RequestSubject is the subject of run's request in lane l.
func (n Names) RequestSubject(l Lane, run string) string {
	if l.Old() {
		return n.Submit(l.Queue, run)
	}
	return n.LaneRequest(l.Queue, l.Priority, l.Tenant, run)
}

// LaneSubjects are the subjects AGENTS_RUNS takes for a declared queue's
// lanes: <prefix>.lane.<queue>.<priority>.*.* for each priority, every
// tenant (1.10's first cut took only NoTenant; widenStream replaces those).
func (n Names) LaneSubjects(queue string) []string {
	subs := make([]string, 0, len(priorities))
	for _, p := range priorities {
		subs = append(subs, n.LaneRequest(queue, p, "*", "*"))
	}
	return subs
}

// LaneSeen is where AGENTS_RUNS republishes, headers only, every lane
// request it stores: <prefix>.laneseen.<queue>.<priority>.<tenant>.<run>.
// Workers learn tenant lanes and wake idle loops from it (worker/tenants.go).
func (n Names) LaneSeen(queue string) string { return n.prefix + ".laneseen." + queue + ".*.*.*" }

// laneSeenRepublish is AGENTS_RUNS' republish of lane requests (LaneSeen).
func (n Names) laneSeenRepublish() *jetstream.RePublish {
	return &jetstream.RePublish{Source: n.prefix + ".lane.>", Destination: n.prefix + ".laneseen.>", HeadersOnly: true}
}

// ParseLaneSeen is the lane and run of a LaneSeen subject.
func (n Names) ParseLaneSeen(subject string) (Lane, string, error) {
	rest, ok := strings.CutPrefix(subject, n.prefix+".laneseen.")
	if !ok {
		return Lane{}, "", fmt.Errorf("subject %q is not %s.laneseen.>", truncate(subject, 120), n.prefix)
	}
	return n.ParseRequest(n.prefix + ".lane." + rest)
}

// LaneConsumerConfig is the config of a lane's durable consumer. A tenant
// lane's is removed after an hour no worker pulled it (workers create it
// again on the next request they see in it).
func (n Names) LaneConsumerConfig(l Lane, ackWait time.Duration, maxDeliver, maxAckPending, replicas int) jetstream.ConsumerConfig {
	cc := jetstream.ConsumerConfig{
		Durable:       n.LaneConsumer(l),
		Description:   "agentfleet workers of queue " + l.Queue + ", lane " + l.Priority + "/" + l.Tenant,
		FilterSubject: n.LaneFilter(l),
		AckPolicy:     jetstream.AckExplicitPolicy,
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckWait:       ackWait,
		MaxDeliver:    maxDeliver,
		MaxAckPending: maxAckPending,
		Replicas:      replicas,
	}
	if l.Tenant != NoTenant {
		cc.InactiveThreshold = time.Hour
	}
	return cc
}

// LaneFilter is the filter of a lane's consumer:
// <prefix>.lane.<queue>.<priority>.<tenant>.> ('>' so that a request with a
// literal '>' run token is delivered and terminated, as QueueFilter).
func (n Names) LaneFilter(l Lane) string {
	return n.prefix + ".lane." + l.Queue + "." + l.Priority + "." + l.Tenant + ".>"
}

// LaneConsumer is the durable consumer of a lane:
// lane-<queue>-<priority>-<tenant>; the old subject's is Consumer(queue).
func (n Names) LaneConsumer(l Lane) string {
	if l.Old() {
		return n.Consumer(l.Queue)
	}
	return "lane-" + l.Queue + "-" + l.Priority + "-" + l.Tenant
}

// LaneAll matches every lane request subject: <prefix>.lane.*.*.*.*.
func (n Names) LaneAll() string { return n.prefix + ".lane.*.*.*.*" }

// LaneQueueAll matches a queue's lane request subjects:
// <prefix>.lane.<queue>.*.*.*.
func (n Names) LaneQueueAll(queue string) string { return n.prefix + ".lane." + queue + ".*.*.*" }

// ParseRequest splits a request subject, old or lane, into its lane and
// run. It fails when the subject is neither or a token is not valid.
func (n Names) ParseRequest(subject string) (Lane, string, error) {
	if rest, ok := strings.CutPrefix(subject, n.prefix+".lane."); ok {
		tok := strings.Split(rest, ".")
		if len(tok) != 4 {
			return Lane{}, "", fmt.Errorf("subject %q is not %s.lane.<queue>.<priority>.<tenant>.<run>", truncate(subject, 120), n.prefix)
		}
		l := Lane{Queue: tok[0], Priority: tok[1], Tenant: tok[2]}
		if err := CheckQueue(l.Queue); err != nil {
			return l, tok[3], err
		}
		if !ValidPriority(l.Priority) {
			return l, tok[3], fmt.Errorf("invalid priority %q in subject: use high, normal or low", truncate(l.Priority, 80))
		}
		if l.Tenant != NoTenant && !tokenRE.MatchString(l.Tenant) {
			return l, tok[3], fmt.Errorf("invalid tenant token %q in subject: it must match [A-Za-z0-9_-]{1,64}", truncate(l.Tenant, 80))
		}
		if err := CheckID(tok[3]); err != nil {
			return l, tok[3], err
		}
		return l, tok[3], nil
	}
	q, run, err := n.parseOldSubmit(subject)
	return Lane{Queue: q}, run, err
}

// CheckLane reports a request whose body asks for a priority its subject
// does not carry: a worker would otherwise run it in the wrong line
// without a word.
func (n Names) CheckLane(l Lane, req *RunRequest) error {
	want := req.Priority
	if want == "" {
		want = PriorityNormal
	}
	if want == l.EffectivePriority() {
		return nil
	}
	return fmt.Errorf("priority %q was submitted on a %s subject: publish it to %s (the request's lane, since 1.10)",
		want, l.EffectivePriority(), n.LaneRequest(l.Queue, want, l.tenantToken(), "<run>"))
}

func (l Lane) tenantToken() string {
	if l.Tenant == "" {
		return NoTenant
	}
	return l.Tenant
}

// CheckTenant reports a request in a tenant lane whose metadata names
// another tenant under key: the subject's tenant is the one an operator
// can make unforgeable (docs/security.md), and a body naming another
// would be scheduled as one tenant and charged as the other.
func (n Names) CheckTenant(l Lane, req *RunRequest, key string) error {
	if l.Old() || l.Tenant == NoTenant {
		return nil
	}
	if got, ok := req.Metadata[key]; ok && got != l.Tenant {
		return fmt.Errorf("metadata.%s %q differs from the tenant %q of the request's subject %s: the subject's tenant is the run's",
			key, truncate(got, 80), l.Tenant, n.LaneRequest(l.Queue, l.Priority, l.Tenant, "<run>"))
	}
	return nil
}
