package openai

import (
	"context"
	"errors"
	"net/http"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// A 429, and a 503 that names a retry time, are reported with the server's
// time, whether or not the call is retried.
func TestOnRetryAfter(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			failWith(w, 429, map[string]string{"retry-after-ms": "20"}, `{"error":{"message":"slow down"}}`)
		case 2:
			failWith(w, 503, map[string]string{"Retry-After": "0"}, `busy`)
		case 3:
			failWith(w, 503, nil, `busy`) // no retry time: not a rate limit
		case 4:
			failWith(w, 500, map[string]string{"Retry-After": "0"}, `broken`)
		case 5:
			failWith(w, 429, nil, `{"error":{"message":"slow down"}}`)
		default:
			okStream(w)
		}
	})
	type report struct {
		model string
		until time.Time
	}
	var reports []report
	p := newProvider(t, srv, func(c *Config) {
		c.MaxRetries = 5
		c.OnRetryAfter = func(model string, until time.Time) { reports = append(reports, report{model, until}) }
	})
	start := time.Now()
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	end := time.Now()
	if msg.StopReason != agent.StopReasonStop || n.Load() != 6 {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
	if len(reports) != 3 {
		t.Fatalf("reports %+v, want 3", reports)
	}
	for _, r := range reports {
		if r.model != testModel.ID {
			t.Errorf("model %q", r.model)
		}
	}
	if u := reports[0].until; u.Before(start.Add(20*time.Millisecond)) || u.After(end.Add(20*time.Millisecond)) {
		t.Errorf("429 until %v, want 20ms after a time in [%v, %v]", u, start, end)
	}
	if u := reports[1].until; u.Before(start) || u.After(end) {
		t.Errorf("503 until %v, want in [%v, %v]", u, start, end)
	}
	if !reports[2].until.IsZero() {
		t.Errorf("429 without a time reported until %v", reports[2].until)
	}

	// The last attempt's 429 is reported too.
	reports = nil
	srv2 := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		failWith(w, 429, map[string]string{"Retry-After": "30"}, `{"error":{"message":"slow down"}}`)
	})
	p2 := newProvider(t, srv2, func(c *Config) {
		c.MaxRetries = -1
		c.OnRetryAfter = func(model string, until time.Time) { reports = append(reports, report{model, until}) }
	})
	_, msg = run(t, context.Background(), p2, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonError || len(reports) != 1 || reports[0].until.Before(start.Add(30*time.Second)) {
		t.Fatalf("%s, reports %+v", msg.StopReason, reports)
	}
}

// The gate is asked before every attempt, retries included, before the
// request is sent.
func TestGateBeforeEachAttempt(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			failWith(w, 429, map[string]string{"retry-after-ms": "1"}, `{"error":{"message":"slow down"}}`)
			return
		}
		okStream(w)
	})
	var seen []int32 // requests the server had when the gate was asked
	p := newProvider(t, srv, func(c *Config) {
		c.Gate = func(ctx context.Context, model string) error {
			if model != testModel.ID || ctx == nil {
				t.Errorf("gate asked for %q", model)
			}
			seen = append(seen, n.Load())
			return nil
		}
	})
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || len(seen) != 2 || seen[0] != 0 || seen[1] != 1 {
		t.Fatalf("%s; gate saw %v", js(msg), seen)
	}
}

// A gate's refusal ends the stream as an error with its text, on the first
// attempt or on a retry, and nothing more is sent.
func TestGateRefuses(t *testing.T) {
	for _, refuseAt := range []int{1, 2} {
		var n atomic.Int32
		srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
			n.Add(1)
			failWith(w, 503, map[string]string{"retry-after-ms": "1"}, `busy`)
		})
		asked := 0
		p := newProvider(t, srv, func(c *Config) {
			c.Gate = func(context.Context, string) error {
				if asked++; asked == refuseAt {
					return errors.New("model budget exhausted")
				}
				return nil
			}
		})
		events, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
		if events[len(events)-1].Type != agent.StreamError || msg.StopReason != agent.StopReasonError ||
			msg.ErrorMessage != "model budget exhausted" {
			t.Errorf("refused at attempt %d: %s %q", refuseAt, msg.StopReason, msg.ErrorMessage)
		}
		if got := n.Load(); got != int32(refuseAt-1) {
			t.Errorf("refused at attempt %d: server got %d requests", refuseAt, got)
		}
	}
}

// A gate that waits until the run is cancelled ends the stream as aborted.
func TestGateWaitAborted(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { n.Add(1); okStream(w) })
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := newProvider(t, srv, func(c *Config) {
		c.Gate = func(ctx context.Context, _ string) error {
			cancel() // the run is cancelled while its call waits
			<-ctx.Done()
			return ctx.Err()
		}
	})
	_, msg := run(t, ctx, p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonAborted || n.Load() != 0 {
		t.Fatalf("%s %q after %d requests", msg.StopReason, msg.ErrorMessage, n.Load())
	}
}

// Waiting at the gate is not silence from the server: the idle timeout
// does not run meanwhile.
func TestGateWaitIsNotIdle(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { okStream(w) })
	p := newProvider(t, srv, func(c *Config) {
		c.IdleTimeout = 10 * time.Millisecond
		c.MaxRetries = -1
		c.Gate = func(ctx context.Context, _ string) error {
			// A rate limiter holding the call for longer than the idle timeout.
			select {
			case <-time.After(100 * time.Millisecond):
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop {
		t.Fatalf("%s %q", msg.StopReason, msg.ErrorMessage)
	}
}
