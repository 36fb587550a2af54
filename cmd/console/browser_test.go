package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// chromiumPath finds a Chromium or Chrome binary. Without one the browser
// tests skip, except in CI (CI=true), where they fail.
func chromiumPath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium binary found and CI=true: install Debian's chromium (apt-get install chromium) or set CHROMIUM")
	}
	t.Skip("browser tests skipped: no chromium binary found (apt-get install chromium, or set CHROMIUM=/path/to/chrome)")
	return ""
}

// browser is a headless Chromium for one test; tab opens pages in it.
type browser struct {
	t        testing.TB
	ctx      context.Context
	base     string
	mu       sync.Mutex
	problems []string
}

func newBrowser(t testing.TB, base string) *browser {
	t.Helper()
	return newBrowserSized(t, base, 1280, 860)
}

// newBrowserSized is newBrowser with a window of that size.
func newBrowserSized(t testing.TB, base string, width, height int) *browser {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		chromedp.NoSandbox, // root in CI containers
		chromedp.DisableGPU,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.NoFirstRun,
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(width, height),
	)
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelAlloc()
	})
	// Start the browser with a context without timeout: it lives as long.
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	return &browser{t: t, ctx: ctx, base: base}
}

// tab opens a new tab; uncaught exceptions and CSP reports in it fail the
// test.
func (b *browser) tab() context.Context {
	ctx, cancel := chromedp.NewContext(b.ctx)
	b.t.Cleanup(cancel)
	if err := chromedp.Do(ctx); err != nil {
		b.t.Fatal(err)
	}
	msgs := chromedp.Console(ctx)
	go func() {
		for m, err := range msgs {
			if err != nil {
				return
			}
			if m.Type == chromedp.ConsoleException || strings.Contains(m.Text, "Content Security Policy") {
				b.mu.Lock()
				b.problems = append(b.problems, string(m.Type)+": "+m.Text)
				b.mu.Unlock()
			}
		}
	}()
	return ctx
}

func (b *browser) checkConsole() {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, p := range b.problems {
		b.t.Errorf("browser console: %s", p)
	}
	b.problems = nil
}

// do runs actions with a deadline.
func (b *browser) do(ctx context.Context, what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	tctx, cancel := context.WithTimeout(ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(tctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// wait polls a JavaScript predicate until it holds.
func wait(expr string) chromedp.Action[chromedp.Void] {
	return chromedp.Poll[chromedp.Void](expr, chromedp.WithPollingTimeout(45*time.Second), chromedp.WithPollingInterval(50*time.Millisecond))
}

func eval[T any](b *browser, ctx context.Context, expr string) T {
	b.t.Helper()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("%s: %v", expr, err)
	}
	return v
}

// waitPage waits until the tab shows a console page at path, across a
// navigation the page started itself (evaluating fails while it happens).
func waitPage(path string) chromedp.Action[chromedp.Void] {
	return chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
		expr := `location.pathname === ` + jsString(path) + ` && document.body.dataset.ready === "true"`
		for {
			ok, err := chromedp.Evaluate[bool](expr)(ctx, tgt)
			if err == nil && ok {
				return nil
			}
			select {
			case <-ctx.Done():
				return fmt.Errorf("page %s never came: %w (last error %v)", path, ctx.Err(), err)
			case <-time.After(50 * time.Millisecond):
			}
		}
	})
}

// open navigates a tab to a console page and waits for it to start.
func (b *browser) open(ctx context.Context, path string) {
	b.t.Helper()
	b.do(ctx, "open "+path, chromedp.Navigate(b.base+path), wait(`document.body.dataset.ready === "true"`))
}

// fauxJSON is a faux script streaming each response at about rate
// characters a second.
func fauxJSON(rate float64, texts ...string) string {
	s := bus.FauxScript{TokenSize: 1, TokensPerSecond: rate / 4}
	for _, t := range texts {
		s.Responses = append(s.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(t)}})
	}
	b, _ := json.Marshal(s)
	return string(b)
}

func jsString(s string) string { b, _ := json.Marshal(s); return string(b) }

// rowState is the JavaScript for a run's state in the runs table.
func rowState(id string) string {
	return `(document.querySelector('tr[data-run=` + jsString(id) + `]') || {dataset: {}}).dataset.state`
}

