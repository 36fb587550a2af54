package openai

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

// prompt bounds how long an abort may take to end a stream.
const prompt = 5 * time.Second

func TestAbortDuringConnect(t *testing.T) {
	arrived := make(chan struct{})
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		close(arrived)
		hold(r) // never answers
	})
	p := newProvider(t, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() { <-arrived; cancel() }()
	start := time.Now()
	_, msg := run(t, ctx, p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonAborted || msg.ErrorMessage != abortedText || time.Since(start) > prompt {
		t.Fatalf("after %v: %s", time.Since(start), js(msg))
	}
}

func TestAbortBeforeStart(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) { n.Add(1) })
	p := newProvider(t, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, msg := run(t, ctx, p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonAborted || n.Load() != 0 {
		t.Fatalf("%d requests: %s", n.Load(), js(msg))
	}
}

func TestAbortDuringRetryWait(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		failWith(w, 503, map[string]string{"retry-after-ms": "50000"}, `{"error":{"message":"overloaded"}}`)
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	p := newProvider(t, srv, func(c *Config) {
		c.OnRetry = func(int, time.Duration, string) { cancel() } // abort as the wait begins
	})
	start := time.Now()
	_, msg := run(t, ctx, p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonAborted || n.Load() != 1 || time.Since(start) > prompt {
		t.Fatalf("after %v and %d requests: %s", time.Since(start), n.Load(), js(msg))
	}
}

// stallAfter streams chunks, then holds the connection open without a byte.
func stallAfter(chunks ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		sse(w, chunks...)
		hold(r)
	}
}

// hold blocks until the client goes away. The body is read first: only then
// does the server watch the connection and cancel the request's context.
func hold(r *http.Request) {
	_, _ = io.Copy(io.Discard, r.Body)
	<-r.Context().Done()
}

func TestAbortMidStream(t *testing.T) {
	srv := newServer(t, stallAfter(textChunk("Hel"), textChunk("lo")))
	p := newProvider(t, srv, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var events []agent.StreamEvent
	deltas := 0
	start := time.Now()
	for ev := range p.Stream(ctx, testModel, userContext("hi"), agent.StreamOptions{}) {
		events = append(events, ev)
		if ev.Type == agent.StreamTextDelta {
			if deltas++; deltas == 2 {
				cancel()
			}
		}
	}
	msg := checkProtocol(t, events)
	if msg.StopReason != agent.StopReasonAborted || msg.TextOf() != "Hello" || time.Since(start) > prompt {
		t.Fatalf("after %v: %s", time.Since(start), js(msg))
	}
}

func TestStallEndedByDeadline(t *testing.T) {
	srv := newServer(t, stallAfter(textChunk("thinking about it")))
	p := newProvider(t, srv, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	_, msg := run(t, ctx, p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonAborted || !strings.Contains(msg.ErrorMessage, "deadline exceeded") || msg.TextOf() != "thinking about it" {
		t.Fatalf("%s", js(msg))
	}
}

func TestStallEndedByIdleTimeout(t *testing.T) {
	srv := newServer(t, stallAfter(textChunk("thinking about it")))
	p := newProvider(t, srv, func(c *Config) { c.IdleTimeout = 100 * time.Millisecond })
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonError || !strings.Contains(msg.ErrorMessage, "Stream stalled") || msg.TextOf() != "thinking about it" {
		t.Fatalf("%s", js(msg))
	}
}

func TestIdleTimeoutBeforeHeaders(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			hold(r) // no headers
			return
		}
		okStream(w)
	})
	p := newProvider(t, srv, func(c *Config) { c.IdleTimeout = 100 * time.Millisecond })
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || n.Load() != 2 {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
}

// Keep-alive comments hold off the idle timeout and are not "empty
// messages" that end the stream, as they are for go-openai after 300.
func TestKeepAlivesAreNotIdle(t *testing.T) {
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		for range 500 {
			_, _ = w.Write([]byte(": keep-alive\n\n"))
		}
		w.(http.Flusher).Flush()
		sse(w, textChunk("done"), stopChunk, "[DONE]")
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || msg.TextOf() != "done" {
		t.Fatalf("%s", js(msg))
	}
}

func TestConsumerStops(t *testing.T) {
	srv := newServer(t, stallAfter(textChunk("a"), textChunk("b")))
	p := newProvider(t, srv, nil)
	n := 0
	for ev := range p.Stream(context.Background(), testModel, userContext("hi"), agent.StreamOptions{}) {
		n++
		if ev.Type == agent.StreamTextDelta {
			break
		}
	}
	if n != 3 { // start, text_start, text_delta
		t.Fatalf("%d events after break", n)
	}
}

func TestNotAnEventStream(t *testing.T) {
	for _, tc := range []struct {
		name, ctype, body string
		reason            agent.StopReason
		text, errContains string
	}{
		{"html", "text/html", "<html><body>502 Bad Gateway</body></html>", agent.StopReasonError, "", "did not send an event stream"},
		{"plain", "text/plain", "hello there", agent.StopReasonError, "", `"text/plain"`},
		{"empty", "text/event-stream", "", agent.StopReasonError, "", "did not send an event stream"},
		{"json-error", "application/json", `{"error":{"message":"quota exhausted","code":429}}`, agent.StopReasonError, "", "quota exhausted"},
		{"json-other", "application/json", `{"status":"ok"}`, agent.StopReasonError, "", "did not send an event stream"},
		{"json-completion", "application/json", `{"id":"x","model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"Hi!","reasoning_content":"greet"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":2}}`, agent.StopReasonStop, "Hi!", ""},
		{"ndjson", "application/x-ndjson", textChunk("a") + "\n" + textChunk("b") + "\n" + stopChunk + "\n", agent.StopReasonStop, "ab", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
				w.Header().Set("Content-Type", tc.ctype)
				_, _ = w.Write([]byte(tc.body))
			})
			p := newProvider(t, srv, nil)
			_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
			if msg.StopReason != tc.reason || msg.TextOf() != tc.text || !strings.Contains(msg.ErrorMessage, tc.errContains) {
				t.Fatalf("%s", js(msg))
			}
		})
	}
}

