//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package main

import (
	"os"
	"os/signal"
	"sync"

	"golang.org/x/sys/unix"
)

// termMode is the terminal in cbreak mode: echo and line editing off on
// fd, so that submit can keep what is typed on a line of its own
// (termui.go); the rest kept: Ctrl-C still interrupts and output newlines
// still return the carriage (term.MakeRaw would turn both off). It lasts
// through job control (Ctrl-Z, fg) and gives the terminal back as it was
// on every way out: restore (deferred, so a panic too) and Ctrl-\.
type termMode struct {
	fd   int
	orig unix.Termios
	// jobs delivers SIGTSTP and SIGCONT (none where the shell ignores
	// SIGTSTP: no job control there).
	jobs     chan os.Signal
	quit     chan os.Signal
	done     chan struct{}
	quitDone chan struct{}
	once     sync.Once
}

func cbreak(fd int) (*termMode, error) {
	old, err := unix.IoctlGetTermios(fd, ioctlGetTermios)
	if err != nil {
		return nil, err
	}
	m := &termMode{fd: fd, orig: *old, jobs: make(chan os.Signal, 4), quit: make(chan os.Signal, 1),
		done: make(chan struct{}), quitDone: make(chan struct{})}
	if err := m.resume(); err != nil {
		return nil, err
	}
	if !signal.Ignored(unix.SIGTSTP) {
		signal.Notify(m.jobs, unix.SIGTSTP, unix.SIGCONT)
	}
	// Ctrl-\ (SIGQUIT): the terminal back first, then the runtime's
	// goroutine dump and exit, by the signal again with its handler reset.
	signal.Notify(m.quit, unix.SIGQUIT)
	go func() {
		defer close(m.quitDone)
		select {
		case <-m.quit:
			_ = unix.IoctlSetTermios(m.fd, ioctlSetTermios, &m.orig)
			signal.Reset(unix.SIGQUIT)
			_ = unix.Kill(os.Getpid(), unix.SIGQUIT)
		case <-m.done:
		}
	}()
	return m, nil
}

// resume (re)applies cbreak mode: after fg the shell has the terminal in
// its own mode.
func (m *termMode) resume() error {
	t := m.orig
	t.Lflag &^= unix.ECHO | unix.ICANON
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	return unix.IoctlSetTermios(m.fd, ioctlSetTermios, &t)
}

// signals delivers the job-control signals for jobSignal.
func (m *termMode) signals() <-chan os.Signal { return m.jobs }

// isStop reports whether sig stops submit (Ctrl-Z). Not where no shell
// could continue it: its parent in another session (submit is the
// session's own process, as under tmux new 'submit ...'), where the kernel
// drops a Ctrl-Z too (an orphaned process group).
func (m *termMode) isStop(sig os.Signal) bool {
	if sig != unix.SIGTSTP {
		return false
	}
	psid, err := unix.Getsid(os.Getppid())
	sid, err2 := unix.Getsid(0)
	return err == nil && err2 == nil && psid == sid
}

// isCont reports whether sig continues submit after a stop.
func (m *termMode) isCont(sig os.Signal) bool { return sig == unix.SIGCONT }

// stop gives the terminal back as it was and stops the process as Ctrl-Z
// would have (SIGTSTP is caught, so SIGSTOP); it returns once continued,
// and SIGCONT then comes on signals.
func (m *termMode) stop() {
	_ = unix.IoctlSetTermios(m.fd, ioctlSetTermios, &m.orig)
	_ = unix.Kill(os.Getpid(), unix.SIGSTOP)
}

// restore gives the terminal back as it was, for good.
func (m *termMode) restore() error {
	var err error
	m.once.Do(func() {
		signal.Stop(m.jobs)
		signal.Stop(m.quit)
		close(m.done)
		<-m.quitDone
		err = unix.IoctlSetTermios(m.fd, ioctlSetTermios, &m.orig)
	})
	return err
}

// notifyResize delivers the terminal's size changes (SIGWINCH) on c.
func notifyResize(c chan<- os.Signal) { signal.Notify(c, unix.SIGWINCH) }
