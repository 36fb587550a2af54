package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

const usageText = `submit talks to an agentfleet: it submits runs and follows them live,
steers, aborts and inspects them, and benchmarks the fleet.

Usage:
  submit [flags] "prompt"          submit a run and follow it live (same as: submit run)
  submit run [flags] "prompt"      the explicit form, for a prompt that is a command's name
  submit follow RUN                replay a run from the start, then follow it live
  submit steer RUN "text"          steer a running run (taken after the current turn)
  submit followup RUN "text"       queue a follow-up (taken when the run would stop)
  submit abort RUN [--reason R]    abort a run
  submit compact RUN [--instructions T]  compact a run's context at its next model call
  submit status RUN                a run's record
  submit list [--state S] [--schedule NAME] [--limit N] [--before T|RUN|@CURSOR] [--since 1h] [--json]
  submit result RUN [--transcript] the final answer (waits for a running run)
  submit reply RUN "text"          a new run that continues RUN's conversation
  submit bench [--runs N] ...      load-test the fleet (faux model by default)
  submit tools [--json]            the tools the fleet's workers serve (name, source, workers)
  submit budgets [--all] [--json]  tenants' spending this period (spent, limit, remaining, resets)
  submit approvals [--queue Q]     tool calls waiting for a person's approval, fleet-wide (pages: --limit, --before @CURSOR)
  submit approve RUN CALL          approve a call [--args JSON edits it] [--by NAME]
  submit deny RUN CALL --reason R  deny a call (the model sees the reason)
  submit schedule create NAME --every 1h|--cron "0 0 9 * * MON" [--tz Z]|--at T "prompt"
                                   runs on a clock; also list, show, pause, resume, delete, trigger

A local fleet (embedded NATS, one worker, the demo model): worker
(go install ./cmd/... in the agentfleet repository installs both commands)

The prompt: arguments (joined by spaces), --file F, or "-" / --file - for stdin.
While following on a terminal, a typed line steers the run; /followup TEXT
queues a follow-up, /abort aborts it; /approve [CALL] and /deny [CALL] REASON
answer a tool call that waits for approval. Ctrl-C (or SIGTERM) detaches (the
run goes on); --abort-on-interrupt makes it abort instead.

Exit codes: 0 succeeded, 1 failed (or no such run, or an error), 2 usage
error, 3 aborted, 4 cannot reach NATS (or the fleet's streams), 130 detached
by Ctrl-C or SIGTERM.

Connection flags (every command; environment in brackets):
  --nats URL        NATS server URL(s) [NATS_URL] (default nats://127.0.0.1:4222)
  --creds FILE      credentials file [NATS_CREDS]
  --user, --password, --token   [NATS_USER, NATS_PASSWORD, NATS_TOKEN]
  --nkey FILE       NKey seed file [NATS_NKEY]
  --tlsca, --tlscert, --tlskey FILE   [NATS_CA, NATS_CERT, NATS_KEY]
  --prefix P        subject prefix [AGENTS_PREFIX] (default agents)
  --otel            export an OpenTelemetry trace over OTLP/HTTP (OTEL_* variables);
                    requests and controls carry it to the workers [AGENTS_OTEL]

Run "submit COMMAND --help" for a command's flags.
`

// errUsage marks errors that are the user's (exit 2).
type usageError struct{ msg string }

func (u *usageError) Error() string { return u.msg }

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

type command struct {
	name string
	run  func(ctx context.Context, e *env, args []string) int
}

func commands() []command {
	return []command{
		{"run", cmdRun},
		{"follow", cmdFollow},
		{"steer", cmdSteer},
		{"followup", cmdFollowUp},
		{"abort", cmdAbort},
		{"compact", cmdCompact}, // commands.go
		{"status", cmdStatus},
		{"list", cmdList},
		{"result", cmdResult},
		{"reply", cmdReply},
		{"bench", cmdBench},
		{"budgets", cmdBudgets},     // budgets.go
		{"tools", cmdTools},         // tools.go
		{"approvals", cmdApprovals}, // approvals.go
		{"approve", cmdApprove},
		{"deny", cmdDeny},
		{"schedule", cmdSchedule}, // schedule.go
	}
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, e *env) int {
	if len(args) == 0 {
		fmt.Fprint(e.stderr, usageText)
		return exitUsage
	}
	switch args[0] {
	case "help", "-h", "-help", "--help":
		if len(args) > 1 && args[0] == "help" {
			for _, c := range commands() {
				if c.name == args[1] {
					return c.run(ctx, e, []string{"--help"})
				}
			}
		}
		fmt.Fprint(e.stdout, usageText)
		return exitOK
	}
	// Flags may come before the command (submit --nats X status RUN):
	// find the first argument that is not a flag or a flag's value.
	i := firstPositional(args)
	if i >= 0 {
		for _, c := range commands() {
			if mk := promptWords[args[i]]; c.name == args[i] && mk != nil && !takesOnly(mk(e), args[:i]) {
				break // a prompt after run-only flags (tools.go)
			}
			if c.name == args[i] {
				rest := append(append([]string{}, args[:i]...), args[i+1:]...)
				return c.run(ctx, e, rest)
			}
		}
	}
	return cmdRun(ctx, e, args)
}

