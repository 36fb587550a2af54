//go:build linux

package main

import (
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/sys/unix"

	"github.com/agentfleet/agentfleet/bus"
)

// termios is the terminal's mode as submit sees it (on Linux the master
// reads the pseudo-terminal's own), readable after submit exits.
func (p *ptyProc) termios(t *testing.T) *unix.Termios {
	t.Helper()
	rc, err := p.tty.SyscallConn()
	if err != nil {
		t.Fatal(err)
	}
	var tio *unix.Termios
	if cerr := rc.Control(func(fd uintptr) { tio, err = unix.IoctlGetTermios(int(fd), unix.TCGETS) }); cerr != nil || err != nil {
		t.Fatal(cerr, err)
	}
	return tio
}

// cooked reports whether the terminal echoes and edits lines, as a shell
// leaves it.
func cooked(tio *unix.Termios) bool {
	return tio.Lflag&(unix.ECHO|unix.ICANON) == unix.ECHO|unix.ICANON
}

// TestCtrlZAndFg runs submit from an interactive bash on a terminal
// (job control as a person has it), stops it with Ctrl-Z while it follows
// a run and a line is being typed, and brings it back with fg: the typed
// line leaves the screen to the shell; after fg submit takes cbreak mode
// again (a key shows at once; in the shell's mode it would wait for Enter)
// and draws the line again, right below the shell's lines.
func TestCtrlZAndFg(t *testing.T) {
	t.Parallel()
	sh := exec.Command("bash", "--norc", "--noprofile", "--noediting", "-i")
	sh.Env = submitEnv("PS1=$ ")
	p := startPTYCmd(t, 24, 60, sh)
	p.waitScreen(t, "the prompt", func(v *vt) bool { return v.cursorLine() == "$" }, 30*time.Second)
	p.typeLine(t, fleet.submit+" --request "+request(t, streamingRun(60))+" count\n")
	p.waitScreen(t, "the sleep tool running", shows("⚙ sleep"), 30*time.Second)
	p.typeLine(t, "abc")
	p.waitScreen(t, "the typed line", func(v *vt) bool { return v.cursorLine() == "» abc" }, 30*time.Second)

	p.typeLine(t, "\x1a") // Ctrl-Z
	v := p.waitScreen(t, "the shell's prompt after the stop", func(v *vt) bool {
		return shows("Stopped")(v) && v.cursorLine() == "$"
	}, 30*time.Second)
	if strings.Contains(v.String(), "» abc") {
		t.Errorf("the typed line stayed on the screen for the shell:\n%s", v)
	}
	p.typeLine(t, "fg\n")
	p.waitScreen(t, "the typed line drawn again", func(v *vt) bool { return v.cursorLine() == "» abc" }, 30*time.Second)
	p.typeLine(t, "d")
	v = p.waitScreen(t, "a key typed after fg", func(v *vt) bool { return v.cursorLine() == "» abcd" }, 30*time.Second)
	if lines := v.lines(); !strings.HasSuffix(lines[len(lines)-2], " count") {
		t.Errorf("the typed line is not right below the shell's (fg prints the job):\n%s", v)
	}

	p.typeLine(t, "\x15/abort\n")
	p.waitScreen(t, "the run aborted and the prompt", func(v *vt) bool { return shows("■ aborted")(v) && v.cursorLine() == "$" }, 30*time.Second)
	p.typeLine(t, "echo exit=$?; exit\n")
	if code := p.wait(t); code != 0 {
		t.Fatalf("bash: exit %d\n%s", code, p.screen(t))
	}
	expect(t, p.screen(t).String(), "→ abort sent", "exit=3")
	t.Logf("the screen:\n%s", p.screen(t))
}

// TestCtrlZWithoutAShell presses Ctrl-Z where no shell could continue
// submit (it is the session's own process, as under tmux new 'submit
// ...'): the kernel would drop the stop, and so does submit, which goes on
// with the typed line where it was.
func TestCtrlZWithoutAShell(t *testing.T) {
	t.Parallel()
	p := startPTYSize(t, 24, 80, nil, "--request", request(t, streamingRun(3)), "count")
	p.waitScreen(t, "the sleep tool running", shows("⚙ sleep"), 30*time.Second)
	p.typeLine(t, "abc")
	p.waitScreen(t, "the typed line", func(v *vt) bool { return v.cursorLine() == "» abc" }, 30*time.Second)
	p.typeLine(t, "\x1a") // alone: the terminal flushes its input at Ctrl-Z
	p.typeLine(t, "d")
	p.waitScreen(t, "a key typed after Ctrl-Z", func(v *vt) bool { return v.cursorLine() == "» abcd" }, 30*time.Second)
	p.typeLine(t, "\x15")
	if code := p.wait(t); code != 0 {
		t.Fatalf("exit %d\n%s", code, p.screen(t))
	}
	expect(t, p.screen(t).String(), "word0090", "✓ succeeded")
}

