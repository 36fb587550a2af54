// Command worker runs an agentfleet worker: it takes run requests from NATS
// JetStream, runs one agent per request and publishes the run's events.
// Without a NATS URL it starts an embedded NATS server; without a model
// endpoint it uses the demo model. See worker --help.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/llm/openai"
	"github.com/agentfleet/agentfleet/metrics"
	"github.com/agentfleet/agentfleet/natsembed"
	"github.com/agentfleet/agentfleet/ratelimit"
	"github.com/agentfleet/agentfleet/worker"
)

// version is set at build time: -ldflags "-X main.version=v1.2.3".
var version = "dev"

func main() {
	if p := gcPercent(os.Getenv("GOGC"), debug.SetMemoryLimit(-1)); p > 0 {
		debug.SetGCPercent(p)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	code := run(ctx, os.Args[1:], os.Stderr, nil)
	stop()
	os.Exit(code)
}

// gcPercent is the collector's target for a worker process: with a
// memory limit (GOMEMLIMIT) the limit bounds the heap, so the collector
// may let garbage grow to four times the live heap between cycles, which
// cut the worker's CPU by a tenth in `submit bench` (docs/operations.md,
// "Many runs in flight"). GOGC, when set, wins; 0 leaves the runtime's
// default.
func gcPercent(gogc string, limit int64) int {
	if gogc != "" || limit == math.MaxInt64 {
		return 0
	}
	return 400
}

type listFlag []string

func (l *listFlag) String() string { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

type options struct {
	conn          bus.ConnectOptions
	otel          bool // trace.go
	listen        string
	queues        listFlag
	concurrency   int
	ackWait       time.Duration
	maxDeliver    int
	maxAckPending int
	fetchBytes    byteSize
	eventBatches  bool
	maxWaiting    int
	maxChildDepth int
	maxChildren   int
	parkAfter     time.Duration
	scheduleLate  time.Duration
	approveTools  string
	replicas      int
	drainTimeout  time.Duration
	toolTimeout   time.Duration
	dataDir       string
	metricsAddr   string
	pprofAddr     string
	// Retention of what EnsureStreams creates.
	eventsMaxAge, controlMaxAge, recordsTTL time.Duration
	// byte limits of the streams; 0 leaves them as they are
	requestsMaxBytes, eventsMaxBytes, controlMaxBytes byteSize
	natsSync                                          string
	maxToolArgs, maxToolResult                        int
	// Per-run bounds and operator ceilings.
	maxRunEvents                         int
	maxRunEventBytes                     byteSize
	maxQueuedControls                    int
	maxQueuedControlBytes, maxTranscript byteSize
	loadBudget                           byteSize
	maxRunTimeout, maxApprovalTimeout    time.Duration
	maxTurns                             int
	queueConcurrency                     listFlag
	keyLimits                            listFlag
	tenantWeights                        listFlag
	allowFaux                            optionalBool
	// metricsAddrDefault: --metrics-addr was not chosen, so a busy default
	// port (a second worker on one machine) falls back to a free port.
	metricsAddrDefault bool
	logFormat          string
	logLevel           string
	models             string
	defaultModel       string
	openaiURL          string
	openaiKey          string
	workerID           string
	// Tool sources (toolsources.go).
	toolsConfig, toolServices string
	toolsAuth                 toolsAuth
	budgets                   budgetOptions // budgets.go
}

func env(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// environment reads flag defaults from the environment and keeps every
// value that does not parse, so that the worker refuses to start instead of
// silently running with the default.
type environment struct{ errs []error }

func (e *environment) int(name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(strings.TrimSpace(v))
	if err != nil {
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not a whole number", name, clip(v)))
		return def
	}
	return n
}

func (e *environment) duration(name string, def time.Duration) time.Duration {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(strings.TrimSpace(v))
	if err != nil {
		hint := ""
		if _, nerr := strconv.ParseFloat(strings.TrimSpace(v), 64); nerr == nil {
			hint = " (it needs a unit)"
		}
		e.errs = append(e.errs, fmt.Errorf("%s=%q is not a duration such as 30s, 2m or 1h%s", name, clip(v), hint))
		return def
	}
	return d
}

func (e *environment) bytes(name string) byteSize {
	var b byteSize
	if v := os.Getenv(name); v != "" {
		if err := b.Set(v); err != nil {
			e.errs = append(e.errs, fmt.Errorf("%s: %w", name, err))
		}
	}
	return b
}

func (e *environment) bytesDefault(name string, def byteSize) byteSize {
	if os.Getenv(name) == "" {
		return def
	}
	return e.bytes(name)
}

// optionalBool is a boolean flag whose default depends on other flags.
type optionalBool struct{ set, v bool }

func (b *optionalBool) String() string {
	if b == nil || !b.set {
		return ""
	}
	return strconv.FormatBool(b.v)
}

func (b *optionalBool) Set(s string) error {
	v, err := strconv.ParseBool(strings.TrimSpace(s))
	if err != nil {
		return fmt.Errorf("%q is not true or false", clip(s))
	}
	b.set, b.v = true, v
	return nil
}

func (b *optionalBool) IsBoolFlag() bool { return true }

// byteSize is a flag of bytes: 1048576, 512MiB, 10GiB, 1TB.
type byteSize int64

func (b *byteSize) String() string { return strconv.FormatInt(int64(*b), 10) }

func (b *byteSize) Set(v string) error {
	s := strings.TrimSpace(v)
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSpace(strings.TrimSuffix(s, u.suffix)), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return fmt.Errorf("%q is not a size such as 1073741824, 512MiB or 10GiB", clip(v))
	}
	*b = byteSize(n * mult)
	return nil
}

func clip(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

const usageHead = `worker runs agentfleet runs: it takes run requests from NATS JetStream
(subject agents.submit.<queue>.<run>), drives one agent per run, publishes every
event to agents.run.<run>.events and applies steering, follow-ups and aborts.

Usage: worker [flags]

Quick start (no NATS, no model endpoint): just run "worker". It starts an
embedded NATS server on 127.0.0.1:4222 with its data under --data-dir, and the
demo model, which replies with canned text. Then "submit 'hello'".

Real model: set OPENAI_BASE_URL (any OpenAI-compatible server: OpenAI, vLLM,
Ollama at http://localhost:11434/v1, ...) and OPENAI_API_KEY (or
--openai-api-key-file), and --default-model openai/<model id>.

Several workers: start NATS yourself (or one worker with the embedded server)
and point every worker at it with --nats or NATS_URL.

Thousands of runs in flight: set GOMEMLIMIT (the Go collector's soft limit,
e.g. 900MiB under a 1GiB container): the limit bounds the heap; a waiting
run holds about 16 KB of stack and 17 KB of heap. With GOMEMLIMIT set and
GOGC not, the worker collects at GOGC=400 below the limit (less collector
CPU; the heap may grow to five times the live heap, never past the limit).

Flags (environment variable in brackets):
`

func parse(args []string, stderr io.Writer) (*options, error) {
	o := &options{}
	var environ environment
	fs := flag.NewFlagSet("worker", flag.ContinueOnError)
	fs.SetOutput(stderr)
	home, _ := os.UserHomeDir()
	defData := filepath.Join(home, ".agentfleet")
	if home == "" {
		defData = ".agentfleet"
	}
	fs.StringVar(&o.conn.URL, "nats", env("NATS_URL", ""), "NATS server URL(s), comma-separated; empty starts an embedded server [NATS_URL]")
	fs.StringVar(&o.listen, "nats-listen", env("AGENTS_NATS_LISTEN", "127.0.0.1:4222"), "where the embedded NATS server listens (port 0: any free port) [AGENTS_NATS_LISTEN]")
	fs.StringVar(&o.conn.User, "user", env("NATS_USER", ""), "NATS user [NATS_USER]")
	fs.StringVar(&o.conn.Password, "password", "", "NATS password (prefer the environment: flags show in ps) [NATS_PASSWORD]")
	fs.StringVar(&o.conn.Token, "token", "", "NATS auth token (prefer the environment) [NATS_TOKEN]")
	fs.StringVar(&o.conn.NKeySeedFile, "nkey", env("NATS_NKEY", ""), "file with an NKey user seed [NATS_NKEY]")
	fs.StringVar(&o.conn.CredsFile, "creds", env("NATS_CREDS", ""), "NATS credentials (.creds) file [NATS_CREDS]")
	fs.StringVar(&o.conn.TLSCA, "tlsca", env("NATS_CA", ""), "CA certificate file to verify the server [NATS_CA]")
	fs.StringVar(&o.conn.TLSCert, "tlscert", env("NATS_CERT", ""), "client certificate file (mutual TLS) [NATS_CERT]")
	fs.StringVar(&o.conn.TLSKey, "tlskey", env("NATS_KEY", ""), "client key file (mutual TLS) [NATS_KEY]")
	fs.StringVar(&o.conn.Prefix, "prefix", env("AGENTS_PREFIX", bus.DefaultPrefix), "subject prefix; stream names follow it (AGENTS_RUNS for agents) [AGENTS_PREFIX]")
	fs.Var(&o.queues, "queue", "queue to take runs from; repeatable or comma-separated (default \"default\") [AGENTS_QUEUES]")
	fs.IntVar(&o.concurrency, "concurrency", environ.int("AGENTS_CONCURRENCY", 8), "runs in flight at most; the worker pulls one request per free slot [AGENTS_CONCURRENCY]")
	fs.DurationVar(&o.ackWait, "ack-wait", environ.duration("AGENTS_ACK_WAIT", 60*time.Second), "consumer AckWait: a request whose worker sends no heartbeat for this long is redelivered; heartbeats go every ack-wait/4 [AGENTS_ACK_WAIT]")
	fs.BoolVar(&o.eventBatches, "event-batches", true, "publish events in JetStream fast batches, a few acks a batch instead of one an event (needs nats-server 2.14+; false: one ack an event)")
	fs.IntVar(&o.maxAckPending, "max-ack-pending", environ.int("AGENTS_MAX_ACK_PENDING", 10_000), "unacknowledged requests per queue consumer across the fleet (running, waiting, handed back); keep it above the fleet's slots plus waiting runs [AGENTS_MAX_ACK_PENDING]")
	o.fetchBytes = environ.bytesDefault("AGENTS_FETCH_BYTES", worker.DefaultFetchBytes)
	fs.Var(&o.fetchBytes, "fetch-bytes", "bytes of requests the worker's fetches may bring at once (e.g. 16MiB), shared by its pull loops; each loop still takes one request of the largest size. Keep it well under the server's max_pending (64 MiB by default), past which the server disconnects the worker as a slow consumer [AGENTS_FETCH_BYTES]")
	fs.IntVar(&o.maxChildDepth, "max-child-depth", environ.int("AGENTS_MAX_CHILD_DEPTH", 3), "levels of child runs (run_agent) below a root run, at most; a request's children.maxDepth is capped by it [AGENTS_MAX_CHILD_DEPTH]")
	fs.IntVar(&o.maxChildren, "max-children", environ.int("AGENTS_MAX_CHILDREN", 100), "child runs (run_agent) one run may start, at most; a request's children.max is capped by it [AGENTS_MAX_CHILDREN]")
	fs.IntVar(&o.maxWaiting, "max-waiting", environ.int("AGENTS_MAX_WAITING", 1_000), "runs waiting for an approval without holding a slot, at most; past it a gated tool call is refused at once (its result says the fleet has too many runs waiting; the model goes on); -1 or 0: waiting runs keep their slots and no call is refused [AGENTS_MAX_WAITING]")
	fs.StringVar(&o.approveTools, "approve-tools", env("AGENTS_APPROVE_TOOLS", ""), "tools whose every call waits for a person's answer (comma-separated names or patterns, \"*\" for all); requests may gate more, never fewer [AGENTS_APPROVE_TOOLS]")
	fs.IntVar(&o.maxDeliver, "max-deliver", environ.int("AGENTS_MAX_DELIVER", 5), "deliveries of a request at most; then the run is given up (failed/gave_up, copy on agents.dead.<queue>.<run>) [AGENTS_MAX_DELIVER]")
	fs.IntVar(&o.maxToolArgs, "max-tool-args-bytes", environ.int("AGENTS_MAX_TOOL_ARGS_BYTES", 64<<10), "largest tool-call arguments (JSON) a tool is run with; larger calls fail with an error result [AGENTS_MAX_TOOL_ARGS_BYTES]")
	fs.IntVar(&o.maxToolResult, "max-tool-result-bytes", environ.int("AGENTS_MAX_TOOL_RESULT_BYTES", 64<<10), "tool results are cut to this many bytes [AGENTS_MAX_TOOL_RESULT_BYTES]")
	fs.IntVar(&o.maxRunEvents, "max-run-events", environ.int("AGENTS_MAX_RUN_EVENTS", 100_000), "events one run may publish (over all its attempts); past it the run fails (reason event_budget) [AGENTS_MAX_RUN_EVENTS]")
	o.maxRunEventBytes = environ.bytesDefault("AGENTS_MAX_RUN_EVENT_BYTES", 256<<20)
	fs.Var(&o.maxRunEventBytes, "max-run-event-bytes", "bytes of events one run may publish (e.g. 256MiB); past it the run fails (reason event_budget) [AGENTS_MAX_RUN_EVENT_BYTES]")
	fs.IntVar(&o.maxQueuedControls, "max-queued-controls", environ.int("AGENTS_MAX_QUEUED_CONTROLS", 1024), "steer/follow-up messages a run may have waiting for its agent; one more fails the run (reason control_budget) [AGENTS_MAX_QUEUED_CONTROLS]")
	o.maxQueuedControlBytes = environ.bytesDefault("AGENTS_MAX_QUEUED_CONTROL_BYTES", 4<<20)
	fs.Var(&o.maxQueuedControlBytes, "max-queued-control-bytes", "bytes of steer/follow-up messages a run may have waiting for its agent (reason control_budget past it) [AGENTS_MAX_QUEUED_CONTROL_BYTES]")
	o.maxTranscript = environ.bytesDefault("AGENTS_MAX_TRANSCRIPT_BYTES", 32<<20)
	o.loadBudget = environ.bytesDefault("AGENTS_LOAD_BUDGET", 128<<20)
	fs.Var(&o.loadBudget, "load-budget", "bytes of continued transcripts (continueFrom snapshots) this worker's runs hold at once; a continuation past what is free waits without a slot, one larger fails (reason transcript_too_large) [AGENTS_LOAD_BUDGET]")
	fs.Var(&o.maxTranscript, "max-transcript-bytes", "size of a run's transcript (its messages as JSON); past it the run fails (reason transcript_too_large) [AGENTS_MAX_TRANSCRIPT_BYTES]")
	fs.DurationVar(&o.scheduleLate, "schedule-late", environ.duration("AGENTS_SCHEDULE_LATE", 30*time.Second), "how late a schedule's fire may be taken and still count as on time; a later one is missed, run or not by its catch-up policy (protocol §2, Schedules) [AGENTS_SCHEDULE_LATE]")
	fs.DurationVar(&o.parkAfter, "park-after", environ.duration("AGENTS_PARK_AFTER", 30*time.Second), "park a run that has waited this long for approvals with nothing of it running: its request is acknowledged and it leaves the worker until an answer or an abort wakes it on any worker; 0: never park [AGENTS_PARK_AFTER]")
	fs.DurationVar(&o.maxRunTimeout, "max-run-timeout", environ.duration("AGENTS_MAX_RUN_TIMEOUT", 0), "ceiling of a run's timeout: a request asking more is a bad request, the default timeout is lowered to it; 0: the protocol's 7 days [AGENTS_MAX_RUN_TIMEOUT]")
	fs.DurationVar(&o.maxApprovalTimeout, "max-approval-timeout", environ.duration("AGENTS_MAX_APPROVAL_TIMEOUT", 0), "ceiling of a gated tool call's wait for its answer: a longer approval.timeoutSeconds (or the default, 1 day) is lowered to it, as the request's expiresAt shows; 0: --max-run-timeout if set, else the protocol's 7 days [AGENTS_MAX_APPROVAL_TIMEOUT]")
	fs.IntVar(&o.maxTurns, "max-turns", environ.int("AGENTS_MAX_TURNS", 0), "ceiling of a run's maxTurns: a request asking more is a bad request, the default is lowered to it; 0: the protocol's 1000 [AGENTS_MAX_TURNS]")
	fs.Var(&o.tenantWeights, "tenant-weights", "tenant=W: a tenant's weight in the fair share of the slots between tenants with work in one priority (default 1; give every worker the same); repeatable or comma-separated [AGENTS_TENANT_WEIGHTS]")
	fs.Var(&o.keyLimits, "concurrency-key-limit", "pattern=N: the default limit of concurrency keys matching pattern ('*' any characters but '/'; first match applies); a request's own limit may only be lower; repeatable or comma-separated [AGENTS_CONCURRENCY_KEY_LIMIT]")
	fs.Var(&o.queueConcurrency, "queue-concurrency", "queue=N: runs of that queue in flight at most, so one queue cannot take every slot; repeatable or comma-separated [AGENTS_QUEUE_CONCURRENCY]")
	if v := os.Getenv("AGENTS_ALLOW_FAUX"); v != "" {
		if err := o.allowFaux.Set(v); err != nil {
			environ.errs = append(environ.errs, fmt.Errorf("AGENTS_ALLOW_FAUX: %w", err))
		}
	}
	fs.Var(&o.allowFaux, "allow-faux", "let requests script the faux model (tests, demos); default on without a model endpoint, off with one [AGENTS_ALLOW_FAUX]")
	fs.DurationVar(&o.eventsMaxAge, "events-max-age", environ.duration("AGENTS_EVENTS_MAX_AGE", 7*24*time.Hour), "how long run events are kept (stream AGENTS_EVENTS) [AGENTS_EVENTS_MAX_AGE]")
	fs.DurationVar(&o.controlMaxAge, "control-max-age", environ.duration("AGENTS_CONTROL_MAX_AGE", 7*24*time.Hour), "how long control messages are kept (stream AGENTS_CONTROL) [AGENTS_CONTROL_MAX_AGE]")
	fs.DurationVar(&o.recordsTTL, "records-ttl", environ.duration("AGENTS_RECORDS_TTL", 7*24*time.Hour), "how long run records are kept (bucket agents_runs) [AGENTS_RECORDS_TTL]")
	o.requestsMaxBytes = environ.bytes("AGENTS_REQUESTS_MAX_BYTES")
	o.eventsMaxBytes = environ.bytes("AGENTS_EVENTS_MAX_BYTES")
	o.controlMaxBytes = environ.bytes("AGENTS_CONTROL_MAX_BYTES")
	fs.Var(&o.requestsMaxBytes, "requests-max-bytes", "byte limit of stream AGENTS_RUNS (e.g. 10GiB); set where the stream has none, raised never lowered [AGENTS_REQUESTS_MAX_BYTES]")
	fs.Var(&o.eventsMaxBytes, "events-max-bytes", "byte limit of stream AGENTS_EVENTS (oldest events go first); set where the stream has none, raised never lowered [AGENTS_EVENTS_MAX_BYTES]")
	fs.Var(&o.controlMaxBytes, "control-max-bytes", "byte limit of stream AGENTS_CONTROL; set where the stream has none, raised never lowered [AGENTS_CONTROL_MAX_BYTES]")
	fs.StringVar(&o.natsSync, "nats-sync", env("AGENTS_NATS_SYNC", natsembed.DefaultSync), "embedded NATS only: \"always\" fsyncs every write (nothing acknowledged is lost on power loss; much slower), or how often JetStream syncs to disk (a power cut loses up to that much) [AGENTS_NATS_SYNC]")
	fs.IntVar(&o.replicas, "stream-replicas", environ.int("AGENTS_STREAM_REPLICAS", 1), "replicas of the streams, consumers and bucket the worker creates (3 on a 3-node cluster) [AGENTS_STREAM_REPLICAS]")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", environ.duration("AGENTS_DRAIN_TIMEOUT", 30*time.Second), "on SIGTERM/SIGINT, how long running runs may finish before they are stopped and handed to another worker [AGENTS_DRAIN_TIMEOUT]")
	fs.DurationVar(&o.toolTimeout, "tool-timeout", environ.duration("AGENTS_TOOL_TIMEOUT", 2*time.Minute), "timeout of one tool call [AGENTS_TOOL_TIMEOUT]")
	fs.StringVar(&o.dataDir, "data-dir", env("AGENTS_DATA_DIR", defData), "data directory of the embedded NATS server (JetStream under <dir>/nats) [AGENTS_DATA_DIR]")
	fs.StringVar(&o.metricsAddr, "metrics-addr", env("AGENTS_METRICS_ADDR", "127.0.0.1:9464"), "address of /metrics, /healthz and /readyz (loopback by default, like everything else; :9464 for every interface, as Prometheus in another container needs); empty disables them [AGENTS_METRICS_ADDR]")
	fs.StringVar(&o.pprofAddr, "pprof", env("AGENTS_PPROF", ""), "loopback address (127.0.0.1:PORT) of net/http/pprof for profiling; empty disables it [AGENTS_PPROF]")
	fs.StringVar(&o.logFormat, "log-format", env("AGENTS_LOG_FORMAT", "text"), "log format: text or json [AGENTS_LOG_FORMAT]")
	fs.StringVar(&o.logLevel, "log-level", env("AGENTS_LOG_LEVEL", "info"), "log level: debug, info, warn, error [AGENTS_LOG_LEVEL]")
	fs.StringVar(&o.models, "models", env("AGENTS_MODELS", ""), "model table file (JSON: ids, context window, cost) [AGENTS_MODELS]")
	fs.StringVar(&o.defaultModel, "default-model", env("AGENTS_DEFAULT_MODEL", ""), "model of requests that name none, provider/id (default: the model table's first model, else openai/gpt-4o-mini; faux/demo without an endpoint) [AGENTS_DEFAULT_MODEL]")
	fs.StringVar(&o.openaiURL, "openai-base-url", env("OPENAI_BASE_URL", ""), "OpenAI-compatible API base URL, e.g. https://api.openai.com/v1 or http://localhost:11434/v1 [OPENAI_BASE_URL]")
	fs.StringVar(&o.openaiKey, "openai-api-key-file", env("OPENAI_API_KEY_FILE", ""), "file holding the API key (else OPENAI_API_KEY) [OPENAI_API_KEY_FILE]")
	fs.StringVar(&o.workerID, "worker-id", env("AGENTS_WORKER_ID", ""), "worker name in events and records (default hostname-random) [AGENTS_WORKER_ID]")
	// Tool sources: MCP servers and NATS tool services.
	fs.StringVar(&o.toolsConfig, "tools-config", env("AGENTS_TOOLS_CONFIG", ""), "MCP servers whose tools runs may use: a JSON file {\"mcpServers\": {\"<server>\": {\"command\", \"args\", \"env\"} or {\"url\", \"headers\"}}}; values may use ${VAR}; tools are named <server>__<tool> [AGENTS_TOOLS_CONFIG]")
	fs.StringVar(&o.toolServices, "tool-services", env("AGENTS_TOOL_SERVICES", ""), "NATS tool services (micro) whose tools runs may use: comma-separated names, or * for every service found; tools are named <service>__<endpoint> [AGENTS_TOOL_SERVICES]")
	o.toolsAuth.register(fs)        // toolsources.go
	o.budgets.register(fs)          // budgets.go
	otelFlag(fs, &o.otel, &environ) // trace.go
	showVersion := fs.Bool("version", false, "print the version and exit")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usageHead)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected argument %q (see --help)", fs.Arg(0))
	}
	if *showVersion {
		fmt.Fprintln(stderr, "worker", version)
		return nil, flag.ErrHelp
	}
	if _, _, err := natsembed.ParseSync(o.natsSync); err != nil {
		environ.errs = append(environ.errs, fmt.Errorf("--nats-sync: %w", err))
	}
	if len(environ.errs) > 0 {
		return nil, errors.Join(environ.errs...)
	}
	o.metricsAddrDefault = os.Getenv("AGENTS_METRICS_ADDR") == ""
	fs.Visit(func(f *flag.Flag) {
		if f.Name == "metrics-addr" {
			o.metricsAddrDefault = false
		}
	})
	// Secrets come from the environment after parsing, so --help never
	// prints them as defaults.
	o.conn.FromEnv()
	o.toolsAuth.fromEnv()
	if len(o.queues) == 0 {
		_ = o.queues.Set(env("AGENTS_QUEUES", bus.DefaultQueue))
	}
	for _, q := range o.queues {
		if err := bus.CheckQueue(q); err != nil {
			return nil, err
		}
	}
	if len(o.queueConcurrency) == 0 {
		if v := env("AGENTS_QUEUE_CONCURRENCY", ""); v != "" {
			_ = o.queueConcurrency.Set(v)
		}
	}
	if _, err := parseQueueConcurrency(o.queueConcurrency); err != nil {
		return nil, err
	}
	if len(o.keyLimits) == 0 {
		if v := env("AGENTS_CONCURRENCY_KEY_LIMIT", ""); v != "" {
			_ = o.keyLimits.Set(v)
		}
	}
	if _, err := parseKeyLimits(o.keyLimits); err != nil {
		return nil, err
	}
	if len(o.tenantWeights) == 0 {
		if v := env("AGENTS_TENANT_WEIGHTS", ""); v != "" {
			_ = o.tenantWeights.Set(v)
		}
	}
	if _, err := parseTenantWeights(o.tenantWeights); err != nil {
		return nil, err
	}
	if o.maxRunTimeout < 0 || o.maxTurns < 0 || o.maxApprovalTimeout < 0 {
		return nil, errors.New("--max-run-timeout, --max-approval-timeout and --max-turns must not be negative")
	}
	if o.concurrency < 1 {
		return nil, errors.New("--concurrency must be at least 1")
	}
	if o.ackWait < time.Second {
		return nil, errors.New("--ack-wait must be at least 1s")
	}
	if o.replicas < 1 || o.replicas > 5 {
		return nil, errors.New("--stream-replicas must be 1..5")
	}
	if o.logFormat != "text" && o.logFormat != "json" {
		return nil, fmt.Errorf("--log-format %q: use text or json", o.logFormat)
	}
	if err := o.budgets.load(); err != nil {
		return nil, err
	}
	if o.fetchBytes < 1 {
		return nil, errors.New("--fetch-bytes must be at least 1 (each pull loop still takes one request of the largest size)")
	}
	if o.scheduleLate < time.Second {
		return nil, fmt.Errorf("--schedule-late must be at least 1s (got %s): fires are planned on whole seconds", o.scheduleLate)
	}
	if o.parkAfter < 0 {
		return nil, errors.New("--park-after must be 0 (never) or more")
	}
	if o.maxWaiting < -1 {
		return nil, errors.New("--max-waiting must be -1 (never) or more")
	}
	if o.maxChildDepth < 1 || o.maxChildDepth > bus.MaxChildDepthLimit || o.maxChildren < 1 || o.maxChildren > bus.MaxChildrenLimit {
		return nil, fmt.Errorf("--max-child-depth must be in 1..%d and --max-children in 1..%d", bus.MaxChildDepthLimit, bus.MaxChildrenLimit)
	}
	if tools := bus.ParseApproveTools(o.approveTools); len(tools) > 0 {
		a := bus.Approval{Tools: tools}
		if p := a.Problems("--approve-tools"); len(p) > 0 {
			return nil, errors.New(strings.Join(p, "; "))
		}
	}
	return o, nil
}

// applyBounds puts the per-run bounds and ceilings into the worker's
// configuration (after modelConfig: the faux default depends on it).
func applyBounds(o *options, cfg *worker.Config) {
	cfg.ScheduleLate = o.scheduleLate
	cfg.MaxRunEvents = o.maxRunEvents
	cfg.MaxRunEventBytes = int64(o.maxRunEventBytes)
	cfg.MaxQueuedControls = o.maxQueuedControls
	cfg.MaxQueuedControlBytes = int(min(int64(o.maxQueuedControlBytes), 1<<40))
	cfg.MaxTranscriptBytes = int(min(int64(o.maxTranscript), 1<<40))
	cfg.LoadBudget = int64(o.loadBudget)
	cfg.MaxRunTimeout = o.maxRunTimeout
	cfg.MaxApprovalTimeout = o.maxApprovalTimeout
	cfg.MaxTurns = o.maxTurns
	cfg.QueueConcurrency, _ = parseQueueConcurrency(o.queueConcurrency)
	cfg.KeyLimits, _ = parseKeyLimits(o.keyLimits)
	cfg.TenantWeights, _ = parseTenantWeights(o.tenantWeights)
	// Faux lets a submitter script the "model": on by default only where
	// there is no real model (the quickstart's demo, tests).
	cfg.NoFaux = !o.allowFaux.v
	if !o.allowFaux.set {
		cfg.NoFaux = len(cfg.Providers) > 0
	}
}

// parseQueueConcurrency reads --queue-concurrency's queue=N entries.
func parseQueueConcurrency(entries []string) (map[string]int, error) {
	out := map[string]int{}
	for _, e := range entries {
		q, n, ok := strings.Cut(e, "=")
		v, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || err != nil || v < 1 {
			return nil, fmt.Errorf("--queue-concurrency %q: use queue=N with N at least 1", clip(e))
		}
		q = strings.TrimSpace(q)
		if err := bus.CheckQueue(q); err != nil {
			return nil, fmt.Errorf("--queue-concurrency: %w", err)
		}
		out[q] = v
	}
	return out, nil
}

// parseTenantWeights reads --tenant-weights' tenant=W entries; the error
// lists every bad one.
func parseTenantWeights(entries []string) (map[string]float64, error) {
	out := map[string]float64{}
	var bad []string
	for _, e := range entries {
		t, w, ok := strings.Cut(e, "=")
		t = strings.TrimSpace(t)
		v, err := strconv.ParseFloat(strings.TrimSpace(w), 64)
		if !ok || err != nil || !(v > 0 && v <= 1000) || (t != bus.NoTenant && !bus.ValidTenant(t)) {
			bad = append(bad, fmt.Sprintf("%q", clip(e)))
			continue
		}
		out[t] = v
	}
	if len(bad) > 0 {
		return nil, fmt.Errorf("--tenant-weights %s: use tenant=W, the tenant [A-Za-z0-9_-]{1,64} (_ for runs without one), W above 0 and at most 1000", strings.Join(bad, ", "))
	}
	return out, nil
}

// parseKeyLimits reads --concurrency-key-limit's pattern=N entries.
func parseKeyLimits(entries []string) ([]worker.KeyLimit, error) {
	var out []worker.KeyLimit
	for _, e := range entries {
		p, n, ok := strings.Cut(e, "=")
		v, err := strconv.Atoi(strings.TrimSpace(n))
		p = strings.TrimSpace(p)
		if _, perr := path.Match(p, ""); !ok || err != nil || v < 1 || v > bus.MaxConcurrencyLimit || p == "" || perr != nil {
			return nil, fmt.Errorf("--concurrency-key-limit %q: use pattern=N with N 1..%d", clip(e), bus.MaxConcurrencyLimit)
		}
		out = append(out, worker.KeyLimit{Pattern: p, Limit: v})
	}
	return out, nil
}

func newLogger(o *options, w io.Writer) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	ho := &slog.HandlerOptions{Level: level}
	if o.logFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, ho)), nil
	}
	return slog.New(slog.NewTextHandler(w, ho)), nil
}