// firstPositional returns the index of the first argument that is neither a
// flag nor the value of one (judged by the run command's flags, a superset
// of the connection flags), or -1.
func firstPositional(args []string) int {
	fs := flag.NewFlagSet("probe", flag.ContinueOnError)
	var rf runFlags
	rf.register(fs, &env{getenv: func(string) string { return "" }})
	var cf bus.ConnectOptions
	var noColor bool
	addConnFlags(fs, &cf, &noColor, func(string) string { return "" })
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			return -1
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			return i
		}
		name := strings.TrimLeft(a, "-")
		if strings.Contains(name, "=") {
			continue
		}
		f := fs.Lookup(name)
		if f == nil {
			continue
		}
		if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
			continue
		}
		i++ // the flag's value
	}
	return -1
}

// parseArgs parses flags anywhere among the arguments (submit abort RUN
// --reason x) and returns the positional ones. "--" ends the flags.
func parseArgs(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		consumed := len(args) - fs.NArg()
		rest := fs.Args()
		if consumed > 0 && args[consumed-1] == "--" {
			return append(pos, rest...), nil
		}
		if len(rest) == 0 {
			return pos, nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// newFlagSet makes a flag set whose errors and help go to stderr, with a
// usage line.
func newFlagSet(e *env, name, usage string) *cmdFlags {
	fs := &cmdFlags{flag.NewFlagSet(name, flag.ContinueOnError), usage}
	fs.SetOutput(e.stderr)
	// The flag package calls Usage on --help too, where printHelp says it
	// all: parseCommand prints the hint on a bad flag only.
	fs.Usage = func() {}
	return fs
}

// cmdFlags is a command's flag set and its usage line.
type cmdFlags struct {
	*flag.FlagSet
	usage string
}

// printHelp prints a command's usage and flags (for --help, on stdout).
func printHelp(e *env, fs *cmdFlags) {
	fmt.Fprintf(e.stdout, "Usage: %s\n\nFlags:\n", fs.usage)
	fs.SetOutput(e.stdout)
	fs.PrintDefaults()
	fs.SetOutput(e.stderr)
}

// parseCommand parses a command's flags; ok false means return code.
func parseCommand(e *env, fs *cmdFlags, args []string) (pos []string, code int, ok bool) {
	pos, err := parseArgs(fs.FlagSet, args)
	if errors.Is(err, flag.ErrHelp) {
		printHelp(e, fs)
		return nil, exitOK, false
	}
	if err != nil {
		// The flag package has printed the error.
		fmt.Fprintf(e.stderr, "Usage: %s\nRun 'submit %s --help' for its flags, 'submit help' for the commands.\n", fs.usage, fs.Name())
		return nil, exitUsage, false
	}
	return pos, 0, true
}

// fail prints an error and returns its exit code: 2 for usage errors, 4
// for an unreachable NATS or fleet, 1 otherwise.
func fail(e *env, err error) int {
	var ue *usageError
	var ce *connectError
	switch {
	case errors.As(err, &ue):
		fmt.Fprintf(e.stderr, "submit: %v\nRun 'submit help' for usage.\n", err)
		return exitUsage
	case errors.As(err, &ce):
		fmt.Fprintf(e.stderr, "submit: %v\n", err)
		return exitUnreachable
	case errors.Is(err, context.Canceled):
		fmt.Fprintln(e.stderr, "submit: interrupted")
		return exitDetached
	}
	fmt.Fprintf(e.stderr, "submit: %v\n", err)
	return exitFailed
}

func env2(getenv func(string) string, name, def string) string {
	if v := getenv(name); v != "" {
		return v
	}
	return def
}

// addConnFlags registers the connection flags, as cmd/worker has them.
// Secrets get no default from the environment here (FromEnv fills them
// after parsing), so --help never shows them.
func addConnFlags(fs *flag.FlagSet, o *bus.ConnectOptions, noColor *bool, getenv func(string) string) {
	fs.StringVar(&o.URL, "nats", env2(getenv, "NATS_URL", bus.DefaultURL), "NATS server URL(s), comma-separated [NATS_URL]")
	fs.StringVar(&o.User, "user", env2(getenv, "NATS_USER", ""), "NATS user [NATS_USER]")
	fs.StringVar(&o.Password, "password", "", "NATS password (prefer the environment: flags show in ps) [NATS_PASSWORD]")
	fs.StringVar(&o.Token, "token", "", "NATS auth token (prefer the environment) [NATS_TOKEN]")
	fs.StringVar(&o.NKeySeedFile, "nkey", env2(getenv, "NATS_NKEY", ""), "file with an NKey user seed [NATS_NKEY]")
	fs.StringVar(&o.CredsFile, "creds", env2(getenv, "NATS_CREDS", ""), "NATS credentials (.creds) file [NATS_CREDS]")
	fs.StringVar(&o.TLSCA, "tlsca", env2(getenv, "NATS_CA", ""), "CA certificate file to verify the server [NATS_CA]")
	fs.StringVar(&o.TLSCert, "tlscert", env2(getenv, "NATS_CERT", ""), "client certificate file (mutual TLS) [NATS_CERT]")
	fs.StringVar(&o.TLSKey, "tlskey", env2(getenv, "NATS_KEY", ""), "client key file (mutual TLS) [NATS_KEY]")
	fs.StringVar(&o.Prefix, "prefix", env2(getenv, "AGENTS_PREFIX", bus.DefaultPrefix), "subject prefix [AGENTS_PREFIX]")
	fs.BoolVar(noColor, "no-color", false, "no colours (also: NO_COLOR set, or output not a terminal)")
}

// conn holds the connection flags of a command.
type conn struct {
	opts    bus.ConnectOptions
	noColor bool
	otel    bool // trace.go
}

func (c *conn) register(fs *flag.FlagSet, e *env) {
	addConnFlags(fs, &c.opts, &c.noColor, e.getenv)
	otelFlag(fs, &c.otel, e)
}

// connectError is a NATS or fleet that cannot be reached (exit 4).
type connectError struct {
	url string
	err error
	// noStreams: NATS answered but the fleet's streams do not exist.
	noStreams bool
}

func (c *connectError) Error() string {
	if c.noStreams {
		return fmt.Sprintf("NATS at %s has no agentfleet streams (%v).\n"+
			"No worker has run against this server yet: start one, which creates them:\n"+
			"  worker --nats %s", c.url, c.err, c.url)
	}
	return fmt.Sprintf("cannot reach NATS at %s: %v\n"+
		"Start a local fleet (embedded NATS, one worker, the demo model) with:\n"+
		"  worker\n"+
		"(installed with submit: go install ./cmd/... in the agentfleet repository)\n"+
		"or point --nats / NATS_URL at your NATS server.", c.url, c.err)
}

func (c *connectError) Unwrap() error { return c.err }

// connect connects with the command's connection flags and the environment.
func (c *conn) connect(ctx context.Context, e *env) (*bus.Client, error) {
	o := c.opts
	// FromEnv reads the process environment; honour the env seam instead.
	fill := func(p *string, name string) {
		if *p == "" {
			*p = e.getenv(name)
		}
	}
	fill(&o.Password, "NATS_PASSWORD")
	fill(&o.Token, "NATS_TOKEN")
	o.Name = "agentfleet-submit"
	if o.Timeout == 0 {
		o.Timeout = 5 * time.Second
	}
	if _, err := bus.NewNames(o.Prefix); err != nil {
		return nil, usagef("%v", err)
	}
	cctx, cancel := context.WithTimeout(ctx, o.Timeout+time.Second)
	defer cancel()
	cl, err := bus.Connect(cctx, o)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &connectError{url: bus.RedactURL(o.URL), err: unwrapConnect(err)}
	}
	return cl, nil
}

// unwrapConnect drops bus's "connect to NATS at URL:" prefix, which our
// message repeats.
func unwrapConnect(err error) error {
	if u := errors.Unwrap(err); u != nil {
		return u
	}
	return err
}

// fleetError turns "no stream answers" into a connectError with the hint.
func fleetError(c *bus.Client, err error) error {
	if err == nil {
		return nil
	}
	if errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrJetStreamNotEnabled) ||
		errors.Is(err, jetstream.ErrBucketNotFound) {
		return &connectError{url: bus.RedactURL(c.Conn().ConnectedUrlRedacted()), err: err, noStreams: true}
	}
	return err
}

// interruptible returns a context cancelled by Ctrl-C, for commands that
// have nothing better to do with it than stop.
func interruptible(ctx context.Context, e *env) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-e.interrupts:
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// readArg reads "-" as stdin.
func readText(e *env, args []string) (string, error) {
	if len(args) == 1 && args[0] == "-" {
		b, err := io.ReadAll(io.LimitReader(e.stdin, bus.MaxPromptBytes+1))
		if err != nil {
			return "", err
		}
		return strings.TrimRight(string(b), "\n"), nil
	}
	return strings.Join(args, " "), nil
}

func readFileOrStdin(e *env, name string) ([]byte, error) {
	if name == "-" {
		return io.ReadAll(io.LimitReader(e.stdin, bus.MaxRequestBytes+1))
	}
	return os.ReadFile(name)
}

// writeJSON prints v as indented JSON, the --json output of the commands.
func writeJSON(e *env, v any) int {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(e, err)
	}
	return exitOK
}

// orEmpty makes a nil list print as [] rather than null.
func orEmpty[T any](s []T) []T {
	if s == nil {
		return []T{}
	}
	return s
}