// TestCtrlBackslashRestoresTheTerminal quits with Ctrl-\ (SIGQUIT: the
// runtime's dump and exit 2): the terminal is given back first.
func TestCtrlBackslashRestoresTheTerminal(t *testing.T) {
	t.Parallel()
	id := "t-quit-" + bus.NewRunID()[:8]
	p := startPTYSize(t, 24, 80, nil, "--id", id, "--request", request(t, sleepRun(60, "never")), "go")
	t.Cleanup(func() {
		if _, _, code := submit(t, "abort", id); code != 0 {
			t.Errorf("abort: exit %d", code)
		}
	})
	p.waitScreen(t, "the sleep tool running", shows("⚙ sleep"), 30*time.Second)
	if cooked(p.termios(t)) {
		t.Fatal("the terminal is not in cbreak mode while submit follows a run")
	}
	p.typeLine(t, "\x1c")
	if code := p.wait(t); code != 2 {
		t.Fatalf("exit %d\n%s", code, p.screen(t))
	}
	if !cooked(p.termios(t)) {
		t.Errorf("the terminal was left in cbreak mode (Lflag %#x)", p.termios(t).Lflag)
	}
}

// panicWriter is a terminal whose write of at panics, once: a bug in the
// follow loop, which prints.
type panicWriter struct {
	w        io.Writer
	at       string
	panicked bool
	before   func() // at the panic
}

func (p *panicWriter) Write(b []byte) (int, error) {
	if !p.panicked && strings.Contains(string(b), p.at) {
		p.panicked = true
		p.before()
		panic("a bug in the follow loop")
	}
	return p.w.Write(b)
}

// panicReader is a terminal whose read panics: a bug in the goroutine
// that reads the keys.
type panicReader struct{}

func (panicReader) Read([]byte) (int, error) { panic("a bug in the keys' reader") }

// TestPanicInTheFollowLoopRestoresTheTerminal runs submit in process on a
// real pseudo-terminal and panics, while the terminal is in cbreak mode,
// in its follow loop, then in another goroutine of it: the terminal is as
// it was when the panic goes on.
func TestPanicInTheFollowLoopRestoresTheTerminal(t *testing.T) {
	for _, where := range []string{"loop", "goroutine"} {
		t.Run(where, func(t *testing.T) {
			ptmx, tty, err := pty.Open()
			if err != nil {
				t.Fatal(err)
			}
			defer ptmx.Close()
			drained := make(chan struct{})
			go func() {
				defer close(drained)
				_, _ = io.Copy(io.Discard, ptmx)
			}()
			defer func() { <-drained }()
			defer tty.Close() // ends the drain (and the keys' reader)
			var fd int
			rc, err := tty.SyscallConn()
			if err != nil {
				t.Fatal(err)
			}
			_ = rc.Control(func(f uintptr) { fd = int(f) }) // valid while tty is open
			mode := func() *unix.Termios {
				tio, err := unix.IoctlGetTermios(fd, unix.TCGETS)
				if err != nil {
					t.Fatal(err)
				}
				return tio
			}
			if !cooked(mode()) {
				t.Fatal("a new terminal is not in its usual mode")
			}
			e, _, _ := testEnv("")
			e.stdin, e.stdout, e.stdinTTY, e.stdoutTTY = tty, tty, true, true
			e.cbreak = func() (*termMode, error) { return cbreak(fd) }
			var cbreakAtPanic bool
			want := "a bug in the follow loop"
			if where == "loop" {
				e.stdout = &panicWriter{w: tty, at: "The answer", before: func() { cbreakAtPanic = !cooked(mode()) }}
			} else {
				want = "a bug in the keys' reader"
				e.stdin = panicReader{}
				cbreakAtPanic = true // the reader starts in cbreak mode
			}
			func() {
				defer func() {
					p := recover()
					if p == nil || !strings.Contains(fmt.Sprint(p), want) {
						t.Errorf("recovered %v, want %q", p, want)
					}
				}()
				args := []string{"--request", request(t, toolRun), "panics"}
				if where == "goroutine" {
					// A run that lasts: the panic comes while it is followed.
					id := "t-panic-" + bus.NewRunID()[:8]
					args = []string{"--id", id, "--request", request(t, sleepRun(30, "never")), "panics"}
					t.Cleanup(func() {
						if _, _, code := submit(t, "abort", id); code != 0 {
							t.Errorf("abort: exit %d", code)
						}
					})
				}
				run(ctx(t), args, e)
			}()
			if !cbreakAtPanic {
				t.Error("the terminal was not in cbreak mode at the panic")
			}
			if !cooked(mode()) {
				t.Errorf("the terminal was left in cbreak mode (Lflag %#x)", mode().Lflag)
			}
		})
	}
}