// started tells tests where a running worker can be reached.
type started struct {
	NATSURL     string
	MetricsAddr string // "" when metrics are disabled
}

// run is main without the process: it returns the exit code. ready, if
// not nil, is told once the worker is connected and serving (tests).
func run(ctx context.Context, args []string, stderr io.Writer, ready chan<- started) int {
	o, err := parse(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "worker:", err)
		return 2
	}
	log, err := newLogger(o, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "worker:", err)
		return 2
	}
	tr, stopTracing, err := startTracing(ctx, o.otel, log) // trace.go
	if err != nil {
		log.Error("tracing configuration", "err", err)
		return 2
	}
	defer stopTracing()
	cfg, modelIDs, err := modelConfig(o, log)
	if err != nil {
		log.Error("model configuration", "err", err)
		return 2
	}
	tools, err := loadToolSources(o) // toolsources.go
	if err != nil {
		log.Error("tools configuration", "err", err)
		return 2
	}

	var srv *natsembed.Server
	if o.conn.URL == "" {
		srv, err = startEmbedded(ctx, o, log)
		if err != nil {
			log.Error(err.Error())
			return 1
		}
		defer srv.Shutdown()
		o.conn.URL = srv.URL()
		log.Info("embedded NATS server started; connect other workers and clients with --nats "+srv.URL()+" or NATS_URL="+srv.URL(),
			"url", srv.URL(), "store", filepath.Join(o.dataDir, "nats"))
	}
	o.conn.Logger = log
	o.conn.Name = "agentfleet-worker"
	cctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	c, err := bus.Connect(cctx, o.conn)
	cancel()
	if err != nil {
		log.Error("cannot connect to NATS", "err", err)
		return 1
	}
	defer c.Close()
	log.Info("connected to NATS", "url", bus.RedactURL(c.Conn().ConnectedUrlRedacted()))

	// Metrics: the observer is in place before the worker starts; /readyz
	// says whether NATS is connected and the runs stream is reachable.
	reg := prometheus.NewRegistry()
	m := metrics.New(reg, metrics.Config{Models: modelIDs, Tools: toolNames(cfg.Tools), Queues: o.queues})
	cfg.Observer = worker.MetricsObserver(m)
	if cfg.RateLimits != nil {
		reg.MustRegister(cfg.RateLimits.Seam.Collector(metrics.Namespace))
	}
	var metricsAddr string
	if o.metricsAddr != "" {
		ln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil && o.metricsAddrDefault {
			log.Warn("the default metrics address is in use (another worker on this machine?); serving metrics on a free port instead", "wanted", o.metricsAddr)
			ln, err = net.Listen("tcp", "127.0.0.1:0")
		}
		if err != nil {
			log.Error("cannot serve metrics: --metrics-addr "+o.metricsAddr+" is unavailable (already in use?); pass another address or an empty one to disable", "err", err)
			return 1
		}
		metricsAddr = ln.Addr().String()
		hs := &http.Server{Handler: metrics.Handler(reg, readiness(c, o.queues)), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = hs.Serve(ln) }()
		defer func() {
			sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer scancel()
			_ = hs.Shutdown(sctx)
		}()
		log.Info("serving /metrics, /healthz and /readyz", "addr", metricsAddr)
	}

	if o.pprofAddr != "" {
		stop, err := servePprof(o.pprofAddr, log)
		if err != nil {
			log.Error("cannot serve pprof", "err", err)
			return 1
		}
		defer stop()
	}

	cfg.Client = c
	cfg.Queues = o.queues
	cfg.Concurrency = o.concurrency
	cfg.AckWait = o.ackWait
	cfg.MaxDeliver = o.maxDeliver
	cfg.MaxAckPending = o.maxAckPending
	cfg.FetchBytes = int(min(int64(o.fetchBytes), 1<<40))
	cfg.NoEventBatches = !o.eventBatches
	cfg.MaxWaiting = o.maxWaiting
	cfg.MaxChildDepth, cfg.MaxChildren = o.maxChildDepth, o.maxChildren
	cfg.ParkAfter = o.parkAfter
	if cfg.ParkAfter == 0 {
		cfg.ParkAfter = -1 // 0 from the flag: never park
	}
	if cfg.MaxWaiting == 0 {
		cfg.MaxWaiting = -1 // 0 from the flag: none off their slot
	}
	cfg.ApproveTools = bus.ParseApproveTools(o.approveTools)
	cfg.Streams.Replicas = o.replicas
	cfg.Streams.EventsMaxAge = o.eventsMaxAge
	cfg.Streams.RequestsMaxBytes = int64(o.requestsMaxBytes)
	cfg.Streams.EventsMaxBytes = int64(o.eventsMaxBytes)
	cfg.Streams.ControlMaxBytes = int64(o.controlMaxBytes)
	cfg.Streams.ControlMaxAge = o.controlMaxAge
	cfg.Streams.RecordsTTL = o.recordsTTL
	cfg.DrainTimeout = o.drainTimeout
	cfg.ToolTimeout = o.toolTimeout
	cfg.MaxToolArgsBytes = o.maxToolArgs
	cfg.MaxToolResultBytes = o.maxToolResult
	cfg.WorkerID = o.workerID
	cfg.TracerProvider, cfg.TraceContent = tr.Provider, tr.CaptureContent
	applyBounds(o, &cfg)
	if cfg.Budgets = o.budgets.config(); cfg.Budgets != nil {
		reg.MustRegister(cfg.Budgets.Stats.Collector(metrics.Namespace))
	}
	cfg.Logger = log
	cfg.Version = version
	toolsConn := c.Conn()
	if len(tools.services) > 0 {
		switch {
		case o.toolsAuth.set():
			tc, err := connectTools(ctx, o)
			if err != nil {
				log.Error("cannot connect to NATS for tool calls (--tools-user, --tools-creds, --tools-nkey, --tools-tlscert)", "err", err)
				return 1
			}
			defer tc.Close()
			toolsConn = tc.Conn()
			log.Info("tool services are called on a connection of their own", "user", o.toolsAuth.user)
		case srv == nil:
			log.Warn("tool services are called with the worker's own NATS connection and permissions: " +
				"give the calls an identity that may publish only agents.tools.> and $SRV.INFO " +
				"(--tools-user and AGENTS_TOOLS_PASSWORD, --tools-creds, --tools-nkey or --tools-tlscert; user toolcaller of deploy/nats/accounts.conf)")
		}
	}
	if cfg.ToolSources, err = tools.sources(toolsConn, c.Names().Prefix(), log); err != nil {
		log.Error("tools configuration", "err", err)
		return 2
	}
	w, err := worker.New(cfg)
	if err != nil {
		log.Error("worker configuration", "err", err)
		return 2
	}
	runErr := make(chan error, 1)
	go func() { runErr <- w.Run(ctx) }()
	// Queue depth is polled once the worker has ensured the consumers.
	pctx, pcancel := context.WithCancel(ctx)
	polled := make(chan struct{})
	defer func() { pcancel(); <-polled }()
	select {
	case <-w.Ready():
		go func() {
			defer close(polled)
			worker.PollQueueDepth(pctx, c, o.queues, 15*time.Second, m.SetQueueDepth, m.SetLaneDepth, m.SetTenantDepths)
		}()
		if srv != nil {
			nextSteps(stderr, log, o, srv.URL()) // nextsteps.go
		}
		if ready != nil {
			ready <- started{NATSURL: o.conn.URL, MetricsAddr: metricsAddr}
		}
		err = <-runErr
	case err = <-runErr:
		close(polled)
	}
	if err != nil {
		log.Error("worker failed", "err", err)
		return 1
	}
	// Flush what is left and close: subscriptions first, then publishes.
	closed := make(chan struct{})
	c.Conn().SetClosedHandler(func(*nats.Conn) { close(closed) })
	if err := c.Conn().Drain(); err == nil {
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
		}
	}
	log.Info("worker exited")
	return 0
}

