//go:build !(linux || darwin || dragonfly || freebsd || netbsd || openbsd)

package main

import (
	"errors"
	"os"
)

// termMode is not to be had here: typed lines are read as the terminal
// echoes them.
type termMode struct{}

func cbreak(int) (*termMode, error) { return nil, errors.New("no cbreak mode on this system") }

func (*termMode) resume() error             { return nil }
func (*termMode) signals() <-chan os.Signal { return nil }
func (*termMode) isStop(os.Signal) bool     { return false }
func (*termMode) isCont(os.Signal) bool     { return false }
func (*termMode) stop()                     {}
func (*termMode) restore() error            { return nil }

func notifyResize(chan<- os.Signal) {}
