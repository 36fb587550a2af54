package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/bcrypt"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

func TestRunsList(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{})
	a := slowText("list-a", "first")
	a.Metadata = map[string]string{"tenant": "acme"}
	f.submit(a)
	f.submit(&bus.RunRequest{ID: "list-b", Prompt: "go", Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{StopReason: "error", ErrorMessage: "boom"}}}})
	ra := c.waitRun(t, "list-a", func(r bus.RunRecord) bool { return r.State == bus.StatusSucceeded })
	if ra.Metadata["tenant"] != "acme" || ra.Queue != "default" || ra.Worker != "test-worker-1" || ra.Turns != 1 {
		t.Errorf("record %+v", ra)
	}
	c.waitRun(t, "list-b", func(r bus.RunRecord) bool { return r.State == bus.StatusFailed })

	var page runsPage
	ids := func(path string) []string {
		t.Helper()
		if code := c.getJSON(t, path, &page); code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		var out []string
		for _, r := range page.Runs {
			out = append(out, r.ID)
		}
		return out
	}
	if got := ids("/api/runs?state=failed"); len(got) != 1 || got[0] != "list-b" {
		t.Errorf("state=failed: %v", got)
	}
	if got := ids("/api/runs?state=succeeded&queue=default"); len(got) != 1 || got[0] != "list-a" {
		t.Errorf("state=succeeded: %v", got)
	}
	if got := ids("/api/runs?queue=other"); len(got) != 0 {
		t.Errorf("queue=other: %v", got)
	}
	if got := ids("/api/runs?q=LIST-"); len(got) != 2 {
		t.Errorf("q=LIST-: %v", got)
	}
	first := ids("/api/runs?limit=1")
	if len(first) != 1 || page.Next == "" {
		t.Fatalf("limit=1: %v, next %q", first, page.Next)
	}
	if got := ids("/api/runs?limit=1&before=" + url.QueryEscape(page.Next)); len(got) != 1 || got[0] == first[0] {
		t.Errorf("the page after %v: %v", first, got)
	}
	if got := ids("/api/runs?tenant=acme"); len(got) != 1 || got[0] != "list-a" || page.Runs[0].Tenant != "acme" || page.Runs[0].Title != "go" {
		t.Errorf("tenant=acme: %v %+v", got, page.Runs)
	}
	if got := ids("/api/runs?meta=tenant%3Dacme&state=succeeded"); len(got) != 1 || got[0] != "list-a" {
		t.Errorf("meta=tenant=acme: %v", got)
	}
	for _, bad := range []string{"limit=0", "before=x", "meta=novalue", "since=yesterday"} {
		if code := c.getJSON(t, "/api/runs?"+bad, nil); code != http.StatusBadRequest {
			t.Errorf("%s: %d", bad, code)
		}
	}
	var one bus.RunRecord
	if code := c.getJSON(t, "/api/runs/list-b", &one); code != http.StatusOK || one.State != bus.StatusFailed {
		t.Errorf("GET /api/runs/list-b: %d %+v", code, one)
	}
	if code := c.getJSON(t, "/api/runs/nosuchrun", nil); code != http.StatusNotFound {
		t.Errorf("GET /api/runs/nosuchrun: %d", code)
	}
	var fl fleetInfo
	if code := c.getJSON(t, "/api/fleet", &fl); code != http.StatusOK {
		t.Fatalf("fleet: %d", code)
	}
	if len(fl.Queues) != 2 || fl.Queues[0].Queue != "default" {
		t.Errorf("fleet %+v", fl)
	}
	// The worker's presence is written after it starts, on its own time.
	for deadline := time.Now().Add(10 * time.Second); len(fl.Workers) == 0 && time.Now().Before(deadline); {
		time.Sleep(50 * time.Millisecond)
		c.getJSON(t, "/api/fleet", &fl)
	}
	var p struct {
		bus.WorkerPresence
		SeenAt time.Time `json:"seenAt"`
	}
	if len(fl.Workers) != 1 || json.Unmarshal(fl.Workers[0], &p) != nil || p.Worker != "test-worker-1" || time.Since(p.SeenAt) > time.Minute {
		t.Errorf("fleet workers: %s", fl.Workers)
	}
}

