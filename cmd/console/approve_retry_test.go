package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
)

// TestApproveRetriesAreIdempotent: an answer sent twice at once (a double
// click) is stored once, and one sent again after the call was resolved
// (a resend after a lost response), with its key or without, gets the
// first one's answer instead of a conflict; another answer for the call
// is a conflict.
func TestApproveRetriesAreIdempotent(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{AllowControl: true, ApproverName: "ops"})
	f.submit(gatedRun("idem", "2*3"))
	waitWaiting(t, c, 1)
	tok := c.csrfToken(t)
	const body = `{"toolCallId":"c1","decision":"approve","reason":"ok"}`
	post := func(key string) (int, uint64, error) {
		req, _ := http.NewRequest(http.MethodPost, c.URL+"/api/runs/idem/approve", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-CSRF-Token", tok)
		if key != "" {
			req.Header.Set("Idempotency-Key", key)
		}
		resp, err := c.Client().Do(req)
		if err != nil {
			return 0, 0, err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var ack struct {
			ControlSeq uint64 `json:"controlSeq"`
		}
		if resp.StatusCode == http.StatusAccepted && json.Unmarshal(b, &ack) != nil {
			return 0, 0, fmt.Errorf("answer %s", b)
		}
		if resp.StatusCode != http.StatusAccepted {
			return resp.StatusCode, 0, fmt.Errorf("%d %s", resp.StatusCode, b)
		}
		return resp.StatusCode, ack.ControlSeq, nil
	}
	// A double click: both at once, no key.
	var wg sync.WaitGroup
	seqs := make([]uint64, 2)
	errs := make([]error, 2)
	for i := range 2 {
		wg.Go(func() { _, seqs[i], errs[i] = post("") })
	}
	wg.Wait()
	if errs[0] != nil || errs[1] != nil || seqs[0] == 0 || seqs[0] != seqs[1] {
		t.Fatalf("double click: %v %v, seqs %v", errs[0], errs[1], seqs)
	}
	c.waitRun(t, "idem", func(r bus.RunRecord) bool { return r.Finished() })
	// Resent after the call was resolved (and the run ended): the same
	// answer, not "does not wait" or "has finished".
	for _, key := range []string{"", "k-0123456789"} {
		if code, seq, err := post(key); err != nil || seq != seqs[0] {
			t.Errorf("retry (key %q): %d seq %d %v, want seq %d", key, code, seq, err, seqs[0])
		}
	}
	if code, body := c.post(t, "/api/runs/idem/approve", tok, `{"toolCallId":"c1","decision":"deny"}`); code != http.StatusConflict || !strings.Contains(body, "already answered") {
		t.Errorf("another answer: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	names := f.c.Names()
	st, err := f.c.Stream(ctx, names.ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(names.Control("idem", bus.KindApprove)))
	if err != nil {
		t.Fatal(err)
	}
	if n := info.State.Subjects[names.Control("idem", bus.KindApprove)]; n != 1 {
		t.Errorf("%d answers stored, want 1", n)
	}
}

// TestAnswerMemoIsBounded: the answers kept for retries are at most max,
// the oldest dropped first, and none is kept past its time.
func TestAnswerMemoIsBounded(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	m := newAnswerMemo(3, time.Minute)
	m.now = func() time.Time { return now }
	ctx := context.Background()
	send := func(call string) {
		t.Helper()
		sent, prior, err := m.begin(ctx, "r", bus.ApprovalAnswer{ToolCallID: call, Decision: "approve"})
		if err != nil || prior != nil {
			t.Fatalf("%s: %v %v", call, prior, err)
		}
		sent(7, true)
		now = now.Add(time.Second)
	}
	for i := range 5 {
		send(fmt.Sprint("c", i))
	}
	if len(m.entries) != 3 || m.entries["r\x00c0"] != nil || m.entries["r\x00c4"] == nil {
		t.Errorf("kept %d answers: %v", len(m.entries), m.entries)
	}
	_, prior, _ := m.begin(ctx, "r", bus.ApprovalAnswer{ToolCallID: "c4", Decision: "approve"})
	if prior == nil || prior.seq != 7 {
		t.Errorf("a retry of a kept answer: %+v", prior)
	}
	now = now.Add(2 * time.Minute)
	send("c9")
	if len(m.entries) != 1 {
		t.Errorf("kept %d answers past their time", len(m.entries))
	}
}
