// Package logbuf is a log destination for tests: writes come from many
// goroutines (a server's, a logger's) while the test reads.
package logbuf

import (
	"strings"
	"sync"
)

// Buffer keeps everything written to it; safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *Buffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// String returns what was written so far.
func (s *Buffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