func TestBrowser(t *testing.T) {
	t.Parallel()
	chromiumPath(t) // skip (or fail in CI) before starting a fleet
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{AllowControl: true})
	b := newBrowser(t, c.URL)

	// The runs page stays open the whole test: its table must follow the
	// runs without a reload.
	runs := b.tab()
	b.open(runs, "/")
	b.do(runs, "mark the runs page", chromedp.Evaluate[chromedp.Void](`window.__notReloaded = true`))

	{ // submit, stream and steer from the page
		t.Log("submit, stream and steer from the page")
		page := b.tab()
		b.open(page, "/new")
		long := strings.Repeat("The faux model streams this sentence slowly. ", 40)
		b.do(page, "fill the new-run form",
			chromedp.SetValue(chromedp.ID("new-prompt"), "Tell me something long"),
			chromedp.SetValue(chromedp.ID("new-id"), "browser-steer"),
			chromedp.SetValue(chromedp.ID("new-meta"), "tenant=acme"),
			chromedp.SetValue(chromedp.ID("new-faux"), fauxJSON(300, long, "Steer taken: here is the short answer.")),
			chromedp.Click(chromedp.ID("new-submit")),
			waitPage("/runs/browser-steer"))
		// The text streams in: first a little, then more, while running.
		first := 0
		b.do(page, "text streams in", wait(`document.querySelector("#transcript .msg-assistant .text")`),
			wait(`document.querySelector("#transcript .msg-assistant .text").textContent.length > 20`))
		first = eval[int](b, page, `document.querySelector("#transcript .msg-assistant .text").textContent.length`)
		b.do(runs, "runs table shows it running", wait(rowState("browser-steer")+` === "running"`))
		b.do(page, "steer",
			chromedp.SetValue(chromedp.ID("steer-text"), "Please be brief."),
			chromedp.Click(`#steer-form button`),
			wait(`document.querySelector("#transcript .msg-assistant .text").textContent.length > `+jsonInt(first)),
			wait(`[...document.querySelectorAll("#transcript .msg-user")].some(m => m.textContent.includes("Please be brief."))`),
			wait(`document.getElementById("status").dataset.state === "succeeded"`))
		text := eval[string](b, page, `document.getElementById("transcript").textContent`)
		if !strings.Contains(text, "Steer taken: here is the short answer.") || !strings.Contains(text, "finished: succeeded") {
			t.Errorf("transcript after the steer:\n%s", text)
		}
		// The steer comes after the first answer and before the second.
		order := eval[[]string](b, page, `[...document.querySelectorAll("#transcript .msg")].map(m => m.dataset.role)`)
		if strings.Join(order, ",") != "user,assistant,user,assistant" {
			t.Errorf("messages %v", order)
		}
	}

	{ // abort from the page
		t.Log("abort from the page")
		f.submit(&bus.RunRequest{ID: "browser-abort", Prompt: "go", Faux: mustFaux(fauxJSON(100, strings.Repeat("never finishes ", 400)))})
		page := b.tab()
		b.open(page, "/runs/browser-abort")
		b.do(page, "abort",
			wait(`(document.querySelector("#transcript .msg-assistant .text") || {textContent: ""}).textContent.length > 0`),
			chromedp.Click(chromedp.ID("abort")),
			wait(`document.getElementById("status").dataset.state === "aborted"`),
			wait(`document.getElementById("transcript").textContent.includes("finished: aborted (aborted_by_user)")`))
	}

	{ // runs table follows without reload
		t.Log("runs table follows without reload")
		b.do(runs, "table states",
			wait(rowState("browser-steer")+` === "succeeded"`),
			wait(rowState("browser-abort")+` === "aborted"`))
		if !eval[bool](b, runs, `window.__notReloaded === true`) {
			t.Error("the runs page was reloaded")
		}
		// Filters.
		b.do(runs, "filter by state",
			chromedp.SetValue(chromedp.ID("f-state"), "aborted"),
			chromedp.Evaluate[chromedp.Void](`document.getElementById("f-state").dispatchEvent(new Event("change"))`),
			wait(`document.querySelectorAll("#runs-body tr[data-run]").length === 1 && `+rowState("browser-abort")+` === "aborted"`),
			chromedp.SetValue(chromedp.ID("f-state"), ""),
			chromedp.Evaluate[chromedp.Void](`document.getElementById("f-state").dispatchEvent(new Event("change"))`),
			wait(`document.querySelectorAll("#runs-body tr[data-run]").length === 2`))
	}

	{ // reload mid-stream gives the same transcript
		t.Log("reload mid-stream gives the same transcript")
		f.submit(&bus.RunRequest{ID: "browser-reload", Prompt: "go", Faux: mustFaux(fauxJSON(400, strings.Repeat("reloaded mid-stream ", 60), "unused"))})
		page := b.tab()
		b.open(page, "/runs/browser-reload")
		b.do(page, "reload while streaming",
			wait(`(document.querySelector("#transcript .msg-assistant .text") || {textContent: ""}).textContent.length > 40`),
			chromedp.Evaluate[chromedp.Void](`window.__beforeReload = true`))
		if eval[bool](b, page, `document.getElementById("transcript").dataset.ended === "true"`) {
			t.Fatal("the run ended before the reload: make it slower")
		}
		b.do(page, "after the reload", chromedp.Reload(), wait(`document.body.dataset.ready === "true" && !window.__beforeReload`),
			wait(`document.getElementById("transcript").dataset.ended === "true"`))
		reloaded := eval[string](b, page, `document.getElementById("transcript").textContent`)
		fresh := b.tab()
		b.open(fresh, "/runs/browser-reload")
		b.do(fresh, "replay", wait(`document.getElementById("transcript").dataset.ended === "true"`))
		replayed := eval[string](b, fresh, `document.getElementById("transcript").textContent`)
		if reloaded != replayed || !strings.Contains(replayed, strings.TrimSpace(strings.Repeat("reloaded mid-stream ", 60))) {
			t.Errorf("reloaded page:\n%s\nreplay:\n%s", reloaded, replayed)
		}
	}

	{ // model text renders inert
		t.Log("model text renders inert")
		xss := `<script>window.__xss=1</script><img src=x onerror="window.__xss=2"><b>bold</b>`
		req := &bus.RunRequest{ID: "browser-xss", Prompt: xss, Metadata: map[string]string{"note": xss},
			Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{
				agent.Content{Type: agent.ContentThinking, Thinking: xss}, agent.Text(xss), agent.ToolCall("call-1", xss, map[string]any{"html": xss})}, StopReason: agent.StopReasonToolUse},
				{Content: []agent.Content{agent.Text(xss)}}}}}
		f.submit(req)
		page := b.tab()
		b.open(page, "/runs/browser-xss")
		b.do(page, "render", wait(`document.getElementById("transcript").dataset.ended === "true"`))
		b.open(page, "/?q=browser-xss")
		b.do(page, "row", wait(`document.querySelector('tr[data-run="browser-xss"]')`))
		b.open(page, "/runs/browser-xss")
		b.do(page, "render again", wait(`document.getElementById("transcript").dataset.ended === "true"`))
		checks := map[string]string{
			"no injected script":        `document.querySelectorAll("script").length === 2`, // markdown.js, app.js
			"no injected img":           `document.querySelectorAll("img").length === 0`,
			"no injected b":             `document.querySelectorAll("#main b").length === 0`,
			"flag not set":              `window.__xss === undefined`,
			"text shown as text":        `document.getElementById("transcript").textContent.split(` + jsString(xss) + `).length > 3`,
			"tool call name as text":    `document.querySelector(".toolcall .label").textContent.includes("<script>")`,
			"user prompt shown as text": `document.querySelector(".msg-user .text").textContent === ` + jsString(xss),
		}
		for name, expr := range checks {
			if !eval[bool](b, page, expr) {
				t.Errorf("%s: %s is false", name, expr)
			}
		}
	}

	{ // images
		t.Log("images")
		const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg=="
		svg := base64.StdEncoding.EncodeToString([]byte(`<svg xmlns="http://www.w3.org/2000/svg" onload="window.__xss=3"/>`))
		f.submit(&bus.RunRequest{ID: "browser-image", Prompt: "what is in these?",
			Images: []agent.Content{agent.Image(png, "image/png"), agent.Image(svg, "image/svg+xml")}, Faux: mustFaux(fauxJSON(0, "a pixel"))})
		page := b.tab()
		b.open(page, "/runs/browser-image")
		b.do(page, "render", wait(`document.getElementById("transcript").dataset.ended === "true"`))
		if got := eval[[]string](b, page, `[...document.querySelectorAll("#transcript img")].map((i) => i.src)`); len(got) != 1 || got[0] != "data:image/png;base64,"+png {
			t.Errorf("images %v", got)
		}
		if !eval[bool](b, page, `document.querySelector(".msg-user").textContent.includes("image of type image/svg+xml not shown") && window.__xss === undefined`) {
			t.Error("the svg image was not refused")
		}
	}

	{ // readers' rules on a resumed run
		t.Log("a resumed run")
		publishResumedRun(t, f, "browser-resumed")
		page := b.tab()
		b.open(page, "/runs/browser-resumed")
		b.do(page, "render", wait(`document.getElementById("transcript").dataset.ended === "true"`))
		text := eval[string](b, page, `document.getElementById("transcript").textContent`)
		for _, want := range []string{"interrupted: attempt 1 stopped here", "attempt 2 started on w2",
			"attempt 2 resumed the run: 1 messages restored", "the full answer", "finished: succeeded"} {
			if !strings.Contains(text, want) {
				t.Errorf("no %q in the transcript:\n%s", want, text)
			}
		}
		if strings.Contains(text, "STALE") {
			t.Errorf("an old attempt's late event was shown:\n%s", text)
		}
		if strings.Contains(text, "the full answerthe full answer") {
			t.Errorf("a stored copy was applied again:\n%s", text)
		}
		if got := eval[[]string](b, page, `[...document.querySelectorAll("#transcript .msg")].map((m) => m.dataset.role + (m.classList.contains("interrupted") ? "!" : ""))`); strings.Join(got, ",") != "user,assistant!,assistant" {
			t.Errorf("messages %v", got)
		}
	}

	b.checkConsole()
}