// TestRunsListAfterRestart: the runs page pages through the records
// bucket itself, so a console started after many runs (or restarted)
// lists every one, newest first, and sees the new ones.
func TestRunsListAfterRestart(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	// Only a guard against a hang: 2,500 puts took over 30 s on a loaded
	// machine under -race.
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	kv, err := f.c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	const old = 2500 // more than the 1,000 revisions the console read before it paged
	for i := range old {
		id := fmt.Sprintf("old-%04d", i)
		b, _ := json.Marshal(bus.RunRecord{ID: id, Queue: "default", State: bus.StatusSucceeded})
		if _, err := kv.Put(ctx, id, b); err != nil {
			t.Fatal(err)
		}
	}
	c := newConsole(t, f, serverConfig{})
	f.submit(slowText("after-restart", "hi"))
	c.waitRun(t, "after-restart", func(r bus.RunRecord) bool { return r.Finished() })
	var got []string
	for before := ""; ; {
		var page runsPage
		path := "/api/runs?limit=500"
		if before != "" {
			path += "&before=" + url.QueryEscape(before)
		}
		if code := c.getJSON(t, path, &page); code != http.StatusOK {
			t.Fatalf("%s: %d", path, code)
		}
		for _, r := range page.Runs {
			got = append(got, r.ID)
		}
		if page.Next == "" {
			break
		}
		before = page.Next
	}
	if len(got) != old+1 || got[0] != "after-restart" || got[1] != fmt.Sprintf("old-%04d", old-1) || got[old] != "old-0000" {
		t.Errorf("listed %d runs (want %d), first %v, last %v", len(got), old+1, got[:min(3, len(got))], got[max(0, len(got)-2):])
	}
}

// TestEventsResume reads a run's events live, drops the connection in the
// middle of the stream, resumes with Last-Event-ID and checks the two
// halves are exactly the stored events: no gap, no duplicate.
func TestEventsResume(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{})
	id := f.submit(slowText("resume-1", strings.Repeat("streaming text ", 40), strings.Repeat("more ", 30)))

	var got []sseEvent
	s := c.openEvents(t, id, "")
	for len(got) < 10 {
		ev, err := s.next()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, ev)
	}
	s.close()
	// Still streaming: the rest is stored while no one listens.
	s = c.openEvents(t, id, got[len(got)-1].ID)
	ended := false
	for {
		ev, err := s.next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if ev.Event == "end" {
			ended = true
			continue
		}
		got = append(got, ev)
	}
	if !ended {
		t.Error("no end event after run_finished")
	}
	// The stored events of the run, by stream sequence.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	stored, err := f.c.ReadEvents(ctx, id, 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(stored) {
		t.Fatalf("got %d events, %d stored", len(got), len(stored))
	}
	st, err := f.c.Stream(ctx, f.c.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	for i, ev := range got {
		if ev.Event != "envelope" || ev.ID != strconv.FormatUint(stored[i].StreamSeq, 10) {
			t.Fatalf("event %d: %s id %s, want envelope id %d", i, ev.Event, ev.ID, stored[i].StreamSeq)
		}
		raw, err := st.GetMsg(ctx, stored[i].StreamSeq)
		if err != nil {
			t.Fatal(err)
		}
		if ev.Data != string(raw.Data) {
			t.Fatalf("event %d data is not the envelope as stored:\n%s\n%s", i, ev.Data, raw.Data)
		}
	}
	var last bus.Envelope
	if err := json.Unmarshal([]byte(got[len(got)-1].Data), &last); err != nil || !strings.Contains(string(last.Event), `"run_finished"`) {
		t.Errorf("last event %s", got[len(got)-1].Data)
	}
	// Resuming after run_finished ends at once.
	s = c.openEvents(t, id, got[len(got)-1].ID)
	if ev, err := s.next(); err != nil || ev.Event != "end" {
		t.Errorf("resume after the end: %+v %v", ev, err)
	}
}

