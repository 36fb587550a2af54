package toolsource

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// Headers of a tool service call.
const (
	HeaderRun      = "Agentfleet-Run"
	HeaderAttempt  = "Agentfleet-Attempt"
	HeaderToolCall = "Agentfleet-Tool-Call"
	HeaderTool     = "Agentfleet-Tool"
	HeaderDeadline = "Agentfleet-Deadline" // unix milliseconds
)

// DiscoverySubject is where micro services answer who they are.
const DiscoverySubject = "$SRV.INFO"

// ServiceOptions shape the tool services source.
type ServiceOptions struct {
	Logger *slog.Logger
	// Allowed lists the services whose tools runs may use; "*" allows
	// every service found.
	Allowed []string
	// Prefix is the fleet's subject prefix (default "agents"): the tool
	// <service>__<endpoint> is called on <Prefix>.tools.<service>.<endpoint>
	// and nowhere else, whatever the service announces.
	Prefix string
	// Refresh is how often services are discovered again; default 30s.
	Refresh time.Duration
	// Quiet is how long discovery waits after the last answer; default
	// 150ms. Discovery never takes longer than MaxWait (default 2s).
	Quiet, MaxWait time.Duration
}

// Services is the source of NATS tool services: micro services whose
// endpoints carry "schema" and "description" metadata. It finds them by
// scatter-gather on $SRV.INFO.
//
// What a service announces is never an address: a call goes to the
// subject the worker builds from the service's and the endpoint's names
// (an endpoint announcing another subject is refused), so a service
// cannot make the worker publish where the service itself may not
// (records, the JetStream API). And the instances of one name must
// announce the same tools: while they differ (an impostor, or a rollout
// that changes a tool) the service is refused, so the first answer does
// not decide what runs see or where their calls go.
type Services struct {
	nc      *nats.Conn
	o       ServiceOptions
	log     *slog.Logger
	all     bool
	allowed map[string]bool
	ready   chan struct{}
	kick    chan kick

	// skipped holds the names refused at the last discovery (logged
	// then, not again while they keep answering); only discovery (Run's
	// goroutine) touches it.
	skipped map[string]bool
	// known is what the last discovery that found each name made of it,
	// kept while the name misses rounds (at most maxKnownNames names),
	// so that an announcement after a missed round is checked against
	// the last one, not taken as a first; only discovery touches it.
	known map[string]*service

	mu       sync.Mutex
	services map[string]*service
	lastDone time.Time
}

type service struct {
	tools     []*agent.Tool
	refused   []refusal // endpoints announced and not served
	instances int
	// variants counts the different announcements of the name: more
	// than one refuses the service (no tools) while they differ.
	variants int
	// prints are the announcements of this discovery.
	prints [][sha256.Size]byte
	// held: the name's one announcement is not the one of the last
	// discovery; the service is refused for this round (an impostor that
	// answered a round the honest instance missed does not win it).
	held   bool
	logged map[string]string // what its listing logged (toolBounds)
}

func (svc *service) conflicting() bool { return svc.variants > 1 || svc.held }

// state names what discovery made of a service, for the log: "" accepted.
func (svc *service) state() string {
	switch {
	case svc == nil:
		return ""
	case svc.variants > 1:
		return "conflict"
	case svc.held:
		return "held"
	}
	return ""
}

type kick struct {
	at   time.Time
	done chan struct{}
}

// Call identifies the run a tool call belongs to; the worker puts it in
// the call's context.
type Call struct {
	Run     string
	Attempt int
}

type callKey struct{}

// WithCall returns ctx carrying the run of a tool call.
func WithCall(ctx context.Context, c Call) context.Context {
	return context.WithValue(ctx, callKey{}, c)
}

// NewServices returns the source of the allowed tool services; Run
// starts discovery. Names that cannot prefix tool names are refused.
func NewServices(nc *nats.Conn, o ServiceOptions) (*Services, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Refresh <= 0 {
		o.Refresh = 30 * time.Second
	}
	if o.Quiet <= 0 {
		o.Quiet = 150 * time.Millisecond
	}
	if o.MaxWait <= 0 {
		o.MaxWait = 2 * time.Second
	}
	if o.Prefix == "" {
		o.Prefix = bus.DefaultPrefix
	}
	if _, err := bus.NewNames(o.Prefix); err != nil {
		return nil, fmt.Errorf("tool service: %w", err)
	}
	s := &Services{nc: nc, o: o, log: o.Logger, allowed: map[string]bool{},
		ready: make(chan struct{}), kick: make(chan kick), services: map[string]*service{}}
	for _, n := range o.Allowed {
		if n == "*" {
			s.all = true
			continue
		}
		if err := CheckNamespace(n); err != nil {
			return nil, fmt.Errorf("tool service: %w", err)
		}
		s.allowed[n] = true
	}
	return s, nil
}

