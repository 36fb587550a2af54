package main

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/agentfleet/agentfleet/bus"
)

// dropFirstAnswer serves the first POST to path and then closes the
// connection without its answer: the message is stored, the page sees a
// network error. It notes every such request's Idempotency-Key.
type dropFirstAnswer struct {
	next http.Handler
	path string
	mu   sync.Mutex
	keys []string
}

func (d *dropFirstAnswer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != d.path {
		d.next.ServeHTTP(w, r)
		return
	}
	d.mu.Lock()
	d.keys = append(d.keys, r.Header.Get("Idempotency-Key"))
	first := len(d.keys) == 1
	d.mu.Unlock()
	if !first {
		d.next.ServeHTTP(w, r)
		return
	}
	rec := httptest.NewRecorder()
	d.next.ServeHTTP(rec, r)
	if rec.Code != http.StatusOK && rec.Code != http.StatusAccepted {
		panic("the first steer was not stored: " + rec.Body.String())
	}
	conn, _, err := http.NewResponseController(w).Hijack()
	if err != nil {
		panic(err)
	}
	conn.Close()
}

func (d *dropFirstAnswer) seen() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return append([]string(nil), d.keys...)
}

// A steer whose answer the connection lost was stored: the page sends it
// again with the same Idempotency-Key, says it was sent, and the run
// takes it once.
func TestBrowserSteerRetriedAfterALostAnswer(t *testing.T) {
	chromiumPath(t)
	f := newTestFleet(t)
	const id = "browser-retry"
	drop := &dropFirstAnswer{path: "/api/runs/" + id + "/steer"}
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
		wait(`document.getElementById("toast").textContent === "Steer: sent"`),
		wait(`document.getElementById("status").dataset.state === "succeeded"`))
	keys := drop.seen()
	if len(keys) != 2 || keys[0] == "" || keys[0] != keys[1] || bus.CheckControlID(keys[0]) != nil {
		t.Fatalf("steer requests' Idempotency-Keys %q: want two sends under one valid key", keys)
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
