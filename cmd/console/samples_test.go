package main

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// finishedIn sums a queue's finished and failed runs over a history.
func finishedIn(h historyInfo, queue string) (finished, failed int) {
	for _, s := range h.Samples {
		for _, q := range s.Queues {
			if q.Queue == queue {
				finished += q.Finished
				failed += q.Failed
			}
		}
	}
	return finished, failed
}

// waitHistory polls a console's history until ok holds.
func waitHistory(t *testing.T, c *console, what string, ok func(historyInfo) bool) historyInfo {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var h historyInfo
		if code := c.getJSON(t, "/api/fleet/history", &h); code != http.StatusOK {
			t.Fatalf("/api/fleet/history: %d", code)
		}
		if ok(h) {
			return h
		}
		if time.Now().After(deadline) {
			t.Fatalf("the history never %s: %+v", what, h)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestFleetHistory: the console samples each queue (depth, in flight, the
// runs that finished) into its stream, one sample per slot, and a console
// started later reads that history back: a restart keeps the last hour.
func TestFleetHistory(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	const every = 200 * time.Millisecond
	c := newConsole(t, f, serverConfig{SampleEvery: every})
	f.submit(slowText("hist-1", "one"))
	f.submit(slowText("hist-2", "two"))
	f.submit(&bus.RunRequest{ID: "hist-3", Prompt: "go", Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{StopReason: "error", ErrorMessage: "boom"}}}})
	h := waitHistory(t, c, "counted 3 finished runs", func(h historyInfo) bool {
		n, _ := finishedIn(h, "default")
		return n == 3
	})
	if _, failed := finishedIn(h, "default"); failed != 1 || h.Every != every.Milliseconds() || h.Problem != "" {
		t.Errorf("history: %d failed, every %d, problem %q", failed, h.Every, h.Problem)
	}
	for i, s := range h.Samples {
		if len(s.Queues) != 2 || s.Queues[0].Queue != "default" || s.Queues[1].Queue != "other" || s.T%every.Milliseconds() != 0 {
			t.Fatalf("sample %d: %+v", i, s)
		}
		if i > 0 && s.T <= h.Samples[i-1].T {
			t.Fatalf("samples out of order: %d then %d", h.Samples[i-1].T, s.T)
		}
	}
	// The stream keeps an hour; its samples are one per slot.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := f.c.JetStream().Stream(ctx, samplesStream(f.c.Names()))
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil || info.Config.MaxAge != time.Hour || info.Config.Subjects[0] != "agents.console.samples" {
		t.Fatalf("stream: %v %+v", err, info)
	}
	// A console started now (as after a restart) saw none of the runs,
	// and shows them from the stored history.
	later := newConsole(t, f, serverConfig{SampleEvery: every})
	waitHistory(t, later, "showed the runs from before its start", func(h historyInfo) bool {
		n, failed := finishedIn(h, "default")
		return n == 3 && failed == 1
	})
}

// TestFleetHistoryMarksAPartialSlot: the slot the console started in is
// counted only from its start: its sample says so (no rate is made of it),
// and the full slots after it say how long they cover.
func TestFleetHistoryMarksAPartialSlot(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	const every = 300 * time.Millisecond
	c := newConsole(t, f, serverConfig{SampleEvery: every})
	h := waitHistory(t, c, "had a full slot", func(h historyInfo) bool {
		for _, s := range h.Samples {
			if !s.Partial {
				return true
			}
		}
		return false
	})
	if !h.Samples[0].Partial || h.Samples[0].Span != 0 {
		t.Errorf("the first slot, begun before the console: %+v", h.Samples[0])
	}
	for _, s := range h.Samples {
		if !s.Partial && (s.Span < every.Milliseconds() || s.Span%every.Milliseconds() != 0) {
			t.Errorf("a full slot covers %d ms (every %d)", s.Span, every.Milliseconds())
		}
	}
}
