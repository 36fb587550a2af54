//go:build linux || darwin || dragonfly || freebsd || netbsd || openbsd

package main

import (
	"os"
	"os/signal"

	"golang.org/x/sys/unix"
)

// cbreak turns off the terminal's echo and line editing on fd, so that
// submit can keep what is typed on a line of its own (termui.go), and
// keeps the rest: Ctrl-C still interrupts and output newlines still
// return the carriage (term.MakeRaw would turn both off).
func cbreak(fd int) (restore func() error, err error) {
	old, err := unix.IoctlGetTermios(fd, ioctlGetTermios)
	if err != nil {
		return nil, err
	}
	t := *old
	t.Lflag &^= unix.ECHO | unix.ICANON
	t.Cc[unix.VMIN], t.Cc[unix.VTIME] = 1, 0
	if err := unix.IoctlSetTermios(fd, ioctlSetTermios, &t); err != nil {
		return nil, err
	}
	return func() error { return unix.IoctlSetTermios(fd, ioctlSetTermios, old) }, nil
}

// notifyResize delivers the terminal's size changes (SIGWINCH) on c.
func notifyResize(c chan<- os.Signal) { signal.Notify(c, unix.SIGWINCH) }
