package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// A model_wait event renders as one line saying how long the call waited.
func TestRenderModelWait(t *testing.T) {
	var b bytes.Buffer
	r := newRenderer(&b, style{})
	ev := bus.ModelWait{Type: bus.EventModelWait, Reason: bus.WaitRateLimit, WaitedMs: 1500, Group: "main"}
	if err := r.Render(envelope(t, 2, 0, ev)); err != nil {
		t.Fatal(err)
	}
	if s := b.String(); !strings.Contains(s, "waited 1.5s") || strings.Count(s, "\n") != 1 {
		t.Fatalf("rendered %q", s)
	}
}
