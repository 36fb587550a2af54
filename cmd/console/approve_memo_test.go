package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// postAnswer sends an answer from any goroutine: its status, or an error
// (a connection the handler's panic closed).
func postAnswer(c *console, run, token, body string) (int, error) {
	req, _ := http.NewRequest(http.MethodPost, c.URL+"/api/runs/"+run+"/approve", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-CSRF-Token", token)
	resp, err := c.Client().Do(req)
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

// TestApproveRetryTimeoutStartsWhenItSends: a retry waits for the first
// send of its answer; when that one fails at its timeout, the retry sends
// with a whole timeout of its own, not what its wait left.
func TestApproveRetryTimeoutStartsWhenItSends(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	var calls atomic.Int32
	entered := make(chan struct{})
	left := make(chan time.Duration, 1)
	c := newConsole(t, f, serverConfig{AllowControl: true, answerTimeout: 2 * time.Second, beforeAnswer: func(ctx context.Context) {
		switch calls.Add(1) {
		case 1:
			close(entered)
			<-ctx.Done() // the first send stalls to its timeout and fails
		case 2:
			dl, _ := ctx.Deadline()
			left <- time.Until(dl)
		}
	}})
	f.submit(gatedRun("late-retry", "2*3"))
	waitWaiting(t, c, 1)
	tok := c.csrfToken(t)
	const body = `{"toolCallId":"c1","decision":"approve"}`
	first := make(chan int, 1)
	go func() { code, _ := postAnswer(c, "late-retry", tok, body); first <- code }()
	<-entered
	code, err := postAnswer(c, "late-retry", tok, body) // waits in begin for the first
	if code != http.StatusAccepted {
		t.Errorf("the retry: %d %v, want 202", code, err)
	}
	if code := <-first; code == http.StatusAccepted {
		t.Errorf("the first send: %d, want a failure", code)
	}
	select {
	case d := <-left:
		if d < time.Second {
			t.Errorf("the retry sent with %v of its 2s left", d)
		}
	default:
		t.Error("the retry never sent")
	}
}

// TestApproveSendThatPanicsLetsItsRetrySend: a send that panics still
// ends its memo entry (as not sent): a retry sends at once instead of
// waiting out its timeout.
func TestApproveSendThatPanicsLetsItsRetrySend(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	var calls atomic.Int32
	entered, release := make(chan struct{}), make(chan struct{})
	c := newConsole(t, f, serverConfig{AllowControl: true, answerTimeout: 5 * time.Second, beforeAnswer: func(ctx context.Context) {
		if calls.Add(1) == 1 {
			close(entered)
			<-release
			panic(http.ErrAbortHandler) // a bug in the send (net/http recovers it quietly)
		}
	}})
	f.submit(gatedRun("panic-retry", "2*3"))
	waitWaiting(t, c, 1)
	tok := c.csrfToken(t)
	const body = `{"toolCallId":"c1","decision":"approve"}`
	first := make(chan error, 1)
	go func() { _, err := postAnswer(c, "panic-retry", tok, body); first <- err }()
	<-entered
	retry := make(chan int, 1)
	go func() { code, _ := postAnswer(c, "panic-retry", tok, body); retry <- code }()
	close(release)
	if err := <-first; err == nil {
		t.Error("the first request did not see its handler panic")
	}
	start := time.Now()
	if code := <-retry; code != http.StatusAccepted {
		t.Errorf("the retry: %d after %v, want 202", code, time.Since(start))
	}
	if d := time.Since(start); d > 4*time.Second {
		t.Errorf("the retry took %v: it waited for an entry no one ends", d)
	}
}

// TestAnswerMemoKeepsAnswersUnderWay: making room never drops an answer
// being sent (a retry of it would be sent again); with every kept answer
// under way a new one is refused for now.
func TestAnswerMemoKeepsAnswersUnderWay(t *testing.T) {
	now := time.Unix(1000, 0)
	m := newAnswerMemo(2, time.Minute)
	m.now = func() time.Time { return now }
	ctx := context.Background()
	begin := func(call string) (func(uint64, bool), error) {
		t.Helper()
		now = now.Add(time.Second)
		sent, prior, err := m.begin(ctx, "r", bus.ApprovalAnswer{ToolCallID: call, Decision: "approve"})
		if prior != nil {
			t.Fatalf("%s: a prior answer %+v", call, prior)
		}
		return sent, err
	}
	if _, err := begin("c0"); err != nil { // under way: never sent(…)
		t.Fatal(err)
	}
	sent1, err := begin("c1")
	if err != nil {
		t.Fatal(err)
	}
	sent1(7, true)
	if _, err := begin("c2"); err != nil { // room: c1 (sent) goes, c0 stays
		t.Fatal(err)
	}
	if m.entries["r\x00c0"] == nil || m.entries["r\x00c1"] != nil || len(m.entries) != 2 {
		t.Errorf("kept %v: want c0 (under way) and c2", m.entries)
	}
	if _, err := begin("c3"); !errors.Is(err, errAnswersBusy) {
		t.Errorf("a third answer with two under way: %v, want errAnswersBusy", err)
	}
	if len(m.entries) != 2 {
		t.Errorf("kept %d answers, max 2", len(m.entries))
	}
}