// Ready is closed after the first discovery.
func (s *Services) Ready() <-chan struct{} { return s.ready }

// Run discovers services now, every Refresh, and when a run names an
// unknown one, until ctx is cancelled.
func (s *Services) Run(ctx context.Context) {
	s.discover(ctx)
	close(s.ready)
	t := time.NewTicker(s.o.Refresh)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.discover(ctx)
		case k := <-s.kick:
			s.mu.Lock()
			stale := s.lastDone.Before(k.at)
			s.mu.Unlock()
			if stale {
				s.discover(ctx)
			}
			close(k.done)
		}
	}
}

// discover asks every micro service for its info and keeps the allowed
// tool services.
func (s *Services) discover(ctx context.Context) {
	s.mu.Lock()
	prev := s.services
	s.mu.Unlock()
	last := maps.Clone(s.known)
	if last == nil {
		last = map[string]*service{}
	}
	maps.Copy(last, prev)
	found, err := s.gather(ctx, last)
	if err != nil {
		s.log.Warn("tool service discovery failed", "err", err)
		return
	}
	if s.known == nil {
		s.known = map[string]*service{}
	}
	for name, svc := range found {
		if _, ok := s.known[name]; ok || len(s.known) < maxKnownNames {
			s.known[name] = svc
		}
	}
	for name, svc := range found {
		was, now := last[name].state(), svc.state()
		if was == now {
			continue
		}
		switch now {
		case "conflict":
			s.log.Warn("tool service refused: its instances announce different tools (an impostor, or a rollout that changes them); its calls fail until all announce the same",
				"service", name, "instances", svc.instances, "variants", svc.variants)
		case "held":
			s.log.Warn("tool service held back: it announces other tools than at the last discovery (an impostor answering a round the service missed, or a rollout that changes them); accepted at the next discovery if they stay the same",
				"service", name, "instances", svc.instances)
		default:
			s.log.Info("tool service accepted again: its instances announce the same tools, as at the last discovery", "service", name, "instances", svc.instances)
		}
	}
	s.mu.Lock()
	s.services, s.lastDone = found, time.Now()
	s.mu.Unlock()
}

func (s *Services) gather(ctx context.Context, prev map[string]*service) (map[string]*service, error) {
	inbox := s.nc.NewInbox()
	sub, err := s.nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer func() { _ = sub.Unsubscribe() }()
	if err := s.nc.PublishRequest(DiscoverySubject, inbox, nil); err != nil {
		return nil, err
	}
	found := map[string]*service{}
	skipped := map[string]bool{}
	end := time.Now().Add(s.o.MaxWait)
	// Until every service of the last round has answered, the round waits
	// for them up to MaxWait, not Quiet: on a loaded machine one that
	// answered later than Quiet was dropped for a round, and runs naming
	// its tools failed as bad requests meanwhile.
	awaited := 0
	for name := range prev {
		if s.all || s.allowed[name] {
			awaited++
		}
	}
	for {
		wait := time.Until(end)
		if awaited == 0 {
			wait = min(s.o.Quiet, wait)
		}
		if wait <= 0 || ctx.Err() != nil {
			break
		}
		m, err := sub.NextMsg(wait)
		if err != nil {
			break // quiet: every instance has answered
		}
		var info micro.Info
		if json.Unmarshal(m.Data, &info) != nil || info.Name == "" {
			continue
		}
		if !s.all && !s.allowed[info.Name] {
			continue
		}
		fp := announcement(info)
		if svc := found[info.Name]; svc != nil {
			svc.instances++
			if !slices.Contains(svc.prints, fp) {
				svc.prints = append(svc.prints, fp)
				svc.variants++
			}
			continue
		}
		if skipped[info.Name] {
			continue
		}
		if err := CheckNamespace(info.Name); err != nil {
			if len(skipped) < maxSkippedNames {
				skipped[info.Name] = true
				if !s.skipped[info.Name] {
					s.log.Warn("tool service skipped", "service", clip(info.Name, 64), "err", err)
				}
			}
			continue
		}
		var logged map[string]string
		if p := prev[info.Name]; p != nil {
			logged = p.logged
		}
		if prev[info.Name] != nil {
			awaited--
		}
		svc := &service{instances: 1, variants: 1, prints: [][sha256.Size]byte{fp}}
		svc.tools, svc.refused, svc.logged = s.tools(info, logged)
		found[info.Name] = svc
	}
	s.skipped = skipped
	for name, svc := range found {
		// A known name whose one announcement changed since the last
		// discovery waits a round: the honest instance may just have
		// answered too late this time. A rollout that changes the tools
		// is accepted at the next discovery.
		if p := prev[name]; p != nil && svc.variants == 1 && !(len(p.prints) == 1 && p.prints[0] == svc.prints[0]) {
			svc.held = true
		}
		if svc.conflicting() {
			svc.tools, svc.refused = nil, nil
		}
	}
	return found, nil
}