func jsonInt(n int) string { b, _ := json.Marshal(n); return string(b) }

func mustFaux(s string) *bus.FauxScript {
	var f bus.FauxScript
	if err := json.Unmarshal([]byte(s), &f); err != nil {
		panic(err)
	}
	return &f
}

// publishResumedRun stores the events of a run whose first attempt stopped
// mid-answer and whose second resumed it, with a late event of the first
// attempt stored after the second one's run_started, and copies of two
// events of the second (a re-send's, protocol 1.4).
func publishResumedRun(t *testing.T, f *testFleet, id string) {
	t.Helper()
	user := `{"role":"user","content":[{"type":"text","text":"resume me"}],"timestamp":1}`
	assistant := func(text string) string {
		return `{"role":"assistant","content":[{"type":"text","text":` + jsString(text) + `}],"api":"faux","provider":"faux","model":"m","usage":{"input":1,"output":2,"cacheRead":0,"cacheWrite":0,"totalTokens":3,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"stopReason":"stop","timestamp":2}`
	}
	type ev struct {
		attempt int
		seq     uint64
		body    string
	}
	evs := []ev{
		{1, 1, `{"type":"run_started","queue":"default","worker":"w1","attempt":1,"tools":[]}`},
		{1, 2, `{"type":"agent_start"}`},
		{1, 3, `{"type":"message_start","message":` + user + `}`},
		{1, 4, `{"type":"message_end","message":` + user + `}`},
		{1, 5, `{"type":"message_start","message":` + assistant("") + `}`},
		{1, 6, `{"type":"message_update","assistantMessageEvent":{"type":"text_start","contentIndex":0}}`},
		{1, 7, `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"half an ans"}}`},
		{2, 1, `{"type":"run_started","queue":"default","worker":"w2","attempt":2,"tools":[]}`},
		{1, 8, `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"STALE"}}`},
		{1, 9, `{"type":"message_end","message":` + assistant("half an answer, STALE") + `}`},
		{2, 2, `{"type":"run_resumed","attempt":2,"messagesRestored":1}`},
		{2, 3, `{"type":"message_start","message":` + assistant("") + `}`},
		{2, 4, `{"type":"message_update","assistantMessageEvent":{"type":"text_start","contentIndex":0}}`},
		{2, 5, `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"the full answer"}}`},
		{2, 5, `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"the full answer"}}`}, // a stored copy
		{2, 6, `{"type":"message_end","message":` + assistant("the full answer") + `}`},
		{2, 6, `{"type":"message_end","message":` + assistant("the full answer") + `}`}, // a stored copy
		{2, 7, `{"type":"turn_end","messageSeq":6}`},
		{2, 8, `{"type":"run_finished","status":"succeeded","usage":{"input":1,"output":2,"cacheRead":0,"cacheWrite":0,"totalTokens":3,"cost":{"input":0,"output":0,"cacheRead":0,"cacheWrite":0,"total":0}},"cost":0,"turns":1,"durationMs":5}`},
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, e := range evs {
		worker := "w" + strconv.Itoa(e.attempt)
		data := (&bus.Envelope{Run: id, Seq: e.seq, Attempt: e.attempt, Worker: worker, TS: time.Now().UnixMilli(), Event: []byte(e.body)}).AppendJSON(nil)
		if _, err := f.c.JetStream().Publish(ctx, f.c.Names().Events(id), data); err != nil {
			t.Fatal(err)
		}
	}
}
