package main

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// nodePath finds node (NODE overrides). Without it the test skips, loudly,
// except in CI (CI=true), where it fails.
func nodePath(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("NODE"); p != "" {
		return p
	}
	if p, err := exec.LookPath("node"); err == nil {
		return p
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no node binary found and CI=true: install Debian's nodejs (apt-get install nodejs) or set NODE")
	}
	t.Skip("SKIPPED: no node binary found: the console's rendering of model text is NOT checked without a browser " +
		"(apt-get install nodejs, or set NODE=/path/to/node)")
	return ""
}

// renderReport is what testdata/render_inert.mjs saw the pages make of a
// run.
type renderReport struct {
	Sinks  []string `json:"sinks"`
	Errors []string `json:"errors"`
	Run    struct {
		Transcript     string         `json:"transcript"`
		UserText       []string       `json:"userText"`
		Thinking       []string       `json:"thinking"`
		AssistantText  []string       `json:"assistantText"`
		ToolCallLabels []string       `json:"toolCallLabels"`
		Created        map[string]int `json:"created"`
	} `json:"run"`
	Runs struct {
		Rows     []string       `json:"rows"`
		Metadata []string       `json:"metadata"`
		Created  map[string]int `json:"created"`
	} `json:"runs"`
	Markdown struct {
		Text     []string       `json:"text"`
		Hrefs    []string       `json:"hrefs"`
		BadLinks []string       `json:"badLinks"`
		Headings []string       `json:"headings"`
		Strong   []string       `json:"strong"`
		Elements map[string]int `json:"elements"`
		Created  map[string]int `json:"created"`
	} `json:"markdown"`
	Approval struct {
		RunArgs      []string       `json:"runArgs"`
		Banner       []string       `json:"banner"`
		EditBox      []string       `json:"editBox"`
		Buttons      []string       `json:"buttons"`
		Created      map[string]int `json:"created"`
		QueueArgs    []string       `json:"queueArgs"`
		QueueEditBox []string       `json:"queueEditBox"`
		QueueCreated map[string]int `json:"queueCreated"`
	} `json:"approval"`
}

// hostileMarkdown is an answer whose markdown carries HTML and scripts in
// every place a renderer might let them through.
const hostileMarkdown = "# Title <b>bold</b>\n\n<img src=x onerror=\"window.__xss=2\">\n\n" +
	"<div onmouseover=\"window.__xss=3\"><script>window.__xss=4</script></div>\n\n" +
	"[click](javascript:window.__xss=5) [case](JaVaScRiPt:alert(1)) [data](data:text/html,<script>alert(1)</script>) " +
	"[tab](java\tscript:alert(1)) ![pic](javascript:alert(1)) ![pic2](x onerror=alert(1))\n\n" +
	"**<script>alert(1)</script>** and [ok](https://example.com/ok) <https://example.com/auto>\n"