// maxSkippedNames bounds the refused names discovery remembers (to log
// each once).
const maxSkippedNames = 1024

// maxKnownNames bounds the names whose last announcement discovery keeps
// across missed rounds (with --tool-services '*' any service may answer).
const maxKnownNames = 1024

// announcement is what one instance says of its tools: endpoint names,
// subjects, schemas and descriptions (not its id, version or other
// endpoints), hashed.
func announcement(info micro.Info) [sha256.Size]byte {
	type tool struct{ Name, Subject, Schema, Description string }
	var tools []tool
	for _, ep := range info.Endpoints {
		schema, hasSchema := ep.Metadata["schema"]
		desc, hasDesc := ep.Metadata["description"]
		if hasSchema && hasDesc {
			tools = append(tools, tool{ep.Name, ep.Subject, schema, desc})
		}
	}
	slices.SortFunc(tools, func(a, b tool) int {
		return cmp.Or(cmp.Compare(a.Name, b.Name), cmp.Compare(a.Subject, b.Subject),
			cmp.Compare(a.Schema, b.Schema), cmp.Compare(a.Description, b.Description))
	})
	b, _ := json.Marshal(tools)
	return sha256.Sum256(b)
}

// subject is where the tool <service>__<endpoint> is called.
func (s *Services) subject(service, endpoint string) string {
	return s.o.Prefix + ".tools." + service + "." + endpoint
}

func (s *Services) tools(info micro.Info, logged map[string]string) ([]*agent.Tool, []refusal, map[string]string) {
	b := newToolBounds(s.log, "tool service endpoint", logged)
	eps := slices.Clone(info.Endpoints)
	slices.SortFunc(eps, func(a, b micro.EndpointInfo) int { return cmp.Compare(a.Name, b.Name) })
	var tools []*agent.Tool
	for _, ep := range eps {
		schema, hasSchema := ep.Metadata["schema"]
		desc, hasDesc := ep.Metadata["description"]
		if !hasSchema || !hasDesc {
			continue // not a tool
		}
		full := info.Name + Separator + ep.Name
		if ep.Name == "" {
			b.refuse(full, "its endpoint name is empty")
			continue
		}
		if !ValidToolName(full) {
			b.refuse(full, "its name is not ^[A-Za-z0-9_-]{1,64}$")
			continue
		}
		// The endpoint name is a subject token now ([A-Za-z0-9_-]).
		if want := s.subject(info.Name, ep.Name); ep.Subject != want {
			b.refuse(full, fmt.Sprintf("it announces subject %q; the worker calls it on %s only", clip(ep.Subject, 80), want))
			continue
		}
		if !b.schema(full, len(schema)) {
			continue
		}
		var obj map[string]any
		if json.Unmarshal([]byte(schema), &obj) != nil {
			b.refuse(full, "its schema is not a JSON object")
			continue
		}
		if !b.admit(full) {
			continue
		}
		tools = append(tools, &agent.Tool{Name: full, Description: b.description(full, desc), Parameters: json.RawMessage(schema),
			Execute: s.execute(info.Name, full, s.subject(info.Name, ep.Name))})
	}
	b.done("service:" + info.Name)
	return tools, b.refused, b.now
}

// serviceReply is a reply in the agent's own result shape.
type serviceReply struct {
	Content []agent.Content `json:"content"`
	IsError bool            `json:"isError"`
	Details json.RawMessage `json:"details"`
}