func startEmbedded(ctx context.Context, o *options, log *slog.Logger) (*natsembed.Server, error) {
	host, portS, err := net.SplitHostPort(o.listen)
	if err != nil {
		return nil, fmt.Errorf("--nats-listen %q: %w", o.listen, err)
	}
	port, err := strconv.Atoi(portS)
	if err != nil {
		return nil, fmt.Errorf("--nats-listen %q: bad port", o.listen)
	}
	if port == 0 {
		port = -1
	}
	dir := filepath.Join(o.dataDir, "nats")
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	return natsembed.StartContext(ctx, natsembed.Options{Host: host, Port: port, StoreDir: dir, Logger: serverLogger(log, o.logLevel), Sync: o.natsSync})
}

// readiness is /readyz: NATS connected and the runs stream reachable.
func readiness(c *bus.Client, queues []string) func(context.Context) error {
	return func(ctx context.Context) error {
		if !c.Conn().IsConnected() {
			return fmt.Errorf("NATS is %s", strings.ToLower(c.Conn().Status().String()))
		}
		js := c.JetStream()
		if _, err := js.Stream(ctx, c.Names().RunsStream()); err != nil {
			return fmt.Errorf("stream %s: %w", c.Names().RunsStream(), err)
		}
		for _, q := range queues {
			if _, err := js.Consumer(ctx, c.Names().RunsStream(), c.Names().Consumer(q)); err != nil {
				return fmt.Errorf("consumer %s: %w", c.Names().Consumer(q), err)
			}
		}
		return nil
	}
}

