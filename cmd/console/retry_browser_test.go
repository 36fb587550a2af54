package main

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentfleet/agentfleet/bus"
)

// pageRetryGap tells the page's own retry (250 ms after a failed fetch)
// from Chromium's: Chromium silently sends a POST again at once when a
// reused keep-alive connection closes before any answer.
const pageRetryGap = 200 * time.Millisecond

// dropUntilPageRetry serves POSTs to path through the real handler and
// closes the connection without their answer (stored, but the page sees
// a network error), until one comes pageRetryGap after the one before:
// the page's retry, which is answered. It notes every such request's
// Idempotency-Key.
type dropUntilPageRetry struct {
	next     http.Handler
	path     string
	mu       sync.Mutex
	keys     []string
	last     time.Time
	answered bool
	problem  error
}

func (d *dropUntilPageRetry) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != d.path {
		d.next.ServeHTTP(w, r)
		return
	}
	d.mu.Lock()
	d.keys = append(d.keys, r.Header.Get("Idempotency-Key"))
	now := time.Now()
	answer := d.answered || (!d.last.IsZero() && now.Sub(d.last) >= pageRetryGap)
	d.answered, d.last = answer, now
	d.mu.Unlock()
	if answer {
		d.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	d.next.ServeHTTP(rec, r)
	if rec.Code != http.StatusAccepted {
		d.fail(fmt.Errorf("a dropped steer was not stored: %d %s", rec.Code, rec.Body))
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		d.fail(err)
		return
	}
	conn.Close()
}

func (d *dropUntilPageRetry) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.problem == nil {
		d.problem = err
	}
}

func (d *dropUntilPageRetry) result() ([]string, bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.keys...), d.answered, d.problem
}

// A steer whose answer the connection lost was stored: the page sends it
// again with the same Idempotency-Key, says it was sent, and the run
// takes it once.
func TestBrowserSteerRetriedAfterALostAnswer(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	f := newTestFleet(t)
	const id = "browser-retry"
	drop := &dropUntilPageRetry{path: "/api/runs/" + id + "/steer"}
	c := newConsoleWith(t, f, serverConfig{AllowControl: true}, func(h http.Handler) http.Handler {
		drop.next = h
		return drop
	})
	b := newBrowser(t, c.URL)

	long := strings.Repeat("The faux model streams this sentence slowly. ", 40)
	f.submit(&bus.RunRequest{ID: id, Prompt: "go", Faux: mustFaux(fauxJSON(300, long, "Steer taken."))})
	page := b.tab()
	b.open(page, "/runs/"+id)
	b.do(page, "steer while the answer streams",
		wait(`(document.querySelector("#transcript .msg-assistant .text") || {textContent: ""}).textContent.length > 20`),
		chromedp.SetValue(chromedp.ID("steer-text"), "Please be brief."),
		chromedp.Click(`#steer-form button`),
		wait(`document.getElementById("toast").textContent !== ""`))
	if got := eval[string](b, page, `document.getElementById("toast").textContent`); got != "Steer: sent" {
		t.Fatalf("the page says %q", got)
	}
	b.do(page, "the run ends", wait(`document.getElementById("status").dataset.state === "succeeded"`))
	keys, answered, problem := drop.result()
	if problem != nil {
		t.Fatal(problem)
	}
	if !answered {
		t.Fatalf("the page did not retry: %d sends, all within %s of the one before", len(keys), pageRetryGap)
	}
	for _, k := range keys {
		if k != keys[0] || bus.CheckControlID(k) != nil {
			t.Fatalf("steer requests' Idempotency-Keys %q: want one valid key", keys)
		}
	}
	users := eval[int](b, page, `[...document.querySelectorAll("#transcript .msg-user")].filter(m => m.textContent.includes("Please be brief.")).length`)
	if users != 1 {
		t.Errorf("the steer is in the transcript %d times", users)
	}
	if eval[string](b, page, `document.getElementById("steer-text").value`) != "" {
		t.Error("the steer's text was not cleared after it was sent")
	}
	b.checkConsole()
}
