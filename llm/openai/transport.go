package openai

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	goopenai "github.com/sashabaranov/go-openai"
)

// maxErrorBody is how much of an error response is read.
const maxErrorBody = 64 << 10

var (
	errIdle        = errors.New("idle timeout")
	errRetryBudget = errors.New("retry delay too long")
)

// doer is the go-openai HTTPDoer of one stream call. go-openai builds the
// request (URL, auth, org and Azure headers); the doer replaces its body with
// ours, adds the configured headers, retries, and keeps the successful
// response so the stream function reads the body with its own decoder.
type doer struct {
	p      *Provider
	model  string
	body   []byte
	redact func(string) string

	watch   *watchdog
	resp    *http.Response
	errBody []byte // body of the last error response
}

// Do sends the request, retrying connection errors, 408, 409, 429 and 5xx
// with exponential backoff and jitter, or the delay the server asks for.
func (d *doer) Do(req *http.Request) (*http.Response, error) {
	ctx := req.Context()
	tries := uint(d.p.cfg.MaxRetries) + 1
	attempt := uint(0)
	op := func() (*http.Response, error) {
		attempt++
		return d.attempt(ctx, req, attempt >= tries)
	}
	b := &backoff.ExponentialBackOff{
		InitialInterval:     d.p.cfg.RetryBaseDelay,
		RandomizationFactor: 0.25,
		Multiplier:          2,
		MaxInterval:         max(8*time.Second, d.p.cfg.RetryBaseDelay),
	}
	opts := []backoff.RetryOption{backoff.WithBackOff(b), backoff.WithMaxTries(tries), backoff.WithMaxElapsedTime(0)}
	if on := d.p.cfg.OnRetry; on != nil {
		opts = append(opts, backoff.WithNotify(func(err error, wait time.Duration) {
			on(int(attempt), wait, d.redact(err.Error()))
		}))
	}
	resp, err := backoff.Retry(ctx, op, opts...)
	if err != nil {
		var ra *retryAfter
		if errors.As(err, &ra) {
			err = ra.err
		}
		return nil, err
	}
	d.resp = resp
	return resp, nil
}

// attempt sends the request once. A response it gives up on (not retryable,
// or the last try) is returned as a response, so go-openai turns it into its
// error types.
func (d *doer) attempt(ctx context.Context, orig *http.Request, last bool) (*http.Response, error) {
	if gate := d.p.cfg.Gate; gate != nil {
		if err := gate(ctx, d.model); err != nil {
			if ctx.Err() != nil {
				return nil, backoff.Permanent(context.Cause(ctx))
			}
			return nil, backoff.Permanent(err)
		}
	}
	actx, cancel := context.WithCancelCause(ctx)
	d.watch.arm(cancel)
	req := orig.Clone(actx)
	req.Body = io.NopCloser(bytes.NewReader(d.body))
	req.ContentLength = int64(len(d.body))
	req.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(d.body)), nil }
	for k, v := range d.p.cfg.Headers {
		req.Header.Set(k, v)
	}
	resp, err := d.p.client.Do(req)
	if err != nil {
		d.watch.stop()
		idle := errors.Is(context.Cause(actx), errIdle)
		cancel(nil)
		if ctx.Err() != nil {
			return nil, backoff.Permanent(context.Cause(ctx))
		}
		if idle {
			err = fmt.Errorf("no response within %s", d.p.cfg.IdleTimeout)
		}
		err = fmt.Errorf("connection error: %w", err)
		if last {
			return nil, backoff.Permanent(err)
		}
		return nil, err
	}
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		d.watch.kick() // body reads keep it alive from here
		resp.Body = &watchedBody{ReadCloser: resp.Body, watch: d.watch, cancel: cancel}
		return resp, nil
	}
	d.watch.stop()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, maxErrorBody))
	resp.Body.Close()
	cancel(nil)
	d.errBody = body
	resp.Body = io.NopCloser(bytes.NewReader(body))
	resp.ContentLength = int64(len(body))
	now := time.Now()
	delay, hasDelay := retryDelay(resp.Header, now)
	if on := d.p.cfg.OnRetryAfter; on != nil {
		switch {
		case resp.StatusCode == http.StatusTooManyRequests && !hasDelay:
			on(d.model, time.Time{})
		case resp.StatusCode == http.StatusTooManyRequests || resp.StatusCode == http.StatusServiceUnavailable && hasDelay:
			on(d.model, now.Add(delay))
		}
	}
	if last || !shouldRetry(resp) {
		return resp, nil
	}
	fail := fmt.Errorf("%s", statusText(resp.Status, resp.StatusCode, body))
	if hasDelay {
		if limit := d.p.cfg.MaxRetryDelay; limit > 0 && delay > limit {
			return nil, backoff.Permanent(fmt.Errorf("%w: Server requested %ds retry delay (max: %ds). %s", errRetryBudget,
				ceilSeconds(delay), ceilSeconds(limit), fail))
		}
		return nil, &retryAfter{err: fail, delay: delay}
	}
	return nil, fail
}

func ceilSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// retryAfter makes backoff wait the server's delay instead of its own.
type retryAfter struct {
	err   error
	delay time.Duration
}

func (e *retryAfter) Error() string { return e.err.Error() }
func (e *retryAfter) Unwrap() error { return e.err }
func (e *retryAfter) As(target any) bool {
	if t, ok := target.(**backoff.RetryAfterError); ok {
		*t = &backoff.RetryAfterError{Duration: e.delay}
		return true
	}
	return false
}

// shouldRetry follows OpenAI's SDKs: x-should-retry decides if present,
// else 408, 409, 429 and 5xx are retried.
func shouldRetry(resp *http.Response) bool {
	switch strings.ToLower(resp.Header.Get("x-should-retry")) {
	case "true":
		return true
	case "false":
		return false
	}
	switch resp.StatusCode {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return true
	}
	return resp.StatusCode >= 500
}

// retryDelay reads retry-after-ms, then Retry-After in seconds or as an
// HTTP date.
func retryDelay(h http.Header, now time.Time) (time.Duration, bool) {
	if v := strings.TrimSpace(h.Get("retry-after-ms")); v != "" {
		if ms, err := strconv.ParseFloat(v, 64); err == nil && ms >= 0 && ms < 1e12 {
			return time.Duration(ms * float64(time.Millisecond)), true
		}
	}
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0, false
	}
	if s, err := strconv.ParseFloat(v, 64); err == nil {
		if s < 0 || s > 1e9 {
			return 0, false
		}
		return time.Duration(s * float64(time.Second)), true
	}
	if t, err := http.ParseTime(v); err == nil {
		return max(0, t.Sub(now)), true
	}
	return 0, false
}

// statusText is "<status>: <provider message or body>".
func statusText(status string, code int, body []byte) string {
	if status == "" {
		status = strconv.Itoa(code)
	}
	msg := strings.TrimSpace(errorText(body))
	if msg == "" {
		return status
	}
	return status + ": " + msg
}

// errorMessage formats a request failure for the message's ErrorMessage.
func (d *doer) errorMessage(err error) string {
	var apiErr *goopenai.APIError
	var reqErr *goopenai.RequestError
	switch {
	case errors.As(err, &apiErr) && apiErr.HTTPStatusCode != 0:
		return statusText(apiErr.HTTPStatus, apiErr.HTTPStatusCode, d.errBody)
	case errors.As(err, &reqErr):
		return statusText(reqErr.HTTPStatus, reqErr.HTTPStatusCode, reqErr.Body)
	case errors.Is(err, errRetryBudget):
		return strings.TrimPrefix(err.Error(), errRetryBudget.Error()+": ")
	}
	return err.Error()
}

// watchdog cancels the current attempt when nothing arrives for a while:
// no response headers, or no body bytes.
type watchdog struct {
	d      time.Duration
	mu     sync.Mutex
	timer  *time.Timer
	cancel context.CancelCauseFunc
	fired  bool
}

func (w *watchdog) arm(cancel context.CancelCauseFunc) {
	if w.d <= 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cancel = cancel
	w.fired = false // a retried attempt starts afresh
	if w.timer == nil {
		w.timer = time.AfterFunc(w.d, w.fire)
	} else {
		w.timer.Reset(w.d)
	}
}

func (w *watchdog) fire() {
	w.mu.Lock()
	cancel := w.cancel
	w.fired = true
	w.mu.Unlock()
	if cancel != nil {
		cancel(errIdle)
	}
}

func (w *watchdog) hasFired() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.fired
}

func (w *watchdog) kick() {
	if w.d <= 0 {
		return
	}
	w.mu.Lock()
	if w.timer != nil {
		w.timer.Reset(w.d)
	}
	w.mu.Unlock()
}

func (w *watchdog) stop() {
	if w.d <= 0 {
		return
	}
	w.mu.Lock()
	if w.timer != nil {
		w.timer.Stop()
	}
	w.mu.Unlock()
}

// watchedBody keeps the watchdog alive while bytes arrive and ends the
// attempt's context when closed.
type watchedBody struct {
	io.ReadCloser
	watch  *watchdog
	cancel context.CancelCauseFunc
}

func (b *watchedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 {
		b.watch.kick()
	}
	return n, err
}

func (b *watchedBody) Close() error {
	b.watch.stop()
	err := b.ReadCloser.Close()
	b.cancel(nil)
	return err
}
