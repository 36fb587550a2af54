package junklog

import (
	"bytes"
	"errors"
	"log/slog"
	"strings"
	"testing"
)

// The first request of an interval is logged at once, the rest counted in
// one line when it ends; a new interval logs its first again.
func TestFirstLoggedTheRestCounted(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, nil))
	var j Log
	for range 3 {
		j.Note(log, "agents.submit.*.x", errors.New("wildcard token"))
	}
	j.Flush(log)
	j.Note(log, strings.Repeat("s", 300), errors.New("too long"))
	j.Flush(log)
	out := buf.String()
	if n := strings.Count(out, `msg="request with an invalid subject terminated"`); n != 2 {
		t.Errorf("%d first lines, want 2 (one an interval):\n%s", n, out)
	}
	if !strings.Contains(out, `msg="more requests with an invalid subject terminated" count=2`) {
		t.Errorf("no count of the 2 held back:\n%s", out)
	}
	if strings.Contains(out, strings.Repeat("s", 201)) {
		t.Errorf("a subject logged past 200 bytes:\n%s", out)
	}
}
