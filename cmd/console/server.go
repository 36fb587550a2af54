package main

import (
	"bytes"
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"go.opentelemetry.io/otel/trace"

	"github.com/agentfleet/agentfleet/bus"
)

//go:embed static
var staticFiles embed.FS

// serverConfig configures the console's HTTP handler.
type serverConfig struct {
	Client       *bus.Client
	Logger       *slog.Logger
	AllowControl bool
	Auth         *auth // nil: no authentication
	// Heartbeat is the interval of SSE comments on a quiet stream; default 15s.
	Heartbeat time.Duration
	// LongPoll bounds a GET /api/runs?after= wait; default 25s.
	LongPoll time.Duration
	// TracerProvider makes the spans of submits and controls (trace.go).
	TracerProvider trace.TracerProvider
	// ListenAddr is --addr: its host is one the console answers to
	// (hosts.go). Loopback names and the connection's own address are
	// answered whatever it is.
	ListenAddr string
	// PublicHosts are the --public-host names the console also answers to.
	PublicHosts []publicHost
	// MaxStreams and MaxStreamsPerClient bound the open event streams
	// (streams.go); 0 takes the defaults, -1 is no bound.
	MaxStreams, MaxStreamsPerClient int
	// ApproverName is the "by" of approvals when no basic-auth user
	// answers (--approver-name).
	ApproverName string
	// SampleEvery is the fleet history's slot (samples.go); default 10s.
	SampleEvery time.Duration
	// ListScan bounds the records one runs page reads; default listScan.
	ListScan int
	// RequestTimeout bounds each read of the page's script (its polls),
	// besides LongPoll for a long-poll; default 20s, above the handlers'
	// own bounds (15 s at most).
	RequestTimeout time.Duration
	// ApprovalsScan bounds the records the approvals page reads; default
	// approvalsScan.
	ApprovalsScan int

	answerTimeout time.Duration             // tests: an answer's send (0: answerTimeout)
	beforeAnswer  func(ctx context.Context) // tests: an answer is about to be sent
}

// server is the console's HTTP handler.
type server struct {
	client         *bus.Client
	log            *slog.Logger
	allowControl   bool
	auth           *auth
	hosts          hostPolicy
	streams        *streamLimiter
	csrf           csrf
	records        *recordWatch
	listScan       int
	approvalsScan  int
	samples        *sampler
	approverName   string
	answers        *answerMemo
	answerTimeout  time.Duration             // an answer's send; 0: answerTimeout (tests shorten it)
	beforeAnswer   func(ctx context.Context) // tests: an answer is about to be sent
	heartbeat      time.Duration
	longPoll       time.Duration
	requestTimeout time.Duration
	fleetReads     *fleetReads
	mux            *http.ServeMux
	static         fs.FS
	page           []byte
	tracer         trace.Tracer // nil: no spans (trace.go)
}