func TestEventsHeartbeat(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{Heartbeat: 20 * time.Millisecond})
	s := c.openEvents(t, "not-yet-submitted", "")
	// Nothing is stored for this run: the first thing to come is a comment.
	line, err := s.r.ReadString('\n')
	if err != nil || line != ": heartbeat\n" {
		t.Errorf("first line %q, %v", line, err)
	}
	s.close()
	if code := c.getJSON(t, "/api/runs/bad.id/events", nil); code != http.StatusBadRequest {
		t.Errorf("bad id: %d", code)
	}
}

func TestControlNeedsAllowControlAndCSRF(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	ro := newConsole(t, f, serverConfig{})
	rw := newConsole(t, f, serverConfig{AllowControl: true})
	id := f.submit(slowText("ctl-1", strings.Repeat("long answer ", 60), "after the steer", "after the follow-up"))

	// Read-only console: every control POST is refused, with a token too.
	tok := ro.csrfToken(t)
	for _, p := range []string{"/api/runs", "/api/runs/" + id + "/steer", "/api/runs/" + id + "/abort", "/api/runs/" + id + "/approve"} {
		if code, body := ro.post(t, p, tok, `{"text":"x","prompt":"x"}`); code != http.StatusForbidden || !strings.Contains(body, "--allow-control") {
			t.Errorf("read-only %s: %d %s", p, code, body)
		}
	}
	// Control console without or with a wrong token, or from another origin.
	if code, _ := rw.post(t, "/api/runs/"+id+"/steer", "", `{"text":"x"}`); code != http.StatusForbidden {
		t.Errorf("no token: %d", code)
	}
	if code, _ := rw.post(t, "/api/runs/"+id+"/steer", tok, `{"text":"x"}`); code != http.StatusForbidden {
		t.Errorf("another console's token: %d", code)
	}
	good := rw.csrfToken(t)
	req, _ := http.NewRequest(http.MethodPost, rw.URL+"/api/runs/"+id+"/steer", strings.NewReader(`{"text":"x"}`))
	req.Header.Set("X-CSRF-Token", good)
	req.Header.Set("Origin", "https://evil.example")
	if resp, err := rw.Client().Do(req); err != nil || resp.StatusCode != http.StatusForbidden {
		t.Errorf("cross-origin: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	if code, body := rw.post(t, "/api/runs/"+id+"/approve", good, `{"call":"c1"}`); code != http.StatusBadRequest || !strings.Contains(body, "unknown field") {
		t.Errorf("approve with the old body: %d %s", code, body)
	}
	if code, body := rw.post(t, "/api/runs/"+id+"/approve", good, `{"toolCallId":"c1","decision":"maybe"}`); code != http.StatusBadRequest || !strings.Contains(body, "decision") {
		t.Errorf("approve with a bad decision: %d %s", code, body)
	}
	if code, body := rw.post(t, "/api/runs/"+id+"/approve", good, `{"toolCallId":"c1","decision":"approve"}`); code != http.StatusConflict || !strings.Contains(body, "does not wait") {
		t.Errorf("approve of a call that does not wait: %d %s", code, body)
	}
	if code, _ := rw.post(t, "/api/runs/"+id+"/steer", good, `{"text":"  "}`); code != http.StatusBadRequest {
		t.Errorf("empty steer: %d", code)
	}
	if code, _ := rw.post(t, "/api/runs/"+id+"/bogus", good, `{}`); code != http.StatusNotFound {
		t.Errorf("unknown action: %d", code)
	}
	// The real steer reaches the run's transcript, sent while the first
	// reply streams (sent before the pickup, it would come before it).
	s := rw.openEvents(t, id, "")
	for {
		ev, err := s.next()
		if err != nil {
			t.Fatalf("events: %v", err)
		}
		if ev.Event == "envelope" && strings.Contains(ev.Data, `"type":"message_update"`) {
			break
		}
	}
	s.close()
	code, body := rw.post(t, "/api/runs/"+id+"/steer", good, `{"text":"steered from the console"}`)
	if code != http.StatusAccepted {
		t.Fatalf("steer: %d %s", code, body)
	}
	var ack struct {
		ControlSeq uint64 `json:"controlSeq"`
	}
	if err := json.Unmarshal([]byte(body), &ack); err != nil || ack.ControlSeq == 0 {
		t.Fatalf("steer answer %s", body)
	}
	// Sent twice with one Idempotency-Key (a retry): stored once, the same
	// answer; the transcript below has it once.
	key := http.Header{"Idempotency-Key": {"f-1"}}
	code, first := rw.postWith(t, "/api/runs/"+id+"/followup", good, `{"text":"followed up from the console"}`, key)
	if code != http.StatusAccepted {
		t.Fatalf("followup: %d %s", code, first)
	}
	if code, again := rw.postWith(t, "/api/runs/"+id+"/followup", good, `{"text":"followed up from the console"}`, key); code != http.StatusAccepted || again != first {
		t.Fatalf("followup retried with its key: %d %s, first %s", code, again, first)
	}
	if code, body := rw.postWith(t, "/api/runs/"+id+"/followup", good, `{"text":"x"}`, http.Header{"Idempotency-Key": {"no spaces"}}); code != http.StatusBadRequest || !strings.Contains(body, "Idempotency-Key") {
		t.Fatalf("a bad key: %d %s", code, body)
	}
	// compact (protocol §16): its text is optional and bounded.
	if code, body := rw.post(t, "/api/runs/"+id+"/compact", good, `{"text":"`+strings.Repeat("x", bus.MaxCompactionInstructions+1)+`"}`); code != http.StatusBadRequest {
		t.Fatalf("compact with long instructions: %d %s", code, body)
	}
	if code, body := rw.post(t, "/api/runs/"+id+"/compact", good, `{}`); code != http.StatusAccepted || !strings.Contains(body, "controlSeq") {
		t.Fatalf("compact: %d %s", code, body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tr, err := f.c.LoadTranscript(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	var said []string
	for _, m := range tr.Messages {
		said = append(said, m.Role+": "+m.TextOf())
	}
	want := []string{"user: go", "assistant: " + strings.Repeat("long answer ", 60), "user: steered from the console",
		"assistant: after the steer", "user: followed up from the console", "assistant: after the follow-up"}
	if strings.Join(said, "\n") != strings.Join(want, "\n") {
		t.Errorf("transcript:\n%s\nwant:\n%s", strings.Join(said, "\n"), strings.Join(want, "\n"))
	}
	// Submitting, and control of a finished run.
	code, body = rw.post(t, "/api/runs", good, `{"queue":"other","id":"ctl-2","prompt":"hi","metadata":{"tenant":"t1"}}`)
	if code != http.StatusCreated || !strings.Contains(body, `"id":"ctl-2"`) {
		t.Fatalf("submit: %d %s", code, body)
	}
	if code, body := rw.post(t, "/api/runs", good, `{"prompt":""}`); code != http.StatusBadRequest || !strings.Contains(body, "prompt") {
		t.Errorf("bad submit: %d %s", code, body)
	}
	if code, body := rw.post(t, "/api/runs", good, `{"prompt":"x","bogus":1}`); code != http.StatusBadRequest {
		t.Errorf("unknown field: %d %s", code, body)
	}
	r := rw.waitRun(t, "ctl-2", func(r bus.RunRecord) bool { return r.Finished() })
	if r.Queue != "other" || r.Metadata["tenant"] != "t1" {
		t.Errorf("submitted run %+v", r)
	}
	if code, body := rw.post(t, "/api/runs/ctl-2/abort", good, `{}`); code != http.StatusConflict {
		t.Errorf("abort of a finished run: %d %s", code, body)
	}
}

func TestAuth(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	dir := t.TempDir()
	hash, err := bcrypt.GenerateFromPassword([]byte("s3cret"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	htpasswd := filepath.Join(dir, "htpasswd")
	if err := os.WriteFile(htpasswd, []byte("# users\nalice:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := loadAuth(htpasswd, "")
	if err != nil {
		t.Fatal(err)
	}
	c := newConsole(t, f, serverConfig{Auth: a, AllowControl: true})
	do := func(user, pass, path string) *http.Response {
		req, _ := http.NewRequest(http.MethodGet, c.URL+path, nil)
		if user != "" {
			req.SetBasicAuth(user, pass)
		}
		resp, err := c.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	for _, p := range []string{"/", "/api/runs", "/static/app.js", "/api/runs/x/events"} {
		resp := do("", "", p)
		if resp.StatusCode != http.StatusUnauthorized || !strings.Contains(resp.Header.Get("WWW-Authenticate"), "Basic") {
			t.Errorf("%s without auth: %d", p, resp.StatusCode)
		}
		if resp := do("alice", "wrong", p); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s wrong password: %d", p, resp.StatusCode)
		}
		if resp := do("bob", "s3cret", p); resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s unknown user: %d", p, resp.StatusCode)
		}
	}
	if resp := do("alice", "s3cret", "/api/session"); resp.StatusCode != http.StatusOK {
		t.Errorf("alice: %d", resp.StatusCode)
	}

	// Bearer token: header, or ?token= once, kept in a cookie.
	tokFile := filepath.Join(dir, "token")
	if err := os.WriteFile(tokFile, []byte("0123456789abcdef-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ta, err := loadAuth("", tokFile)
	if err != nil {
		t.Fatal(err)
	}
	tc := newConsole(t, f, serverConfig{Auth: ta})
	resp, err := tc.Client().Get(tc.URL + "/api/session")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("no token: %d", resp.StatusCode)
	}
	req, _ := http.NewRequest(http.MethodGet, tc.URL+"/api/session", nil)
	req.Header.Set("Authorization", "Bearer 0123456789abcdef-token")
	if resp, err := tc.Client().Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("bearer: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	noRedirect := *tc.Client()
	noRedirect.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err = noRedirect.Get(tc.URL + "/fleet?token=0123456789abcdef-token")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || resp.Header.Get("Location") != "/fleet" || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
		t.Errorf("?token=: %d %q %v", resp.StatusCode, resp.Header.Get("Location"), resp.Cookies())
	}
	req, _ = http.NewRequest(http.MethodGet, tc.URL+"/api/session", nil)
	req.AddCookie(resp.Cookies()[0])
	if resp, err := tc.Client().Do(req); err != nil || resp.StatusCode != http.StatusOK {
		t.Errorf("cookie: %v %v", resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}

	// Files that are not what they should be.
	bad := filepath.Join(dir, "bad")
	_ = os.WriteFile(bad, []byte("alice:{SHA}abc\n"), 0o600)
	if _, err := loadAuth(bad, ""); err == nil || !strings.Contains(err.Error(), "bcrypt") {
		t.Errorf("sha htpasswd: %v", err)
	}
	_ = os.WriteFile(bad, []byte("short\n"), 0o600)
	if _, err := loadAuth("", bad); err == nil {
		t.Error("short token accepted")
	}
}

func TestRefusesOpenBindWithoutAuth(t *testing.T) {
	t.Parallel()
	var stderr bytes.Buffer
	getenv := func(string) string { return "" }
	code := run(context.Background(), []string{"--addr", "0.0.0.0:0", "--nats", "nats://127.0.0.1:1"}, getenv, &stderr, nil)
	if code != 2 || !strings.Contains(stderr.String(), "refusing to listen on 0.0.0.0:0 without authentication") {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
	for addr, want := range map[string]bool{"127.0.0.1:8080": true, "localhost:1": true, "[::1]:80": true,
		":8080": false, "0.0.0.0:80": false, "10.1.2.3:80": false, "example.com:80": false} {
		if got := isLoopback(addr); got != want {
			t.Errorf("isLoopback(%q) = %v", addr, got)
		}
	}
	stderr.Reset()
	if code := run(context.Background(), []string{"--basic-auth-file", "a", "--auth-token-file", "b"}, getenv, &stderr, nil); code != 2 {
		t.Errorf("both auth files: exit %d", code)
	}
	stderr.Reset()
	allow, _ := parseFlags(nil, func(k string) string {
		if k == "AGENTS_CONSOLE_ALLOW_CONTROL" {
			return "true"
		}
		return ""
	}, &stderr)
	if allow == nil || !allow.allowControl || allow.addr != "127.0.0.1:8080" {
		t.Errorf("AGENTS_CONSOLE_ALLOW_CONTROL: %+v", allow)
	}
}

// TestModelTextStoredRaw: what the model wrote reaches the page's JSON as
// the same string, never rewritten into HTML.
func TestModelTextStoredRaw(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{})
	xss := `<script>window.__xss=1</script><img src=x onerror="window.__xss=2">`
	req := slowText("xss-1", xss)
	req.Metadata = map[string]string{"note": xss}
	id := f.submit(req)
	r := c.waitRun(t, id, func(r bus.RunRecord) bool { return r.Finished() })
	if r.Metadata["note"] != xss {
		t.Errorf("metadata %q", r.Metadata["note"])
	}
	s := c.openEvents(t, id, "")
	var text string
	for {
		ev, err := s.next()
		if err != nil || ev.Event == "end" {
			break
		}
		env, err := bus.DecodeEnvelope([]byte(ev.Data))
		if err != nil {
			t.Fatal(err)
		}
		e, err := env.Decode()
		if err != nil {
			t.Fatal(err)
		}
		if e.Agent != nil && e.Type == "message_end" && e.Agent.Message.Role == "assistant" {
			text = e.Agent.Message.TextOf()
		}
	}
	if text != xss {
		t.Errorf("assistant text %q, want %q", text, xss)
	}
	// The page itself holds no run data: it is the static shell.
	resp, err := c.Client().Get(c.URL + "/runs/" + id)
	if err != nil {
		t.Fatal(err)
	}
	page, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Contains(page, []byte("__xss")) || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") {
		t.Errorf("page %s\n%s", resp.Header, page)
	}
}

// TestRunServesAndStops runs the command as main does: it serves, and on
// ctx cancel ends its open event streams and exits 0.
func TestRunServesAndStops(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ready := make(chan string, 1)
	exit := make(chan int, 1)
	var stderr bytes.Buffer
	go func() {
		exit <- run(ctx, []string{"--addr", "127.0.0.1:0", "--log-level", "warn"}, func(k string) string {
			if k == "NATS_URL" {
				return f.srv.URL()
			}
			return ""
		}, &stderr, ready)
	}()
	var addr string
	select {
	case addr = <-ready:
	case code := <-exit:
		t.Fatalf("exit %d: %s", code, stderr.String())
	}
	resp, err := http.Get("http://" + addr + "/api/session")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("session: %d", resp.StatusCode)
	}
	stream, err := http.Get("http://" + addr + "/api/runs/quiet-run/events")
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	cancel()
	if code := <-exit; code != 0 {
		t.Errorf("exit %d: %s", code, stderr.String())
	}
	// The open stream ended with the server.
	if _, err := io.ReadAll(stream.Body); err != nil {
		t.Logf("stream ended with %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
}