func (s *Services) execute(svc, full, subject string) agent.ExecuteFunc {
	return func(ctx context.Context, callID string, args map[string]any, _ agent.UpdateFunc) (agent.ToolResult, error) {
		if args == nil {
			args = map[string]any{}
		}
		body, err := json.Marshal(args)
		if err != nil {
			return agent.ToolResult{}, err
		}
		msg := nats.NewMsg(subject)
		msg.Data = body
		if c, ok := ctx.Value(callKey{}).(Call); ok {
			msg.Header.Set(HeaderRun, c.Run)
			msg.Header.Set(HeaderAttempt, strconv.Itoa(c.Attempt))
		}
		msg.Header.Set(HeaderToolCall, callID)
		msg.Header.Set(HeaderTool, full)
		start := time.Now()
		if d, ok := ctx.Deadline(); ok {
			msg.Header.Set(HeaderDeadline, strconv.FormatInt(d.UnixMilli(), 10))
		}
		reply, err := s.nc.RequestMsgWithContext(ctx, msg)
		switch {
		case errors.Is(err, nats.ErrNoResponders):
			return agent.ToolResult{}, fmt.Errorf("no instance of service %s is running", svc)
		case errors.Is(err, context.DeadlineExceeded):
			return agent.ToolResult{}, fmt.Errorf("%s timed out after %s: %w", full, time.Since(start).Round(time.Millisecond), err)
		case err != nil:
			return agent.ToolResult{}, err
		}
		if e := reply.Header.Get(micro.ErrorHeader); e != "" {
			return agent.ToolResult{}, fmt.Errorf("%s failed: %s (code %s)", full, e, reply.Header.Get(micro.ErrorCodeHeader))
		}
		return serviceResult(reply.Data)
	}
}

// serviceResult reads a reply: a JSON object with a "content" array of
// blocks is a result; any other body is one text block.
func serviceResult(data []byte) (agent.ToolResult, error) {
	var probe struct {
		Content json.RawMessage `json:"content"`
	}
	var r serviceReply
	if json.Unmarshal(data, &probe) == nil && len(probe.Content) > 0 && probe.Content[0] == '[' && json.Unmarshal(data, &r) == nil {
		out := agent.ToolResult{Content: checkContent(r.Content)}
		if len(r.Details) > 0 && string(r.Details) != "null" {
			out.Details = r.Details
		}
		if r.IsError {
			return agent.ToolResult{}, errors.New(resultText(out.Content, "the tool reported an error"))
		}
		return out, nil
	}
	return agent.TextResult(string(data)), nil
}

// Resolve returns an allowed service's tools. A name not allowed
// explicitly, under "*", triggers a discovery first.
func (s *Services) Resolve(ctx context.Context, namespace string) ([]*agent.Tool, bool) {
	if !s.all && !s.allowed[namespace] {
		return nil, false
	}
	if svc := s.lookup(namespace); svc != nil {
		return slices.Clone(svc.tools), true
	}
	k := kick{at: time.Now(), done: make(chan struct{})}
	wait, cancel := context.WithTimeout(ctx, s.o.MaxWait+time.Second)
	defer cancel()
	select {
	case s.kick <- k:
		select {
		case <-k.done:
		case <-wait.Done():
		}
	case <-wait.Done():
	}
	if svc := s.lookup(namespace); svc != nil {
		return slices.Clone(svc.tools), true
	}
	return nil, s.allowed[namespace]
}

func (s *Services) lookup(name string) *service {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.services[name]
}

// Missing returns a tool of an allowed service that was not found.
func (s *Services) Missing(name string) *agent.Tool {
	ns, _, _ := SplitName(name)
	return failingTool(name, "", func() error {
		svc := s.lookup(ns)
		switch {
		case svc == nil:
			return fmt.Errorf("no instance of service %s is running", ns)
		case svc.variants > 1:
			return fmt.Errorf("service %s is refused: its %d instances announce different tools (the worker's log says more)", ns, svc.instances)
		case svc.held:
			return fmt.Errorf("service %s is held back: it announces other tools than at the last discovery; they are used if they stay the same at the next one (the worker's log says more)", ns)
		}
		if why, ok := reason(svc.refused, name); ok {
			return fmt.Errorf("tool %s is refused: %s", clip(name, 80), why)
		}
		return fmt.Errorf("service %s has no tool %s", ns, clip(name, 80))
	})
}

// Status reports the allowed services and their tools.
func (s *Services) Status() ([]SourceStatus, []ToolStatus) {
	s.mu.Lock()
	defer s.mu.Unlock()
	names := make([]string, 0, len(s.services)+len(s.allowed))
	for n := range s.services {
		names = append(names, n)
	}
	for n := range s.allowed {
		if s.services[n] == nil {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	var parts []SourceStatus
	var tools []ToolStatus
	for _, n := range names {
		svc := s.services[n]
		parts = append(parts, SourceStatus{Name: "service:" + n, Up: svc != nil && !svc.conflicting(),
			Conflict: svc != nil && svc.conflicting()})
		if svc == nil {
			continue
		}
		for _, t := range svc.tools {
			tools = append(tools, ToolStatus{Name: t.Name, Source: "service:" + n, Description: t.Description, Available: true})
		}
		for _, name := range refusedNames(svc.refused) {
			tools = append(tools, ToolStatus{Name: name, Source: "service:" + n})
		}
	}
	return parts, tools
}
