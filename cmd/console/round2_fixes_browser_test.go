package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	cdppage "github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestBrowserRoundTwoFixes checks the fixes of issue 61's review in
// Chromium, one browser and one fleet for all: a partial slot makes no
// rate; an edit is shown from its event; the page's polls never overlap
// and a stalled one is retried; a cut-short approvals scan says so.
func TestBrowserRoundTwoFixes(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	f := newTestFleet(t)
	b := newBrowser(t, "")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	// First, while no run has finished in the fleet: the rates.
	t.Run("partial slot makes no rate", func(t *testing.T) {
		sm := &sampler{client: f.c, every: defaultSampleEvery}
		if _, err := sm.ensureStream(ctx); err != nil {
			t.Fatal(err)
		}
		now := time.Now().UnixMilli()
		// 9 runs in 3 s of a slot the console started in, then 1 in a
		// full slot: 6 a minute, not 54.
		for _, s := range []fleetSample{
			{T: now - 20001, Every: 10000, Partial: true, Queues: []queueSample{{Queue: "other", queueCounts: queueCounts{Finished: 9}}}},
			{T: now - 10001, Every: 10000, Span: 10000, Queues: []queueSample{{Queue: "other", queueCounts: queueCounts{Finished: 1}}}},
		} {
			data, _ := json.Marshal(s)
			if _, err := f.c.JetStream().Publish(ctx, samplesSubject(f.c.Names()), data); err != nil {
				t.Fatal(err)
			}
		}
		c := newConsole(t, f, serverConfig{})
		waitHistory(t, c, "loaded the two samples", func(h historyInfo) bool { return len(h.Samples) >= 2 })
		b.t, b.base = t, c.URL // its failures are the subtest's
		page := b.tab()
		b.open(page, "/fleet")
		b.do(page, "the fleet page draws the history", wait(`document.getElementById("history-note").textContent.includes("samples")`),
			wait(`document.querySelector('tr[data-queue="other"] .chart .peak') !== null`))
		if got := eval[string](b, page, `document.querySelector('tr[data-queue="other"] .chart .peak').textContent`); got != "peak 6" {
			t.Errorf("throughput: %q, want peak 6 (the partial slot's 9 runs are no rate)", got)
		}
		if got := eval[string](b, page, `document.querySelector('tr[data-queue="other"] [data-finished]').textContent`); got != "10" {
			t.Errorf("finished in the hour: %q, want 10", got)
		}
	})

	t.Run("edited arguments from the event", func(t *testing.T) {
		publishEditedRun(t, f, "edit-ev")
		c := newConsole(t, f, serverConfig{})
		b.t, b.base = t, c.URL // its failures are the subtest's
		page := b.tab()
		b.open(page, "/runs/edit-ev")
		b.do(page, "the edits show", wait(`document.querySelectorAll(".edited-args").length === 2`))
		got := eval[[]string](b, page, `[...document.querySelectorAll(".toolcall")].map((c) => c.dataset.call + "|" + (c.querySelector(".edited-args") || {}).textContent + "|" + c.querySelector(".args.superseded")?.textContent + "|" + c.querySelector(".edited-label")?.textContent)`)
		if len(got) != 2 || !strings.HasPrefix(got[0], `c1|{
  "expression": "7*6"
}|{
  "expression": "1+1"
}|ran with the arguments alice edited`) || !strings.HasPrefix(got[1], "c2|{}|") {
			t.Errorf("calls: %q", got)
		}
		b.checkConsole()
	})

	t.Run("polls chained, each with a timeout", func(t *testing.T) {
		var mu sync.Mutex
		stalled := false
		abandoned := make(chan struct{})
		wrap := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				switch {
				case r.URL.Path == "/api/runs":
					mu.Lock()
					first := !stalled
					stalled = true
					mu.Unlock()
					if first { // the first read stalls until the page gives up on it
						<-r.Context().Done()
						close(abandoned)
						return
					}
				case r.URL.Path == "/api/fleet":
					// Slower than the page's 2 s interval, within its timeout.
					select {
					case <-time.After(3 * time.Second):
					case <-r.Context().Done():
						return
					}
				}
				h.ServeHTTP(w, r)
			})
		}
		c := newConsoleWith(t, f, serverConfig{RequestTimeout: 4 * time.Second}, wrap)
		b.t, b.base = t, c.URL // its failures are the subtest's
		page := b.tab()
		// The page's reads of the fleet, counted in the page: Chromium
		// holds a second request for a URL until the first one's headers
		// come (its cache lock), so the server sees fewer at once.
		b.do(page, "count the reads", chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			_, err := cdp.Call(ctx, tgt, cdppage.AddScriptToEvaluateOnNewDocument, cdppage.AddScriptToEvaluateOnNewDocumentParams{Source: countFleetReads})
			return err
		}))
		b.open(page, "/")
		b.do(page, "the runs page gives up on the stalled read and reads again",
			wait(`document.getElementById("runs-body").children.length > 0`))
		select { // the server sees the abort once the connection closes
		case <-abandoned:
		case <-ctx.Done():
			t.Error("the stalled read was not abandoned by the page")
		}
		b.open(page, "/fleet")
		b.do(page, "three reads of the fleet", wait(`window.__fleetReads.started >= 3`))
		if n := eval[int](b, page, `window.__fleetReads.most`); n != 1 {
			t.Errorf("%d reads of the fleet at once under a slow server, want 1", n)
		}
	})

	t.Run("a stalled control request is sent again", func(t *testing.T) {
		const id = "steer-stall"
		f.submit(gatedRun(id, "1+1")) // waits for approval: a live run to steer
		var once sync.Once
		stalledOne := make(chan struct{})
		wrap := func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				if r.Method == http.MethodPost && r.URL.Path == "/api/runs/"+id+"/steer" {
					first := false
					once.Do(func() { first = true })
					if first { // no answer until the page gives up on it
						// (the server sees a closed connection only once
						// the body is read)
						_, _ = io.Copy(io.Discard, r.Body)
						<-r.Context().Done()
						close(stalledOne)
						return
					}
				}
				h.ServeHTTP(w, r)
			})
		}
		c := newConsoleWith(t, f, serverConfig{AllowControl: true, RequestTimeout: 2 * time.Second}, wrap)
		c.waitRun(t, id, func(r bus.RunRecord) bool { return r.Waiting != nil })
		b.t, b.base = t, c.URL
		page := b.tab()
		b.open(page, "/runs/"+id)
		b.do(page, "steer through a stalled request",
			wait(`document.getElementById("steer-text") !== null`),
			setValue("#steer-text", "mind the units"),
			chromedp.Evaluate[chromedp.Void](`document.getElementById("steer-form").requestSubmit()`),
			wait(`document.getElementById("toast").textContent === "Steer: sent"`))
		select { // the server sees the abort once the connection closes
		case <-stalledOne:
		case <-ctx.Done():
			t.Error("the first request was not given up")
		}
		names := f.c.Names()
		st, err := f.c.Stream(ctx, names.ControlStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(names.Control(id, bus.KindSteer)))
		if err != nil {
			t.Fatal(err)
		}
		if n := info.State.Subjects[names.Control(id, bus.KindSteer)]; n != 1 {
			t.Errorf("%d steers stored, want 1", n)
		}
		// Ended, so that the next subtest's fleet has no waiting run.
		if _, err := f.c.SendControl(ctx, id, bus.KindAbort, bus.Control{Reason: "test over"}); err != nil {
			t.Fatal(err)
		}
		c.waitRun(t, id, func(r bus.RunRecord) bool { return r.Finished() })
		b.checkConsole()
	})

	t.Run("queued runs paged once each", func(t *testing.T) {
		// A fleet without workers: its runs stay queued.
		fl := fleettest.Start(t, fleettest.Options{Streams: bus.StreamsConfig{Queues: []string{"default"}}})
		idle := &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
		var ids []string
		seqs := map[string]uint64{}
		for i := range 30 {
			id := fmt.Sprintf("queued-%02d", i)
			res, err := fl.Client.Submit(ctx, "", &bus.RunRequest{ID: id, Prompt: "wait"})
			if err != nil {
				t.Fatal(err)
			}
			ids, seqs[id] = append(ids, id), res.Seq
		}
		kv, err := fl.Client.Records(ctx)
		if err != nil {
			t.Fatal(err)
		}
		done, _ := json.Marshal(bus.RunRecord{ID: "finished-1", Queue: "default", State: bus.StatusSucceeded})
		if _, err := kv.Put(ctx, "finished-1", done); err != nil {
			t.Fatal(err)
		}
		c := newConsole(t, idle, serverConfig{})
		b.t, b.base = t, c.URL
		page := b.tab()
		b.open(page, "/?limit=25")
		b.do(page, "the first page: 25 queued runs", wait(`document.querySelectorAll("#runs-body tr[data-run]").length === 25`))
		rows := func() []string {
			return eval[[]string](b, page, `[...document.querySelectorAll("#runs-body tr[data-run]")].map((r) => r.dataset.run + ":" + r.dataset.state)`)
		}
		got := rows()
		// Between the pages, a run not listed yet is picked up (its
		// record written as a worker's would be).
		picked, _ := json.Marshal(bus.RunRecord{ID: "queued-27", Queue: "default", State: bus.StateRunning, RequestSeq: seqs["queued-27"], HeartbeatAt: time.Now()})
		if _, err := kv.Put(ctx, "queued-27", picked); err != nil {
			t.Fatal(err)
		}
		b.do(page, "older", click(`#page-older`), wait(`document.getElementById("runs-body").dataset.before !== "" && document.querySelector("#runs-body tr[data-run]")?.dataset.run !== "queued-00"`))
		got = append(got, rows()...)
		var want []string
		for _, id := range ids {
			state := "queued"
			if id == "queued-27" {
				state = "running"
			}
			want = append(want, id+":"+state)
		}
		want = append(want, "finished-1:succeeded")
		if !slices.Equal(got, want) {
			t.Errorf("the pages listed %v\nwant %v", got, want)
		}
		b.checkConsole()
	})

	// Last: it fills the bucket.
	t.Run("approvals scan cut short says so", func(t *testing.T) {
		// The records walk is what a scan cuts short: a fleet before 1.9
		// has no waiting index (its own bound: bus
		// TestWaitingPageBoundsItsHoles), so the index goes first.
		if err := f.Client.JetStream().DeleteStream(context.Background(), f.Client.Names().WaitingStream()); err != nil {
			t.Fatal(err)
		}
		fillRecords(t, f.Fleet, 0, 200)
		c := newConsole(t, f, serverConfig{ApprovalsScan: 100})
		b.t, b.base = t, c.URL // its failures are the subtest's
		page := b.tab()
		b.open(page, "/approvals")
		b.do(page, "the approvals page", wait(`document.getElementById("approvals-body").dataset.loaded === "true"`))
		got := eval[[]string](b, page, `[document.getElementById("approvals-count").textContent, document.getElementById("approvals-body").textContent]`)
		if !regexp.MustCompile(`scanned 1[0-9][0-9] of [0-9,]+ records`).MatchString(got[0]) || !strings.Contains(got[0], "may be missing") || !strings.Contains(got[1], "in the records scanned") {
			t.Errorf("a cut-short scan: %q", got)
		}
		b.checkConsole()
	})
}

