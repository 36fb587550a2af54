package main

import (
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/agentfleet/agentfleet/bus"
)

// ptyProc is submit running on a pseudo-terminal, as a person would run it.
type ptyProc struct {
	cmd  *exec.Cmd
	tty  *os.File
	out  *outBuf
	done chan struct{}
	code int
	rows int
	// sizes are the terminal's widths: from byte at of the output on.
	sizes []ptySize
	// reflow: the terminal breaks rows on a shrink, as tmux (vt.reflow).
	reflow bool
}

type ptySize struct{ at, cols int }

func startPTY(t *testing.T, extraEnv []string, args ...string) *ptyProc {
	t.Helper()
	return startPTYSize(t, 40, 120, extraEnv, args...)
}

func startPTYSize(t *testing.T, rows, cols int, extraEnv []string, args ...string) *ptyProc {
	t.Helper()
	cmd := exec.Command(fleet.submit, args...)
	cmd.Env = submitEnv(extraEnv...)
	return startPTYCmd(t, rows, cols, cmd)
}

// startPTYCmd runs cmd on a pseudo-terminal of rows × cols, as the
// session's own process.
func startPTYCmd(t *testing.T, rows, cols int, cmd *exec.Cmd) *ptyProc {
	t.Helper()
	p := &ptyProc{cmd: cmd, out: newOutBuf(), done: make(chan struct{}), rows: rows, sizes: []ptySize{{0, cols}}}
	tty, err := pty.StartWithSize(p.cmd, &pty.Winsize{Rows: uint16(rows), Cols: uint16(cols)})
	if err != nil {
		t.Fatal(err)
	}
	p.tty = tty
	copied := make(chan struct{})
	go func() {
		defer close(copied)
		_, _ = io.Copy(p.out, tty) // ends with EIO when the process exits
	}()
	go func() {
		defer close(p.done)
		err := p.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			p.code = ee.ExitCode()
		} else if err != nil {
			p.code = -1
		}
		<-copied
	}()
	t.Cleanup(func() {
		select {
		case <-p.done:
		default:
			_ = p.cmd.Process.Kill()
			<-p.done
		}
		tty.Close()
	})
	return p
}

// resize changes the terminal's width, as dragging its window does (the
// kernel sends submit SIGWINCH).
func (p *ptyProc) resize(t *testing.T, cols int) {
	t.Helper()
	p.sizes = append(p.sizes, ptySize{len(p.out.String()), cols})
	if err := pty.Setsize(p.tty, &pty.Winsize{Rows: uint16(p.rows), Cols: uint16(cols)}); err != nil {
		t.Fatal(err)
	}
}

// screen is what a person sees now: the output so far played on a VT100
// of the terminal's size (vt_test.go).
func (p *ptyProc) screen(t *testing.T) *vt {
	t.Helper()
	out := []byte(p.out.String())
	v := newVT(p.rows, p.sizes[0].cols)
	v.reflow = p.reflow
	at := 0
	for _, sz := range p.sizes[1:] {
		_, _ = v.Write(out[at:min(sz.at, len(out))])
		at = min(sz.at, len(out))
		v.resize(sz.cols)
	}
	_, _ = v.Write(out[at:])
	if v.err != nil {
		t.Fatalf("the output has what a VT100 does not know: %v\n%q", v.err, out)
	}
	return v
}

// waitScreen waits until the screen satisfies ok.
func (p *ptyProc) waitScreen(t *testing.T, what string, ok func(*vt) bool, timeout time.Duration) *vt {
	t.Helper()
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		if v := p.screen(t); ok(v) {
			return v
		}
		select {
		case <-p.out.changed:
		case <-deadline.C:
			t.Fatalf("the screen never showed %s after %s:\n%s", what, timeout, p.screen(t))
		}
	}
}

func (p *ptyProc) typeLine(t *testing.T, s string) {
	t.Helper()
	if _, err := p.tty.Write([]byte(s)); err != nil {
		t.Fatal(err)
	}
}

func (p *ptyProc) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-p.done:
		return p.code
	case <-time.After(60 * time.Second):
		t.Fatalf("submit did not exit:\n%s", p.out)
		return -1
	}
}

// TestInteractiveSteeringOnATerminal types steering, a follow-up and sees
// them land in the run.
func TestInteractiveSteeringOnATerminal(t *testing.T) {
	t.Parallel()
	p := startPTY(t, nil, "--request", request(t, sleepRun(2, "steered answer", "follow-up answer")), "start")
	p.out.waitFor(t, "type a line to steer", 30*time.Second)
	p.out.waitFor(t, "⚙ sleep", 30*time.Second)
	p.typeLine(t, "use metric units\n")
	p.out.waitFor(t, "→ steering sent", 30*time.Second)
	p.typeLine(t, "/followup and in kelvin?\n")
	p.out.waitFor(t, "→ follow-up sent", 30*time.Second)
	p.typeLine(t, "/bogus\n")
	p.out.waitFor(t, `unknown command "/bogus"`, 30*time.Second)
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.out)
	}
	o := p.screen(t).String()
	expect(t, o, "» you: use metric units", "steered answer", "» you: and in kelvin?", "follow-up answer", "✓ succeeded · 3 turns")
	if !(strings.Index(o, "» you: use metric units") < strings.Index(o, "steered answer") &&
		strings.Index(o, "steered answer") < strings.Index(o, "» you: and in kelvin?") &&
		strings.Index(o, "» you: and in kelvin?") < strings.Index(o, "follow-up answer")) {
		t.Errorf("order:\n%s", o)
	}
}

func TestInteractiveAbortAndColours(t *testing.T) {
	t.Parallel()
	p := startPTY(t, []string{"NO_COLOR="}, "--request", request(t, sleepRun(30, "never")), "start")
	p.out.waitFor(t, "⚙ sleep", 30*time.Second)
	p.typeLine(t, "/abort\n")
	if code := p.wait(t); code != 3 {
		t.Fatalf("exit %d\n%s", code, p.out)
	}
	screen := p.screen(t).String()
	expect(t, screen, "→ abort sent", "tool sleep stopped: the run was aborted", "■ aborted: aborted from the terminal")
	// The turn the abort cut short shows nothing, not even its separator.
	if strings.Contains(screen, "── turn 2 ──") {
		t.Errorf("an empty turn's separator:\n%s", screen)
	}
	if !strings.Contains(p.out.String(), "\x1b[33m■ aborted") {
		t.Errorf("no colours on a terminal:\n%q", p.out)
	}
}

// TestCtrlCOnATerminalDetaches presses Ctrl-C: the terminal sends SIGINT.
func TestCtrlCOnATerminalDetaches(t *testing.T) {
	t.Parallel()
	id := "t-pty-" + bus.NewRunID()[:8]
	p := startPTY(t, nil, "--id", id, "--request", request(t, sleepRun(30, "never")), "start")
	p.out.waitFor(t, "⚙ sleep", 30*time.Second)
	if strings.Contains(p.out.String(), "\x1b[3") {
		t.Errorf("colours despite NO_COLOR:\n%q", p.out)
	}
	p.typeLine(t, "\x03")
	if code := p.wait(t); code != 130 {
		t.Fatalf("exit %d\n%s", code, p.out)
	}
	expect(t, p.screen(t).String(), "detached from run "+id+"; it goes on.", "re-attach: submit follow "+id)
	st, _, _ := submit(t, "status", id)
	if !strings.Contains(st, "running") {
		t.Errorf("the run did not go on:\n%s", st)
	}
	if _, _, code := submit(t, "abort", id); code != 0 {
		t.Errorf("abort: exit %d", code)
	}
}