func TestAPIKeyNeverLeaks(t *testing.T) {
	const key = "sk-live-SECRET-0123456789abcdef"
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		echo := strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer ")
		switch n.Add(1) {
		case 1:
			failWith(w, 401, nil, fmt.Sprintf(`{"error":{"message":"Incorrect API key provided: %s"}}`, echo))
		case 2:
			failWith(w, 502, nil, "proxy saw key "+echo)
		case 3:
			w.Header().Set("Content-Type", "text/event-stream")
			fmt.Fprintf(w, "event: error\ndata: {\"error\":{\"message\":\"bad key %s\"}}\n\n", echo)
		default:
			sse(w, `{"error":{"message":"key `+echo+` revoked"}}`)
		}
	})
	var retryReasons []string
	p := newProvider(t, srv, func(c *Config) {
		c.APIKey = key
		c.MaxRetries = -1
		c.OnRetry = func(_ int, _ time.Duration, reason string) { retryReasons = append(retryReasons, reason) }
	})
	if s := fmt.Sprintf("%v %+v %s", p.cfg, p.cfg, p); strings.Contains(s, key) {
		t.Errorf("config prints the key: %s", s)
	}
	for i := range 4 {
		events, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
		all, _ := json.Marshal(events)
		if msg.StopReason != agent.StopReasonError || !strings.Contains(msg.ErrorMessage, "[REDACTED]") {
			t.Errorf("call %d: %s", i, js(msg))
		}
		for _, s := range []string{string(all), js(msg), msg.ErrorMessage} {
			if strings.Contains(s, key) {
				t.Errorf("call %d: key leaked: %s", i, s)
			}
		}
	}
	// Retries report redacted reasons too.
	p = newProvider(t, srv, func(c *Config) {
		c.APIKey = key
		c.MaxRetries = 1
		c.OnRetry = func(_ int, _ time.Duration, reason string) { retryReasons = append(retryReasons, reason) }
	})
	n.Store(1)
	run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if len(retryReasons) != 1 || strings.Contains(retryReasons[0], key) || !strings.Contains(retryReasons[0], "[REDACTED]") {
		t.Errorf("retry reasons %q", retryReasons)
	}
}
