// Command submit is agentfleet's command line: it submits runs to the fleet
// and follows them live, steers, aborts and inspects them, and benchmarks the
// fleet. See submit help.
package main

import (
	"context"
	"errors"
	"io"
	"os"
	"os/signal"
	"syscall"

	"golang.org/x/term"
)

// Exit codes (documented in the usage text and the README).
const (
	exitOK          = 0   // the run succeeded (or the command did its job)
	exitFailed      = 1   // the run failed, no such run, or an error
	exitUsage       = 2   // bad flags or arguments
	exitAborted     = 3   // the run was aborted
	exitUnreachable = 4   // NATS (or the fleet's streams) cannot be reached
	exitDetached    = 130 // Ctrl-C detached from the run (it goes on)
)

func main() {
	interrupts := make(chan os.Signal, 4)
	// SIGTERM (a CI job cancelled, a container stopped) is an interrupt
	// too: the command exits as on Ctrl-C, flushing its trace.
	signal.Notify(interrupts, os.Interrupt, syscall.SIGTERM)
	resize := make(chan os.Signal, 1)
	notifyResize(resize) // cbreak_unix.go
	e := &env{
		stdin:      os.Stdin,
		stdout:     os.Stdout,
		stderr:     os.Stderr,
		getenv:     os.Getenv,
		stdinTTY:   term.IsTerminal(int(os.Stdin.Fd())),
		stdoutTTY:  term.IsTerminal(int(os.Stdout.Fd())),
		stderrTTY:  term.IsTerminal(int(os.Stderr.Fd())),
		interrupts: interrupts,
		resize:     resize,
		cbreak:     func() (*termMode, error) { return cbreak(int(os.Stdin.Fd())) },
		width: func() int {
			w, _, err := term.GetSize(int(os.Stdout.Fd()))
			if err != nil {
				return 0
			}
			return w
		},
	}
	os.Exit(run(context.Background(), os.Args[1:], e))
}

// env is everything the CLI touches outside itself, so tests can run it
// in-process with their own streams, environment and "terminal".
type env struct {
	stdin          io.Reader
	stdout, stderr io.Writer
	getenv         func(string) string
	// Whether each stream is a terminal: colours, live status and the
	// progress bar only on a terminal; interactive steering only when
	// stdin and stdout are.
	stdinTTY, stdoutTTY, stderrTTY bool
	// interrupts delivers Ctrl-C (SIGINT) and SIGTERM.
	interrupts <-chan os.Signal
	// width returns the terminal's width in columns, 0 if unknown;
	// resize tells when it changes (SIGWINCH).
	width  func() int
	resize <-chan os.Signal
	// cbreak turns the terminal's echo and line editing off (submit then
	// draws what is typed, termui.go); nil, or an error, where it cannot.
	cbreak func() (*termMode, error)
}

// keyMode puts the terminal in cbreak mode for the keys of a followed run.
func (e *env) keyMode() (*termMode, error) {
	if e.cbreak == nil {
		return nil, errors.New("no terminal modes here")
	}
	return e.cbreak()
}

func (e *env) termWidth() int {
	if e.width == nil || !e.stdoutTTY {
		return 0
	}
	return e.width()
}

// color reports whether to colour output on stdout: a terminal, NO_COLOR
// unset (https://no-color.org) and TERM not "dumb".
func (e *env) color(noColorFlag bool) bool {
	return e.stdoutTTY && !noColorFlag && e.getenv("NO_COLOR") == "" && e.getenv("TERM") != "dumb"
}