// The console's rule (static/app.js): what comes from a run is put into
// the page as text, never as HTML. TestBrowser checks it in Chromium and
// skips without one outside CI; this checks it without a browser: the page
// script the console serves runs in node on a minimal DOM whose HTML
// sinks parse nothing and report every use (testdata/render_inert.mjs),
// showing a run whose prompt, thinking, text, tool call and metadata are
// HTML. The run page and the runs page must show that HTML as text, in
// the blocks it belongs to, and create no element of it.
func TestConsoleShowsHostileModelTextAsTextWithoutABrowser(t *testing.T) {
	node := nodePath(t)
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{AllowControl: true})
	const id = "node-xss"
	xss := `<script>window.__xss=1</script><img src=x onerror="window.__xss=2"><b>bold</b>`
	f.submit(&bus.RunRequest{ID: id, Prompt: xss, Metadata: map[string]string{"note": xss},
		Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{
			{Type: agent.ContentThinking, Thinking: xss}, agent.Text(xss), agent.ToolCall("call-1", xss, map[string]any{"html": xss})},
			StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text(xss + " again")}}}}})
	c.waitRun(t, id, func(r bus.RunRecord) bool { return r.Finished() })
	f.submit(&bus.RunRequest{ID: "node-md", Prompt: "markdown", Faux: &bus.FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text(hostileMarkdown)}}}}})
	c.waitRun(t, "node-md", func(r bus.RunRecord) bool { return r.Finished() })
	f.submit(gatedRun("node-waiting", xss))
	waitWaiting(t, c, 1)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "--experimental-vm-modules", "testdata/render_inert.mjs", c.URL, id, "node-md", "node-waiting")
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		t.Fatalf("node testdata/render_inert.mjs: %v\n%s%s", err, stdout.String(), stderr.String())
	}
	t.Logf("node rendered both pages in %s", time.Since(start).Round(time.Millisecond))
	var rep renderReport
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
		t.Fatalf("report: %v\n%s\n%s", err, stdout.String(), stderr.String())
	}

	for i, s := range rep.Sinks {
		if i == 10 {
			t.Errorf("... and %d more uses of HTML sinks", len(rep.Sinks)-i)
			break
		}
		t.Errorf("the page put text into an HTML sink: %s", s)
	}
	for _, e := range rep.Errors {
		t.Errorf("the page failed: %s", e)
	}
	want := map[string]struct {
		got, want []string
	}{
		"user prompt":               {rep.Run.UserText, []string{xss}},
		"thinking":                  {rep.Run.Thinking, []string{xss}},
		"metadata on the runs page": {rep.Runs.Metadata, []string{"note=" + xss}},
	}
	for what, w := range want {
		if !slices.Equal(w.got, w.want) {
			t.Errorf("%s shown as %q, want the text %q", what, w.got, w.want)
		}
	}
	// The first answer's text, the tool's error result (it names the
	// tool) and the second answer's text.
	if a := rep.Run.AssistantText; len(a) != 3 || a[0] != xss || !strings.Contains(a[1], xss) || a[2] != xss+" again" {
		t.Errorf("assistant text blocks shown as %q, want the text %q, a tool result naming it, and %q", a, xss, xss+" again")
	}
	if l := rep.Run.ToolCallLabels; len(l) == 0 || l[0] != "tool call · "+xss {
		t.Errorf("tool call labels %q, want the first one %q", l, "tool call · "+xss)
	}
	if len(rep.Runs.Rows) != 1 || rep.Runs.Rows[0] != id {
		t.Errorf("runs page rows %q, want %s's", rep.Runs.Rows, id)
	}
	for page, created := range map[string]map[string]int{"run page": rep.Run.Created, "runs page": rep.Runs.Created} {
		for _, tag := range []string{"script", "img", "b"} {
			if created[tag] > 0 {
				t.Errorf("the %s created %d <%s> elements", page, created[tag], tag)
			}
		}
	}
	// Markdown: elements for the markdown, text for the HTML, links only
	// to https.
	md := rep.Markdown
	if len(md.Text) != 1 || !strings.Contains(md.Text[0], `<img src=x onerror="window.__xss=2">`) ||
		!strings.Contains(md.Text[0], `<div onmouseover="window.__xss=3"><script>window.__xss=4</script></div>`) {
		t.Errorf("markdown text %q: the HTML must be shown as text", md.Text)
	}
	if !slices.Equal(md.Hrefs, []string{"https://example.com/ok", "https://example.com/auto"}) {
		t.Errorf("markdown links %q: only the https ones may be links", md.Hrefs)
	}
	if !slices.Equal(md.BadLinks, []string{"click", "case", "data", "image: pic"}) {
		t.Errorf("links not followed %q", md.BadLinks)
	}
	// A blank inside a destination makes no link (CommonMark): the text.
	for _, text := range []string{"[tab](java\tscript:alert(1))", "![pic2](x onerror=alert(1))"} {
		if len(md.Text) != 1 || !strings.Contains(md.Text[0], text) {
			t.Errorf("markdown text %q: want %q shown as text", md.Text, text)
		}
	}
	if !slices.Equal(md.Headings, []string{"Title <b>bold</b>"}) || !slices.Equal(md.Strong, []string{"<script>alert(1)</script>"}) {
		t.Errorf("markdown heading %q, strong %q", md.Headings, md.Strong)
	}
	if want := map[string]int{"h1": 1, "strong": 1, "a": 2, "img": 0, "script": 0, "div": 0, "b": 0}; !maps.Equal(md.Elements, want) {
		t.Errorf("markdown elements %v, want %v", md.Elements, want)
	}
	// Approval: the call's hostile arguments are text on the run page, in
	// its banner's edit box, and on the Approvals page.
	ap := rep.Approval
	wantArgs := `"expression": "` + strings.ReplaceAll(xss, `"`, `\"`) + `"`
	for what, got := range map[string][]string{"run page arguments": ap.RunArgs, "edit box": ap.EditBox, "approvals page arguments": ap.QueueArgs, "approvals page edit box": ap.QueueEditBox} {
		if len(got) != 1 || !strings.Contains(got[0], wantArgs) {
			t.Errorf("%s %q, want the text %s", what, got, wantArgs)
		}
	}
	if len(ap.Banner) != 1 || !strings.HasPrefix(ap.Banner[0], "waiting for approval calculator") {
		t.Errorf("banner %q", ap.Banner)
	}
	if !slices.Equal(ap.Buttons, []string{"Approve", "Deny…", "Edit arguments…", "Deny", "Approve with these arguments"}) {
		t.Errorf("banner buttons %q", ap.Buttons)
	}
	for page, created := range map[string]map[string]int{"markdown run page": md.Created, "waiting run page": ap.Created, "approvals page": ap.QueueCreated} {
		for _, tag := range []string{"script", "img", "b"} {
			if created[tag] > 0 {
				t.Errorf("the %s created %d <%s> elements", page, created[tag], tag)
			}
		}
	}
	if t.Failed() {
		t.Logf("run page transcript text:\n%s", rep.Run.Transcript)
	}
}