func newServer(cfg serverConfig) (*server, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 15 * time.Second
	}
	if cfg.LongPoll <= 0 {
		cfg.LongPoll = 25 * time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 20 * time.Second
	}
	if cfg.MaxStreams == 0 {
		cfg.MaxStreams = defaultMaxStreams
	}
	if cfg.MaxStreamsPerClient == 0 {
		cfg.MaxStreamsPerClient = defaultMaxStreamsPerClient
	}
	if cfg.SampleEvery <= 0 {
		cfg.SampleEvery = defaultSampleEvery
	}
	if cfg.ListScan <= 0 {
		cfg.ListScan = listScan
	}
	if cfg.ApprovalsScan <= 0 {
		cfg.ApprovalsScan = approvalsScan
	}
	static, err := fs.Sub(staticFiles, "static")
	if err != nil {
		return nil, err
	}
	page, err := fs.ReadFile(static, "index.html")
	if err != nil {
		return nil, err
	}
	s := &server{
		client:         cfg.Client,
		log:            cfg.Logger,
		allowControl:   cfg.AllowControl,
		tracer:         consoleTracer(cfg.TracerProvider),
		auth:           cfg.Auth,
		hosts:          newHostPolicy(cfg.ListenAddr, cfg.PublicHosts),
		streams:        newStreamLimiter(max(cfg.MaxStreams, 0), max(cfg.MaxStreamsPerClient, 0), cfg.Logger),
		csrf:           newCSRF(),
		records:        newRecordWatch(cfg.Client, cfg.Logger),
		approverName:   cfg.ApproverName,
		answers:        newAnswerMemo(maxAnswers, answersFor),
		listScan:       cfg.ListScan,
		approvalsScan:  cfg.ApprovalsScan,
		heartbeat:      cfg.Heartbeat,
		longPoll:       cfg.LongPoll,
		requestTimeout: cfg.RequestTimeout,
		answerTimeout:  cfg.answerTimeout,
		beforeAnswer:   cfg.beforeAnswer,
		static:         static,
		page:           page,
	}
	s.samples = &sampler{client: cfg.Client, log: cfg.Logger, every: cfg.SampleEvery, queues: s.queueInfos, counts: s.records.take}
	s.fleetReads = &fleetReads{read: s.readFleet}
	m := http.NewServeMux()
	m.HandleFunc("GET /{$}", s.servePage)
	m.HandleFunc("GET /runs/{id}", s.servePage)
	m.HandleFunc("GET /fleet", s.servePage)
	m.HandleFunc("GET /approvals", s.servePage)
	m.HandleFunc("GET /new", s.servePage)
	m.HandleFunc("GET /schedules", s.servePage)         // schedules.go
	m.HandleFunc("GET /api/schedules", s.listSchedules) // schedules.go
	m.HandleFunc("POST /api/schedules/{name}/{action}", s.control(s.scheduleAction))
	m.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	m.HandleFunc("GET /api/session", s.session)
	m.HandleFunc("GET /api/runs", s.listRuns)
	m.HandleFunc("GET /api/runs/{id}", s.getRun)
	m.HandleFunc("GET /api/runs/{id}/events", s.events)
	m.HandleFunc("GET /api/runs/{id}/children", s.children) // children.go
	m.HandleFunc("GET /api/runs/{id}/answers/{seq}", s.getAnswer)
	m.HandleFunc("GET /api/approvals", s.listApprovals)
	m.HandleFunc("GET /api/fleet", s.fleet)
	m.HandleFunc("GET /api/fleet/history", s.fleetHistory)
	m.HandleFunc("POST /api/runs", s.control(s.submit))
	m.HandleFunc("POST /api/runs/{id}/approve", s.control(s.approve))
	m.HandleFunc("POST /api/runs/{id}/{action}", s.control(s.act))
	s.mux = m
	return s, nil
}

// ServeHTTP sets the security headers, refuses other sites' names and
// pages (hosts.go), authenticates and routes.
func (s *server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; base-uri 'none'; form-action 'self'; frame-ancestors 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("X-Frame-Options", "DENY")
	if !s.hosts.hostAllowed(r) {
		refuseHost(w, r)
		return
	}
	if o := r.Header.Get("Origin"); o != "" && !s.hosts.originAllowed(o, r) {
		refuseOrigin(w, o)
		return
	}
	if s.auth.keepToken(w, r, s.hosts.secure(r)) {
		return
	}
	user := s.auth.user(r)
	if user == "" {
		s.auth.refuse(w)
		return
	}
	s.mux.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), userKey{}, user)))
}

type userKey struct{}

func userOf(r *http.Request) string {
	u, _ := r.Context().Value(userKey{}).(string)
	return u
}

func (s *server) servePage(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(s.page)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = w.Write(b)
}

// apiError is the body of an API error.
type apiError struct {
	Error string `json:"error"`
}

func writeError(w http.ResponseWriter, status int, format string, args ...any) {
	writeJSON(w, status, apiError{Error: fmt.Sprintf(format, args...)})
}

