package openai

import (
	"context"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
)

func okStream(w http.ResponseWriter) { sse(w, textChunk("ok"), stopChunk, "[DONE]") }

func failWith(w http.ResponseWriter, status int, headers map[string]string, body string) {
	for k, v := range headers {
		w.Header().Set(k, v)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write([]byte(body))
}

func TestRetryAfterMs(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) <= 2 {
			failWith(w, 429, map[string]string{"retry-after-ms": "5"}, `{"error":{"message":"Rate limit reached","type":"requests"}}`)
			return
		}
		okStream(w)
	})
	var waits []time.Duration
	var reasons []string
	p := newProvider(t, srv, func(c *Config) {
		c.RetryBaseDelay = time.Hour // proves the server's delay is used
		c.OnRetry = func(_ int, wait time.Duration, reason string) {
			waits = append(waits, wait)
			reasons = append(reasons, reason)
		}
	})
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || msg.TextOf() != "ok" || n.Load() != 3 {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
	if len(waits) != 2 || waits[0] != 5*time.Millisecond {
		t.Errorf("waits %v", waits)
	}
	if !strings.Contains(reasons[0], "429") || !strings.Contains(reasons[0], "Rate limit reached") {
		t.Errorf("retry reason %q", reasons[0])
	}
}

func TestRetryAfterSecondsAndBackoff(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		switch n.Add(1) {
		case 1:
			failWith(w, 503, map[string]string{"Retry-After": "0"}, `<html>busy</html>`)
		case 2:
			failWith(w, 500, nil, `{"error":{"message":"internal"}}`) // exponential backoff
		case 3:
			failWith(w, 408, nil, ``)
		default:
			okStream(w)
		}
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || n.Load() != 4 {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
}

func TestRetryDelayHeaders(t *testing.T) {
	now := time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC)
	for _, tc := range []struct {
		h    map[string]string
		want time.Duration
		ok   bool
	}{
		{map[string]string{"retry-after-ms": "250"}, 250 * time.Millisecond, true},
		{map[string]string{"retry-after-ms": "250", "Retry-After": "9"}, 250 * time.Millisecond, true},
		{map[string]string{"Retry-After": "2"}, 2 * time.Second, true},
		{map[string]string{"Retry-After": "1.5"}, 1500 * time.Millisecond, true},
		{map[string]string{"Retry-After": now.Add(30 * time.Second).Format(http.TimeFormat)}, 30 * time.Second, true},
		{map[string]string{"Retry-After": now.Add(-time.Minute).Format(http.TimeFormat)}, 0, true},
		{map[string]string{"Retry-After": "soon"}, 0, false},
		{map[string]string{"Retry-After": "-3"}, 0, false},
		{nil, 0, false},
	} {
		h := http.Header{}
		for k, v := range tc.h {
			h.Set(k, v)
		}
		got, ok := retryDelay(h, now)
		if got != tc.want || ok != tc.ok {
			t.Errorf("%v: got %v %v, want %v %v", tc.h, got, ok, tc.want, tc.ok)
		}
	}
}

func TestRetryAfterTooLong(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		failWith(w, 429, map[string]string{"Retry-After": "120"}, `{"error":{"message":"Daily quota exceeded"}}`)
	})
	p := newProvider(t, srv, nil)
	start := time.Now()
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonError || n.Load() != 1 || time.Since(start) > 10*time.Second {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
	for _, want := range []string{"Server requested 120s retry delay (max: 60s)", "Daily quota exceeded", "429"} {
		if !strings.Contains(msg.ErrorMessage, want) {
			t.Errorf("error %q lacks %q", msg.ErrorMessage, want)
		}
	}
}

func TestUnauthorizedNotRetried(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		failWith(w, 401, nil, `{"error":{"message":"Incorrect API key provided","type":"invalid_request_error","code":"invalid_api_key"}}`)
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{APIKey: "sk-wrong"})
	if msg.StopReason != agent.StopReasonError || n.Load() != 1 {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
	if want := "401 Unauthorized: Incorrect API key provided"; msg.ErrorMessage != want {
		t.Errorf("error %q, want %q", msg.ErrorMessage, want)
	}
}

func TestClientErrorBodyCapped(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("x-should-retry", "false") // vetoes nothing here: 400 is final anyway
		w.WriteHeader(400)
		_, _ = w.Write([]byte("bad request: " + strings.Repeat("x", 100000)))
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if n.Load() != 1 || !strings.HasPrefix(msg.ErrorMessage, "400 Bad Request: bad request: xxx") || len(msg.ErrorMessage) > maxErrorText+100 {
		t.Fatalf("after %d requests: error of %d bytes: %.200s", n.Load(), len(msg.ErrorMessage), msg.ErrorMessage)
	}
}

func TestShouldRetryHeaderVeto(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		failWith(w, 500, map[string]string{"x-should-retry": "false"}, `{"error":{"message":"do not retry"}}`)
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if n.Load() != 1 || !strings.Contains(msg.ErrorMessage, "do not retry") {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
}

func TestRetriesExhausted(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		failWith(w, 502, nil, `upstream down`)
	})
	p := newProvider(t, srv, func(c *Config) { c.MaxRetries = 2 })
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if n.Load() != 3 || msg.ErrorMessage != "502 Bad Gateway: upstream down" {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
}

func TestConnectionErrorRetried(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) == 1 {
			conn, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				conn.Close() // a dropped connection, no response
			}
			return
		}
		okStream(w)
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if msg.StopReason != agent.StopReasonStop || n.Load() != 2 {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
}

func TestNoRetryAfterOutput(t *testing.T) {
	var n atomic.Int32
	srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		sse(w, textChunk("partial")) // then the connection ends without [DONE]
	})
	p := newProvider(t, srv, nil)
	_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
	if n.Load() != 1 || msg.StopReason != agent.StopReasonError || msg.TextOf() != "partial" {
		t.Fatalf("after %d requests: %s", n.Load(), js(msg))
	}
}
