package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"

	"github.com/agentfleet/agentfleet/bus"
)

// serverLogger is the embedded nats-server's logger: its warnings and
// errors only (its start banner is twenty lines a newcomer need not read;
// the worker logs one line instead), all of it at --log-level debug.
func serverLogger(log *slog.Logger, level string) *slog.Logger {
	if level == "debug" {
		return log
	}
	return slog.New(atLeast{log.Handler(), slog.LevelWarn})
}

// atLeast drops records below min.
type atLeast struct {
	slog.Handler
	min slog.Level
}

func (a atLeast) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= a.min && a.Handler.Enabled(ctx, l)
}

func (a atLeast) WithAttrs(attrs []slog.Attr) slog.Handler {
	return atLeast{a.Handler.WithAttrs(attrs), a.min}
}

func (a atLeast) WithGroup(name string) slog.Handler {
	return atLeast{a.Handler.WithGroup(name), a.min}
}

// nextSteps tells a person who just started the Quickstart fleet (the
// embedded server) what to run next and where its data lives. With
// --log-format json it is one log record instead.
func nextSteps(w io.Writer, log *slog.Logger, o *options, url string) {
	submit := `submit "Hello, fleet"`
	var flags []string
	if url != "nats://127.0.0.1:4222" {
		flags = append(flags, "--nats "+url)
	}
	if !slices.Contains(o.queues, bus.DefaultQueue) {
		flags = append(flags, "--queue "+o.queues[0])
	}
	if len(flags) > 0 {
		submit = "submit " + strings.Join(flags, " ") + ` "Hello, fleet"`
	}
	data := o.dataDir
	if o.logFormat == "json" {
		log.Info("ready: in another terminal, "+submit, "data", data)
		return
	}
	fmt.Fprintf(w, "\nThe fleet is ready. In another terminal:\n\n    %s\n\n"+
		"(submit is installed by `go install ./cmd/...`; see README.md.)\n"+
		"Runs and their events are kept in %s across restarts;\n"+
		"to start afresh, stop this worker (Ctrl-C) and delete that directory.\n\n", submit, data)
}