func (s *server) session(w http.ResponseWriter, r *http.Request) {
	u := userOf(r)
	writeJSON(w, http.StatusOK, map[string]any{
		"user":         u,
		"allowControl": s.allowControl,
		"csrf":         s.csrf.token(u),
		"prefix":       s.client.Names().Prefix(),
		// The page's reads end after these (a stalled one is retried).
		"requestTimeoutMs": s.requestTimeout.Milliseconds(),
		"longPollMs":       s.longPoll.Milliseconds(),
	})
}

func (s *server) getRun(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if _, rec, ok := s.pathRun(ctx, w, r); ok {
		writeJSON(w, http.StatusOK, rec)
	}
}

// pathRun reads the record of the run the path's {id} names; on a bad id,
// no such run or NATS trouble it writes the error (400, 404, 502) and
// reports false.
func (s *server) pathRun(ctx context.Context, w http.ResponseWriter, r *http.Request) (string, *bus.RunRecord, bool) {
	id := r.PathValue("id")
	if err := bus.CheckID(id); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return "", nil, false
	}
	rec, err := s.client.Status(ctx, id)
	if errors.Is(err, bus.ErrRunNotFound) {
		writeError(w, http.StatusNotFound, "no run %s", id)
		return "", nil, false
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return "", nil, false
	}
	return id, rec, true
}

// control wraps the POST handlers: they need --allow-control, a JSON body
// and the page's CSRF token (ServeHTTP has refused other origins).
func (s *server) control(h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !s.allowControl {
			writeError(w, http.StatusForbidden, "this console is read-only: start it with --allow-control to submit, steer, follow up and abort")
			return
		}
		if !s.csrf.valid(userOf(r), r.Header.Get("X-CSRF-Token")) {
			writeError(w, http.StatusForbidden, "missing or wrong X-CSRF-Token: reload the page")
			return
		}
		h(w, r)
	}
}

// readJSON decodes a bounded JSON body, refusing unknown fields.
func readJSON(w http.ResponseWriter, r *http.Request, limit int64, v any) bool {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	if err != nil {
		writeError(w, http.StatusRequestEntityTooLarge, "body: %v", err)
		return false
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return true
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		writeError(w, http.StatusBadRequest, "body: %v", err)
		return false
	}
	return true
}

// submitBody is a run request plus the queue to put it on.
type submitBody struct {
	Queue string `json:"queue,omitempty"`
	bus.RunRequest
}