// toolNames lists the tools runs may use (the built-ins and cfg's own), for
// the bounded tool label of the metrics.
func toolNames(extra []*agent.Tool) []string {
	var names []string
	for _, t := range append(worker.BuiltinTools(), extra...) {
		names = append(names, t.Name)
	}
	return names
}

// modelConfig sets up the model providers: OpenAI-compatible when an
// endpoint or key is configured, else the demo model. It also returns the
// model table's ids (the metrics' model label values).
func modelConfig(o *options, log *slog.Logger) (worker.Config, []string, error) {
	var cfg worker.Config
	key := os.Getenv("OPENAI_API_KEY")
	if o.openaiKey != "" {
		b, err := os.ReadFile(o.openaiKey)
		if err != nil {
			return cfg, nil, fmt.Errorf("--openai-api-key-file: %w", err)
		}
		key = strings.TrimSpace(string(b))
	}
	var models []openai.ModelInfo
	if o.models != "" {
		var err error
		if models, err = openai.LoadModels(o.models); err != nil {
			return cfg, nil, fmt.Errorf("--models: %w", err)
		}
	}
	// Entries "faux/<id>" give faux models a context window (compaction
	// in tests and demos); they are not the endpoint's models.
	models, cfg.ModelWindows = splitModelWindows(models)
	cfg.DefaultModel = o.defaultModel
	if o.openaiURL == "" && key == "" {
		if cfg.DefaultModel == "" {
			cfg.DefaultModel = "faux/demo"
		}
		log.Warn("NO MODEL ENDPOINT CONFIGURED: using the DEMO model, whose replies are canned. " +
			"Set OPENAI_BASE_URL and OPENAI_API_KEY (or --openai-api-key-file) to use a real model.")
		return cfg, nil, nil
	}
	pcfg := openai.Config{BaseURL: o.openaiURL, APIKey: key, Models: models}
	if rl := rateLimits("openai", models); rl != nil {
		// The provider reports 429s and asks before each attempt; the
		// worker holds the shared state (worker/ratelimit.go).
		cfg.RateLimits, pcfg.Gate, pcfg.OnRetryAfter = rl, rl.Seam.Gate, rl.Seam.OnRetryAfter
	}
	p, err := openai.New(pcfg)
	if err != nil {
		return cfg, nil, err
	}
	cfg.Providers = map[string]worker.Provider{"openai": p}
	if cfg.DefaultModel == "" {
		cfg.DefaultModel = "openai/gpt-4o-mini"
		if len(models) > 0 {
			cfg.DefaultModel = "openai/" + models[0].ID
		}
	}
	base := o.openaiURL
	if base == "" {
		base = "https://api.openai.com/v1"
	}
	log.Info("model endpoint configured", "baseURL", bus.RedactURL(base), "apiKey", key != "", "models", len(models), "defaultModel", cfg.DefaultModel)
	ids := make([]string, len(models))
	for i, m := range models {
		ids[i] = m.ID
	}
	return cfg, ids, nil
}

