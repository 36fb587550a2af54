//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package main

import (
	"errors"
	"os"
)

// cbreak is not to be had here: typed lines are read as the terminal
// echoes them.
func cbreak(int) (func() error, error) { return nil, errors.New("no cbreak mode on this system") }

func notifyResize(chan<- os.Signal) {}