func (s *server) submit(w http.ResponseWriter, r *http.Request) {
	var b submitBody
	if !readJSON(w, r, bus.MaxRequestBytes+4096, &b) {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	ctx, endSpan := s.traceAction(ctx, r, "submit", b.ID)
	defer endSpan()
	req := b.RunRequest
	res, err := s.client.Submit(ctx, b.Queue, &req)
	if bus.IsBadRequest(err) {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	s.log.Info("run submitted", "user", userOf(r), "run", res.ID, "queue", res.Queue, "duplicate", res.Duplicate)
	writeJSON(w, http.StatusCreated, map[string]any{"id": res.ID, "queue": res.Queue, "seq": res.Seq, "duplicate": res.Duplicate})
}

// actionBody is the body of steer, followup, abort and compact.
type actionBody struct {
	Text   string `json:"text,omitempty"`
	Reason string `json:"reason,omitempty"`
}

func (s *server) act(w http.ResponseWriter, r *http.Request) {
	id, action := r.PathValue("id"), r.PathValue("action")
	if err := bus.CheckID(id); err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	var b actionBody
	if !readJSON(w, r, bus.MaxControlBytes, &b) {
		return
	}
	// A client retrying after an error sends the same key: the message
	// is stored once (docs/console.md).
	var opts []bus.ControlOption
	if k := r.Header.Get("Idempotency-Key"); k != "" {
		if err := bus.CheckControlID(k); err != nil {
			writeError(w, http.StatusBadRequest, "Idempotency-Key: %v", err)
			return
		}
		opts = append(opts, bus.WithControlID(k))
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	ctx, endSpan := s.traceAction(ctx, r, action, id)
	defer endSpan()
	var seq uint64
	var err error
	switch action {
	case "steer", "followup":
		if strings.TrimSpace(b.Text) == "" {
			writeError(w, http.StatusBadRequest, "%s needs a non-empty \"text\"", action)
			return
		}
		kind := map[string]string{"steer": bus.KindSteer, "followup": bus.KindFollowUp}[action]
		seq, err = s.client.SendControl(ctx, id, kind, bus.Control{Text: b.Text}, opts...)
	case "abort":
		seq, err = s.client.SendControl(ctx, id, bus.KindAbort, bus.Control{Reason: b.Reason}, opts...)
	case "compact": // protocol §16: "text", optional, focuses the summary
		if len(b.Text) > bus.MaxCompactionInstructions {
			writeError(w, http.StatusBadRequest, "compact: \"text\" is %d bytes, at most %d", len(b.Text), bus.MaxCompactionInstructions)
			return
		}
		seq, err = s.client.SendControl(ctx, id, bus.KindCompact, bus.Control{Text: b.Text}, opts...)
	default:
		writeError(w, http.StatusNotFound, "unknown action %q: use steer, followup, abort, compact or approve", action)
		return
	}
	if errors.Is(err, bus.ErrRunFinished) {
		writeError(w, http.StatusConflict, "%v", err)
		return
	}
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	s.log.Info("run "+action, "user", userOf(r), "run", id, "controlSeq", seq)
	writeJSON(w, http.StatusAccepted, map[string]any{"controlSeq": seq})
}

// queueInfo is one queue of the fleet, from its consumer's info.
type queueInfo struct {
	Queue    string `json:"queue"`
	Consumer string `json:"consumer"`
	// Depth is the requests waiting for a worker.
	Depth uint64 `json:"depth"`
	// InFlight is the requests delivered and not acknowledged (running).
	InFlight int `json:"inFlight"`
	// Waiting is the pull requests of idle workers waiting for work.
	Waiting     int `json:"waiting"`
	Redelivered int `json:"redelivered"`
}

// fleetInfo is the body of GET /api/fleet.
type fleetInfo struct {
	Queues  []queueInfo       `json:"queues"`
	Workers []json.RawMessage `json:"workers"`
	Errors  []string          `json:"errors,omitempty"`
}

// maxWorkers bounds the presence entries read for one page.
const maxWorkers = 1000

// fleetFresh is how long one read of the fleet answers GET /api/fleet;
// fleetReadTimeout bounds the read.
const (
	fleetFresh       = time.Second
	fleetReadTimeout = 5 * time.Second
)

// fleetReads shares reads of the fleet among GET /api/fleet requests:
// each read lists the work queue's consumers and makes a consumer on the
// presence bucket, so a request each would let any client make consumers
// as fast as it asks. One read is under way at a time; its answer serves
// every request for fleetFresh, and the requests that come while it runs
// wait for it.
type fleetReads struct {
	read func(context.Context) fleetInfo

	mu      sync.Mutex
	info    fleetInfo
	at      time.Time     // of info; zero: none yet
	reading chan struct{} // closed when the read under way ends; nil: none
}

// get returns a fresh answer, reading the fleet if no read is under way,
// or waiting for the one that is; false when ctx ended first.
func (f *fleetReads) get(ctx context.Context) (fleetInfo, bool) {
	for {
		f.mu.Lock()
		if !f.at.IsZero() && time.Since(f.at) < fleetFresh {
			info := f.info
			f.mu.Unlock()
			return info, true
		}
		if done := f.reading; done != nil {
			f.mu.Unlock()
			select {
			case <-done:
				continue
			case <-ctx.Done():
				return fleetInfo{}, false
			}
		}
		done := make(chan struct{})
		f.reading = done
		f.mu.Unlock()
		// Others wait on this read: the request that makes it leaving
		// does not end it.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fleetReadTimeout)
		info := f.read(rctx)
		cancel()
		f.mu.Lock()
		f.info, f.at, f.reading = info, time.Now(), nil
		f.mu.Unlock()
		close(done)
		return info, true
	}
}

func (s *server) fleet(w http.ResponseWriter, r *http.Request) {
	out, ok := s.fleetReads.get(r.Context())
	if !ok {
		writeError(w, http.StatusServiceUnavailable, "the request ended before the fleet was read")
		return
	}
	writeJSON(w, http.StatusOK, out)
}

// queueInfos reads the queues from their consumers, workers-<queue>.
func (s *server) queueInfos(ctx context.Context) ([]queueInfo, error) {
	names := s.client.Names()
	st, err := s.client.JetStream().Stream(ctx, names.RunsStream())
	if err != nil {
		return nil, fmt.Errorf("stream %s: %w", names.RunsStream(), err)
	}
	var out []queueInfo
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		q, ok := strings.CutPrefix(ci.Name, "workers-")
		if !ok {
			continue
		}
		out = append(out, queueInfo{Queue: q, Consumer: ci.Name, Depth: ci.NumPending,
			InFlight: ci.NumAckPending, Waiting: ci.NumWaiting, Redelivered: ci.NumRedelivered})
	}
	if err := lister.Err(); err != nil {
		return out, fmt.Errorf("consumers: %w", err)
	}
	slices.SortFunc(out, func(a, b queueInfo) int { return strings.Compare(a.Queue, b.Queue) })
	return out, nil
}

// readFleet reads the queues' consumers and the workers' presence.
func (s *server) readFleet(ctx context.Context) fleetInfo {
	out := fleetInfo{Queues: []queueInfo{}, Workers: []json.RawMessage{}}
	qs, err := s.queueInfos(ctx)
	out.Queues = append(out.Queues, qs...)
	if err != nil {
		out.Errors = append(out.Errors, err.Error())
	}
	bucket := workersBucket(s.client.Names())
	kv, err := s.client.JetStream().KeyValue(ctx, bucket)
	switch {
	case errors.Is(err, jetstream.ErrBucketNotFound):
	case err != nil:
		out.Errors = append(out.Errors, fmt.Sprintf("kv bucket %s: %v", bucket, err))
	default:
		keys, err := kv.ListKeys(ctx)
		if err != nil {
			out.Errors = append(out.Errors, fmt.Sprintf("kv bucket %s: %v", bucket, err))
			break
		}
		for k := range keys.Keys() {
			if len(out.Workers) >= maxWorkers {
				continue // drain the lister
			}
			e, err := kv.Get(ctx, k)
			if err != nil {
				continue
			}
			if p, ok := withSeenAt(e.Value(), e.Created()); ok {
				out.Workers = append(out.Workers, p)
			}
		}
	}
	return out
}

// withSeenAt adds "seenAt", when the worker last wrote its entry, to a
// presence entry (kept as it is otherwise: fields of newer workers pass).
func withSeenAt(entry []byte, seen time.Time) (json.RawMessage, bool) {
	var m map[string]json.RawMessage
	if json.Unmarshal(entry, &m) != nil || m == nil {
		return nil, false
	}
	m["seenAt"], _ = json.Marshal(seen.UTC())
	b, err := json.Marshal(m)
	return b, err == nil
}

// historyInfo is the body of GET /api/fleet/history.
type historyInfo struct {
	Samples []fleetSample `json:"samples"`
	Every   int64         `json:"every"` // ms
	Problem string        `json:"problem,omitempty"`
}

func (s *server) fleetHistory(w http.ResponseWriter, r *http.Request) {
	samples, problem := s.samples.history()
	if samples == nil {
		samples = []fleetSample{}
	}
	writeJSON(w, http.StatusOK, historyInfo{Samples: samples, Every: s.samples.every.Milliseconds(), Problem: problem})
}

// workersBucket is the presence bucket of the workers: agents_workers for
// the default prefix.
func workersBucket(n bus.Names) string {
	return strings.TrimSuffix(n.RecordsBucket(), "_runs") + "_workers"
}