// splitModelWindows takes the faux entries out of the model table and
// returns every entry's context window and compaction defaults by
// "provider/id" (the endpoint's are "openai/<id>").
func splitModelWindows(models []openai.ModelInfo) ([]openai.ModelInfo, map[string]worker.ModelWindow) {
	windows := map[string]worker.ModelWindow{}
	kept := models[:0:0]
	for _, m := range models {
		w := worker.ModelWindow{ContextWindow: m.ContextWindow}
		if c := m.Compaction; c != nil {
			w.ReserveTokens, w.KeepRecentTokens = c.ReserveTokens, c.KeepRecentTokens
		}
		if id, ok := strings.CutPrefix(m.ID, "faux/"); ok && id != "" {
			windows["faux/"+id] = w
			continue
		}
		windows["openai/"+m.ID] = w
		kept = append(kept, m)
	}
	if len(windows) == 0 {
		windows = nil
	}
	return kept, windows
}

// rateLimits are the shared rate limits of the model table's entries that
// have limits, or nil when none has.
func rateLimits(provider string, models []openai.ModelInfo) *worker.RateLimits {
	rl := &worker.RateLimits{Models: map[string]worker.ModelLimit{}}
	groups := map[string]string{}
	for _, m := range models {
		if m.Limits == nil {
			continue
		}
		lim := ratelimit.Limits{RPM: m.Limits.RPM, TPM: m.Limits.TPM, Concurrency: m.Limits.Concurrency}
		if lim.IsZero() {
			continue
		}
		rl.Models[provider+"/"+m.ID] = worker.ModelLimit{Group: m.Group(), Limits: lim, MaxTokens: m.MaxTokens}
		groups[m.ID] = m.Group()
	}
	if len(groups) == 0 {
		return nil
	}
	rl.Seam = ratelimit.NewSeam(groups)
	return rl
}