// countFleetReads counts the page's reads of /api/fleet: started, under
// way (until the answer's headers), and the most under way at once.
const countFleetReads = `(() => {
  const reads = window.__fleetReads = { started: 0, now: 0, most: 0 };
  const fetch0 = window.fetch;
  window.fetch = function (input, init) {
    if (String(input) !== "/api/fleet") return fetch0.call(this, input, init);
    reads.started++;
    reads.most = Math.max(reads.most, ++reads.now);
    return fetch0.call(this, input, init).finally(() => { reads.now--; });
  };
})()`

// publishEditedRun stores the events of a finished run whose two gated
// calls were approved with edits: c1's to other arguments, c2's to none
// ({}). The answers they name are not stored: the events say what ran.
func publishEditedRun(t *testing.T, f *testFleet, id string) {
	t.Helper()
	user := `{"role":"user","content":[{"type":"text","text":"compute"}],"timestamp":1}`
	assistant := `{"role":"assistant","content":[{"type":"toolCall","id":"c1","name":"calculator","arguments":{"expression":"1+1"}},{"type":"toolCall","id":"c2","name":"calculator","arguments":{"expression":"2+2"}}],"api":"faux","provider":"faux","model":"m","usage":{"input":1,"output":2,"cacheRead":0,"cacheWrite":0,"totalTokens":3,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"stopReason":"toolUse","timestamp":2}`
	result := func(call, text string) string {
		return `{"role":"toolResult","toolCallId":"` + call + `","toolName":"calculator","content":[{"type":"text","text":"` + text + `"}],"isError":false,"timestamp":3}`
	}
	evs := []string{
		`{"type":"run_started","queue":"default","worker":"w1","attempt":1,"tools":["calculator"]}`,
		`{"type":"turn_start"}`,
		`{"type":"message_start","message":` + user + `}`,
		`{"type":"message_end","message":` + user + `}`,
		`{"type":"message_start","message":` + assistant + `}`,
		`{"type":"message_end","message":` + assistant + `}`,
		`{"type":"tool_execution_start","toolCallId":"c1","toolName":"calculator","args":{"expression":"1+1"}}`,
		`{"type":"tool_approval_requested","toolCallId":"c1","toolName":"calculator","args":{"expression":"1+1"},"expiresAt":` + strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + `}`,
		`{"type":"tool_approval_resolved","toolCallId":"c1","decision":"approve","by":"alice","controlSeq":999999,"arguments":{"expression":"7*6"}}`,
		`{"type":"tool_execution_end","toolCallId":"c1","toolName":"calculator","isError":false}`,
		`{"type":"message_start","message":` + result("c1", "42") + `}`,
		`{"type":"message_end","message":` + result("c1", "42") + `}`,
		`{"type":"tool_execution_start","toolCallId":"c2","toolName":"calculator","args":{"expression":"2+2"}}`,
		`{"type":"tool_approval_requested","toolCallId":"c2","toolName":"calculator","args":{"expression":"2+2"},"expiresAt":` + strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10) + `}`,
		`{"type":"tool_approval_resolved","toolCallId":"c2","decision":"approve","by":"alice","controlSeq":999998,"arguments":{}}`,
		`{"type":"tool_execution_end","toolCallId":"c2","toolName":"calculator","isError":true}`,
		`{"type":"message_start","message":` + result("c2", "no expression") + `}`,
		`{"type":"message_end","message":` + result("c2", "no expression") + `}`,
		`{"type":"turn_end"}`,
		`{"type":"run_finished","status":"succeeded","usage":{"input":1,"output":2,"cacheRead":0,"cacheWrite":0,"totalTokens":3,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"cost":0,"turns":1,"durationMs":5}`,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for i, e := range evs {
		data := (&bus.Envelope{Run: id, Seq: uint64(i + 1), Attempt: 1, Worker: "w1", TS: time.Now().UnixMilli(), Event: []byte(e)}).AppendJSON(nil)
		if _, err := f.c.JetStream().Publish(ctx, f.c.Names().Events(id), data); err != nil {
			t.Fatal(err)
		}
	}
}
