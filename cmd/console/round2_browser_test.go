package main

import (
	"context"
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// Browser tests of the console's second round (issue 61): approvals, the
// paged runs list, the run page as a timeline, the fleet's history and the
// new-run pick-lists. Each runs the console on a real fleet in Chromium.

// click clicks the first element matching a CSS selector (querySelector
// syntax, within an optional scope expression).
func click(sel string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](`document.querySelector(` + jsString(sel) + `).click()`)
}

// setValue sets an input's value and tells the page (input and change).
func setValue(sel, value string) chromedp.Action[chromedp.Void] {
	return chromedp.Evaluate[chromedp.Void](`(() => { const e = document.querySelector(` + jsString(sel) + `); e.value = ` + jsString(value) +
		`; e.dispatchEvent(new Event("input")); e.dispatchEvent(new Event("change")); })()`)
}

// TestBrowserApprovals: a call that waits for approval shows a banner on
// the run page with Approve, Deny (with a reason) and Edit arguments; an
// edit the tool's schema refuses is shown inline and nothing is sent, one
// it takes runs and is shown as what ran; the Approvals page lists every
// waiting call of the fleet, oldest first, with tool, arguments and
// expiry, and answers too; a read-only console shows the queue without
// buttons. Arguments holding HTML are shown as text.
func TestBrowserApprovals(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{AllowControl: true, ApproverName: "browser-tester"})
	ro := newConsole(t, f, serverConfig{})
	b := newBrowser(t, c.URL)
	xss := `<img src=x onerror="window.__xss=5"><script>window.__xss=6</script>`
	runs := []*bus.RunRequest{gatedRun("ba-approve", "2*3"), gatedRun("ba-deny", "1/0"), gatedRun("ba-edit", "1+1"), gatedRun("ba-xss", xss)}
	for i, r := range runs {
		f.submit(r)
		waitWaiting(t, c, i+1) // one after the other: oldest first is this order
	}

	page := b.tab()
	b.open(page, "/approvals")
	b.do(page, "the approvals page lists the four calls", wait(`document.querySelectorAll("#approvals-body tr[data-run]").length === 4`))
	if got := eval[[]string](b, page, `[...document.querySelectorAll("#approvals-body tr[data-run]")].map((r) => r.dataset.run)`); !slices.Equal(got, []string{"ba-approve", "ba-deny", "ba-edit", "ba-xss"}) {
		t.Errorf("approvals, oldest first: %v", got)
	}
	row := `document.querySelector('#approvals-body tr[data-run="ba-edit"]')`
	if got := eval[[]string](b, page, `[...`+row+`.children].map((td) => td.textContent)`); len(got) != 6 || got[1] != "calculator" ||
		!strings.Contains(got[2], `"expression": "1+1"`) || !strings.Contains(got[4], "in 59m") || !strings.Contains(got[3], "ago") {
		t.Errorf("the ba-edit row: %q", got)
	}

	// Approve from the run page.
	run := b.tab()
	b.open(run, "/runs/ba-approve")
	b.do(run, "approve", wait(`document.querySelector('.toolcall[data-call="c1"] .approval .approve')`),
		wait(`document.getElementById("waiting-count") !== null`),
		click(`.approval .approve`),
		wait(`(document.querySelector(".approval-outcome") || {}).textContent?.startsWith("approved by browser-tester")`),
		wait(`document.getElementById("status").dataset.state === "succeeded"`))
	if got := eval[string](b, run, `document.querySelector(".toolcall .results").textContent`); !strings.Contains(got, "6") {
		t.Errorf("approved call's result: %q", got)
	}
	if eval[bool](b, run, `document.querySelector(".approval") !== null`) {
		t.Error("the banner stays after the answer")
	}

	// Deny with a reason.
	b.open(run, "/runs/ba-deny")
	b.do(run, "deny", wait(`document.querySelector(".approval .deny")`),
		click(`.approval .deny`),
		setValue(`.approval .deny-reason`, "not during the freeze"),
		click(`.approval .deny-send`),
		wait(`(document.querySelector(".approval-outcome") || {}).textContent?.startsWith("denied by browser-tester: not during the freeze")`),
		wait(`document.getElementById("status").dataset.state === "succeeded"`))
	if got := eval[string](b, run, `document.querySelector(".toolcall .results").textContent`); !strings.Contains(got, "denied by browser-tester: not during the freeze") {
		t.Errorf("denied call's result: %q", got)
	}

	// Edit: not JSON, then arguments the schema refuses (shown inline,
	// nothing sent, the call still waits), then good ones.
	b.open(run, "/runs/ba-edit")
	b.do(run, "edit: not JSON", wait(`document.querySelector(".approval .edit")`),
		click(`.approval .edit`),
		setValue(`.approval .edit-args`, `{"expression": `),
		click(`.approval .edit-send`),
		wait(`document.querySelector(".approval .schema-error").textContent.startsWith("Not JSON")`))
	b.do(run, "edit: refused by the schema",
		setValue(`.approval .edit-args`, `{"expr": "7*6"}`),
		click(`.approval .edit-send`),
		wait(`document.querySelector(".approval .schema-error").textContent.includes("expression")`))
	if eval[bool](b, run, `document.querySelector(".approval.sent") !== null || document.querySelector(".approval-outcome") !== null`) {
		t.Error("an edit the schema refuses was sent")
	}
	var p approvalsPage
	if c.getJSON(t, "/api/approvals", &p); !slices.ContainsFunc(p.Calls, func(c bus.PendingCall) bool { return c.Run == "ba-edit" }) {
		t.Error("ba-edit does not wait any more after a refused edit")
	}
	b.do(run, "edit: taken",
		setValue(`.approval .edit-args`, `{"expression": "7*6"}`),
		click(`.approval .edit-send`),
		wait(`(document.querySelector(".approval-outcome") || {}).textContent?.startsWith("approved by browser-tester")`),
		wait(`document.querySelector(".edited-args") !== null`),
		wait(`document.getElementById("status").dataset.state === "succeeded"`))
	if got := eval[[]string](b, run, `[document.querySelector(".edited-label").textContent, document.querySelector(".edited-args").textContent, document.querySelector(".args.superseded").textContent, document.querySelector(".toolcall .results").textContent]`); !strings.Contains(got[0], "ran with the arguments browser-tester edited") ||
		!strings.Contains(got[1], `"expression": "7*6"`) || !strings.Contains(got[2], `"expression": "1+1"`) || !strings.Contains(got[3], "42") {
		t.Errorf("edited call: %q", got)
	}

	// The read-only console shows the one left without buttons, as text.
	robr := newBrowser(t, ro.URL)
	rpage := robr.tab()
	robr.open(rpage, "/approvals")
	robr.do(rpage, "read-only approvals", wait(`document.querySelectorAll("#approvals-body tr[data-run]").length === 1`))
	if got := eval[[]int](robr, rpage, `[document.querySelectorAll("#approvals-body button").length, document.querySelectorAll("#approvals-body .approval").length]`); got[0] != 0 || got[1] != 1 {
		t.Errorf("read-only approvals page: %d buttons, %d banners", got[0], got[1])
	}
	robr.open(rpage, "/runs/ba-xss")
	robr.do(rpage, "read-only banner", wait(`document.querySelector(".approval") !== null`))
	if n := eval[int](robr, rpage, `document.querySelectorAll(".approval button").length`); n != 0 {
		t.Errorf("read-only run page: %d buttons on the banner", n)
	}
	// Arguments holding HTML: text in the page, in the approvals page's
	// arguments and in the edit box.
	b.do(page, "the approvals page follows", wait(`document.querySelectorAll("#approvals-body tr[data-run]").length === 1`))
	for _, tab := range []context.Context{page, rpage} {
		br := b
		if tab == rpage {
			br = robr
		}
		checks := map[string]string{
			"no img":           `document.querySelectorAll("img").length === 0`,
			"two scripts":      `document.querySelectorAll("script").length === 2`,
			"flag not set":     `window.__xss === undefined`,
			"arguments shown":  `document.body.textContent.includes(` + jsString(`"expression": "<img src=x onerror=\"window.__xss=5\">`) + `)`,
			"tool name intact": `document.body.textContent.includes("calculator")`,
		}
		for name, expr := range checks {
			if !eval[bool](br, tab, expr) {
				t.Errorf("%s: %s is false", name, expr)
			}
		}
	}
	if got := eval[string](b, page, `document.querySelector('#approvals-body tr[data-run="ba-xss"] .edit-args').value`); !strings.Contains(got, `onerror=\"window.__xss=5\"`) {
		t.Errorf("edit box of the hostile call: %q", got)
	}
	// Answered from the Approvals page: the row goes.
	b.do(page, "approve from the approvals page", click(`#approvals-body tr[data-run="ba-xss"] .approve`),
		wait(`document.querySelectorAll("#approvals-body tr[data-run]").length === 0`))
	c.waitRun(t, "ba-xss", func(r bus.RunRecord) bool { return r.Finished() })
	b.checkConsole()
	robr.checkConsole()
}

// TestBrowserRunsPaging: 10,000 runs (records written straight into the
// bucket, in two batches an instant apart), paged through 500 at a time
// with Older and back with Newer and the browser's Back, every run once
// in order; filters in the URL (opened as a shared link, and changed on
// the page); a time range; and a rare filter that stops after a bounded
// scan and says how far it read.
func TestBrowserRunsPaging(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	f := newTestFleet(t)
	fillRecords(t, f.Fleet, 0, 5000)
	mark := time.Now() // after the first batch is stored, before the second
	fillRecords(t, f.Fleet, 5000, 5000)
	c := newConsole(t, f, serverConfig{ListScan: 2000})
	b := newBrowser(t, c.URL)
	page := b.tab()
	b.open(page, "/?limit=500")
	const rows = `[...document.querySelectorAll("#runs-body tr[data-run]")].map((r) => r.dataset.run)`
	b.do(page, "the count", wait(`document.getElementById("runs-count").textContent === "500 shown · 10,000 records in all"`))
	var all []string
	var firsts []string
	for p := 1; ; p++ {
		b.do(page, fmt.Sprintf("page %d", p), wait(`document.querySelectorAll("#runs-body tr[data-run]").length > 0 && document.getElementById("page-no").textContent === `+jsString(map[bool]string{true: "newest", false: fmt.Sprintf("page %d", p)}[p == 1])))
		ids := eval[[]string](b, page, rows)
		all = append(all, ids...)
		firsts = append(firsts, ids[0])
		if eval[bool](b, page, `document.getElementById("page-older").hidden`) {
			break
		}
		if p > 30 {
			t.Fatal("more than 30 pages")
		}
		b.do(page, "older", click(`#page-older`), wait(`document.getElementById("runs-body").dataset.before !== ""`),
			wait(`document.querySelector("#runs-body tr[data-run]") !== null && (document.querySelector("#runs-body tr[data-run]") || {dataset: {}}).dataset.run !== `+jsString(ids[0])))
	}
	if len(all) != 10000 || len(firsts) != 20 {
		t.Fatalf("paged %d runs in %d pages, want 10,000 in 20", len(all), len(firsts))
	}
	for i, id := range all {
		if want := fmt.Sprintf("run-%07d", 9999-i); id != want {
			t.Fatalf("run %d of the pages is %s, want %s", i, id, want)
		}
	}
	if !strings.Contains(eval[string](b, page, `location.search`), "before=") {
		t.Error("the page's cursor is not in the URL")
	}
	b.do(page, "newer", click(`#page-newer`), wait(`(document.querySelector("#runs-body tr[data-run]") || {dataset: {}}).dataset.run === `+jsString(firsts[18])))
	b.do(page, "back", chromedp.Evaluate[chromedp.Void](`history.back()`), wait(`(document.querySelector("#runs-body tr[data-run]") || {dataset: {}}).dataset.run === `+jsString(firsts[19])))

	// A shared link: the filters come from the URL, and the rows match.
	b.open(page, "/?state=failed&tenant=acme&model=openai%2Fgpt-4o-mini&meta=team%3Dsupport&limit=25")
	b.do(page, "filtered by the URL", wait(`document.querySelectorAll("#runs-body tr[data-run]").length === 25`))
	if got := eval[[]string](b, page, `["f-state", "f-tenant", "f-model", "f-meta", "f-limit"].map((id) => document.getElementById(id).value)`); !slices.Equal(got, []string{"failed", "acme", "openai/gpt-4o-mini", "team=support", "25"}) {
		t.Errorf("filter inputs from the URL: %q", got)
	}
	if bad := eval[[]string](b, page, `[...document.querySelectorAll("#runs-body tr[data-run]")].filter((r) => r.dataset.state !== "failed" || r.children[4].textContent !== "acme" || r.children[3].textContent !== "openai/gpt-4o-mini").map((r) => r.dataset.run)`); len(bad) > 0 {
		t.Errorf("rows not matching the filters: %v", bad)
	}
	b.do(page, "change a filter on the page", setValue("#f-tenant", "globex"),
		wait(`location.search.includes("tenant=globex") && [...document.querySelectorAll("#runs-body tr[data-run]")].every((r) => r.children[4].textContent === "globex")`))

	// The time range: written before the mark, then since it.
	until := mark.UTC().Format(time.RFC3339Nano)
	b.open(page, "/?limit=500&until="+until)
	b.do(page, "until the mark", wait(`(document.querySelector("#runs-body tr[data-run]") || {dataset: {}}).dataset.run === "run-0004999"`))
	b.open(page, "/?limit=500&since="+until)
	b.do(page, "since the mark", wait(`(document.querySelector("#runs-body tr[data-run]") || {dataset: {}}).dataset.run === "run-0009999"`))
	for p := 1; p < 10; p++ {
		if eval[bool](b, page, `document.getElementById("page-older").hidden`) {
			break
		}
		b.do(page, "older since the mark", click(`#page-older`), wait(`document.getElementById("page-no").textContent === "page `+fmt.Sprint(p+1)+`"`))
	}
	if got := eval[string](b, page, `[...document.querySelectorAll("#runs-body tr[data-run]")].at(-1).dataset.run`); got != "run-0005000" {
		t.Errorf("the last run since the mark: %s", got)
	}

	// A filter nothing matches: a bounded scan, said so, and further on
	// demand.
	b.open(page, "/?meta=team%3Dnobody")
	b.do(page, "bounded scan", wait(`document.getElementById("runs-count").dataset.truncated === "true"`))
	first := eval[string](b, page, `document.getElementById("runs-count").textContent`)
	if !strings.Contains(first, "scanned ") || !strings.Contains(first, "of 10,000 records") || eval[string](b, page, `document.getElementById("page-older").textContent`) != "Scan further →" {
		t.Errorf("bounded scan says %q", first)
	}
	b.do(page, "scan further", click(`#page-older`), wait(`document.getElementById("page-no").textContent === "page 2"`))
	b.checkConsole()
}

// TestBrowserRunTimeline: the run page as a timeline. A run of a model
// with prices, two turns (a calculator call, then a markdown report):
// a separator before each turn with its time, duration, tokens and cost
// and a waterfall of its model call and tool call (start and duration);
// "streaming" only on the message that streams; cost and tokens per
// message, per turn and in total; the markdown rendered as elements.
// Hostile markdown (an <img onerror>, javascript: and data: links, raw
// HTML blocks) is shown as text and makes no element of its own. A live
// run's text is followed to the end of the page until the reader scrolls
// up; the button follows again.
func TestBrowserRunTimeline(t *testing.T) {
	// Not parallel: it waits for the report while it streams (2-3 s), and
	// beside the other browsers on 2 loaded cores the page came too late.
	chromiumPath(t)
	report := "## Report\n\nThe answer is **84**, from the *calculator*.\n\n- twelve times seven\n- checked twice\n\n" +
		"| factor | value |\n|---|--:|\n| a | 12 |\n| b | 7 |\n\nSee `calc` and [the docs](https://example.com/docs).\n\n```\nraw <b>code</b>\n```\n"
	hostile := "# Hostile\n\n<img src=x onerror=\"window.__xss=7\">\n\n" +
		"[click](javascript:window.__xss=8) [x](JaVaScRiPt:alert(1)) [d](data:text/html,<script>alert(1)</script>) [sp]( javascript:alert(1)) " +
		"![pic](javascript:alert(1)) ![pic2](https://example.com/a.png)\n\n" +
		"<div onmouseover=\"window.__xss=9\"><script>window.__xss=10</script></div>\n\n<https://ok.example/path> and **<b>bold</b>**\n\n" +
		"inline <img src=x onerror=\"window.__xss=11\"> <javascript:window.__xss=12> &lt;script&gt;window.__xss=13&lt;/script&gt;\n\n" +
		"- [x] <img src=x onerror=\"window.__xss=14\">\n  - | <img src=x onerror=\"window.__xss=15\"> |\n    |---|\n    | [t](javascript:window.__xss=16) |\n"
	long := strings.Repeat("A line of the long answer, streamed slowly: the page must follow it.\n\n", 45)
	model := newPricedModel(100, scripted(map[string][]agent.ScriptedResponse{
		"report": {{Content: []agent.Content{agent.Text("Let me compute that."), agent.ToolCall("calc-1", "calculator", map[string]any{"expression": "12*7"})}, StopReason: agent.StopReasonToolUse},
			{Content: []agent.Content{agent.Text(report)}}},
		"hostile": {{Content: []agent.Content{agent.Text(hostile)}}},
		"long":    {{Content: []agent.Content{agent.Text(long)}}},
	}), "writer")
	f := newTestFleetWith(t, func(string) worker.Config {
		return worker.Config{Providers: map[string]worker.Provider{"priced": model}}
	})
	c := newConsole(t, f, serverConfig{})
	b := newBrowser(t, c.URL)
	priced := &bus.ModelRef{Provider: "priced", ID: "writer"}
	// The page is open before the run starts: the report streams for 2-3
	// s, and a page opened after the submit came too late on 2 loaded cores.
	page := b.tab()
	b.open(page, "/runs/tl-report")
	f.submit(&bus.RunRequest{ID: "tl-report", Prompt: "report", Model: priced, Tools: []string{"calculator"}})
	b.do(page, "the report streams", wait(`document.querySelectorAll("#transcript .msg-assistant").length === 2 && document.querySelectorAll("#transcript .msg-assistant")[1].querySelector(".streaming") !== null`))
	if n := eval[int](b, page, `document.querySelectorAll("#transcript .msg-assistant")[0].querySelectorAll(".streaming").length`); n != 0 {
		t.Error("the finished first message still says streaming")
	}
	b.do(page, "the run ends", wait(`document.getElementById("transcript").dataset.ended === "true" && document.getElementById("status").dataset.state === "succeeded"`))
	if n := eval[int](b, page, `document.querySelectorAll(".streaming").length`); n != 0 {
		t.Errorf("%d messages say streaming after the run", n)
	}
	order := eval[[]string](b, page, `[...document.querySelectorAll("#transcript > .turn-sep, #transcript > .msg")].map((e) => e.classList.contains("turn-sep") ? "turn " + e.dataset.turn : e.dataset.role)`)
	if strings.Join(order, ",") != "turn 1,user,assistant,turn 2,assistant" {
		t.Errorf("timeline %v, want a separator before each turn", order)
	}
	clock := regexp.MustCompile(`^\d\d:\d\d:\d\d\.\d{3}$`)
	dur := regexp.MustCompile(`^\d+(\.\d)? (ms|s)$`)
	rows := eval[[][]string](b, page, `[...document.querySelectorAll('.turn-sep[data-turn="1"] .wf-row')].map((r) => [r.dataset.kind, r.querySelector(".wf-label").textContent, r.querySelector(".wf-when").textContent, r.querySelector(".wf-dur").textContent, r.querySelector(".bar").style.width])`)
	if len(rows) != 2 || rows[0][0] != "model" || rows[1][0] != "tool" || rows[1][1] != "calculator" {
		t.Fatalf("turn 1's waterfall: %q", rows)
	}
	for _, r := range rows {
		if !clock.MatchString(r[2]) || !dur.MatchString(r[3]) || !strings.HasSuffix(r[4], "%") {
			t.Errorf("waterfall row %q: want a start time, a duration and a bar", r)
		}
	}
	stats := regexp.MustCompile(`^\d+(\.\d)? (ms|s) · [\d,]+ tokens · \$0\.\d+$`)
	for _, turn := range []string{"1", "2"} {
		if got := eval[string](b, page, `document.querySelector('.turn-sep[data-turn="`+turn+`"] .turn-stats').textContent`); !stats.MatchString(got) {
			t.Errorf("turn %s says %q, want its duration, tokens and cost", turn, got)
		}
	}
	if got := eval[string](b, page, `document.querySelector(".toolcall .timing").textContent`); !regexp.MustCompile(`^started \d\d:\d\d:\d\d\.\d{3} · \d+(\.\d)? (ms|s)$`).MatchString(got) {
		t.Errorf("tool call timing %q", got)
	}
	if got := eval[[]string](b, page, `[...document.querySelectorAll(".msg-assistant .msg-meta .cost")].map((e) => e.textContent)`); len(got) != 2 || !strings.HasPrefix(got[0], "$0.") || !strings.HasPrefix(got[1], "$0.") {
		t.Errorf("cost per message: %q", got)
	}
	var rec bus.RunRecord
	c.getJSON(t, "/api/runs/tl-report", &rec)
	if got := eval[string](b, page, `document.getElementById("total-cost").textContent`); rec.Cost <= 0 || !strings.HasPrefix(got, "cost $0.") {
		t.Errorf("total cost %q (record %v)", got, rec.Cost)
	}
	if got := eval[string](b, page, `document.getElementById("total-tokens").textContent`); got != fmt.Sprintf("%s tokens", commas(rec.Usage.TotalTokens)) || rec.Usage.TotalTokens == 0 {
		t.Errorf("total tokens %q, record %d", got, rec.Usage.TotalTokens)
	}
	md := `document.querySelectorAll("#transcript .msg-assistant")[1].querySelector(".md")`
	for name, expr := range map[string]string{
		"heading":        md + `.querySelector("h2").textContent === "Report"`,
		"strong":         md + `.querySelector("strong").textContent === "84"`,
		"emphasis":       md + `.querySelector("em").textContent === "calculator"`,
		"list":           md + `.querySelectorAll("ul > li").length === 2`,
		"table":          `[...` + md + `.querySelectorAll("table td")].map((c) => c.textContent).join(",") === "a,12,b,7" && ` + md + `.querySelector("td.align-right") !== null`,
		"link":           md + `.querySelector('a[href="https://example.com/docs"]').rel.includes("noopener")`,
		"inline code":    md + `.querySelector("p code").textContent === "calc"`,
		"code block":     md + `.querySelector("pre.md-code").textContent === "raw <b>code</b>"`,
		"no html parsed": `document.querySelectorAll("#transcript b").length === 0`,
	} {
		if !eval[bool](b, page, expr) {
			t.Errorf("markdown %s: %s is false", name, expr)
		}
	}

	// Hostile markdown.
	f.submit(&bus.RunRequest{ID: "tl-hostile", Prompt: "hostile", Model: priced})
	b.open(page, "/runs/tl-hostile")
	b.do(page, "hostile markdown", wait(`document.getElementById("transcript").dataset.ended === "true"`))
	for name, expr := range map[string]string{
		"no img":                   `document.querySelectorAll("img").length === 0`,
		"no script":                `document.querySelectorAll("script").length === 2`,
		"no div of the text":       `document.querySelectorAll("#transcript [onmouseover], #transcript [onerror], #transcript .md div").length === 0`,
		"no javascript: or data:":  `[...document.querySelectorAll("a")].every((a) => a.protocol === "http:" || a.protocol === "https:")`,
		"bad links are text":       `[...document.querySelectorAll(".md-badlink")].map((e) => e.textContent).join(",") === "click,x,d,sp,image: pic,javascript:window.__xss=12,t"`,
		"entities are text":        `document.querySelector(".md").textContent.includes("<script>window.__xss=13</script>")`,
		"task list, nested table":  `document.querySelector(".md li.md-task input[type=checkbox]:checked:disabled") !== null && document.querySelector(".md li li table td .md-badlink") !== null`,
		"safe autolink":            `document.querySelector('.md a[href="https://ok.example/path"]') !== null`,
		"image not loaded, linked": `document.querySelector('.md a.md-image[href="https://example.com/a.png"]').textContent === "image: pic2"`,
		"html shown as text":       `document.querySelector(".md").textContent.includes('<img src=x onerror="window.__xss=7">') && document.querySelector(".md").textContent.includes('<div onmouseover="window.__xss=9"><script>window.__xss=10</script></div>')`,
		"bold html is text":        `document.querySelector(".md strong").textContent === "<b>bold</b>"`,
		"flag not set":             `window.__xss === undefined`,
	} {
		if !eval[bool](b, page, expr) {
			t.Errorf("hostile markdown, %s: %s is false", name, expr)
		}
	}

	// The node test's hostile markdown cases (TestMarkdownShowsHTMLAsText),
	// rendered into the page by its own renderMarkdown in Chromium, their
	// payloads setting a flag: nothing runs, and only the elements,
	// attributes and links markdown needs are made.
	var texts []string
	badLinks := 0
	for _, c := range mdHostileCases {
		texts = append(texts, strings.ReplaceAll(c.text, "alert(1)", "window.__xss=1"))
		badLinks += strings.Count(c.want, "md-badlink")
	}
	textsJSON, _ := json.Marshal(texts)
	n := eval[int](b, page, `(() => { const s = document.createElement("section"); s.id = "md-cases"; for (const t of `+string(textsJSON)+
		`) s.append(renderMarkdown(t, document)); document.getElementById("main").append(s); return s.querySelectorAll(".md").length; })()`)
	if n != len(texts) {
		t.Fatalf("%d of %d markdown cases rendered", n, len(texts))
	}
	b.do(page, "time for handlers to run", chromedp.Sleep(300*time.Millisecond))
	const cases = `[...document.querySelectorAll("#md-cases *")]`
	for name, expr := range map[string]string{
		"flag not set": `window.__xss === undefined`,
		"only markdown's elements": cases + `.every((e) => ["div", "p", "h1", "h2", "h3", "h4", "h5", "h6", "strong", "em", "del", "code", "pre", "br", "hr", "ul", "ol", "li", ` +
			`"blockquote", "table", "thead", "tbody", "tr", "th", "td", "a", "span", "input"].includes(e.localName))`,
		"only markdown's attributes": cases + `.every((e) => [...e.attributes].every((a) => ["class", "href", "rel", "target", "title", "type", "checked", "disabled", "start", "data-lang"].includes(a.name)))`,
		"links only to http(s)":      `[...document.querySelectorAll("#md-cases a")].every((a) => ["http:", "https:"].includes(a.protocol) && a.rel === "noopener noreferrer nofollow" && a.target === "_blank")`,
		"checkboxes disabled":        `[...document.querySelectorAll("#md-cases input")].every((e) => e.type === "checkbox" && e.disabled)`,
		"script urls shown as text":  `document.querySelectorAll("#md-cases .md-badlink").length === ` + fmt.Sprint(badLinks),
	} {
		if !eval[bool](b, page, expr) {
			t.Errorf("markdown cases in Chromium, %s: %s is false", name, expr)
		}
	}

	// Following a live run's text.
	f.submit(&bus.RunRequest{ID: "tl-long", Prompt: "long", Model: priced})
	b.open(page, "/runs/tl-long")
	const gap = `(document.documentElement.scrollHeight - (window.scrollY + window.innerHeight))`
	const textLen = `document.getElementById("transcript").textContent.length`
	b.do(page, "followed to the end", wait(`document.documentElement.scrollHeight > window.innerHeight + 300 && `+gap+` <= 60 && window.scrollY > 200`))
	before := eval[int](b, page, textLen)
	b.do(page, "the reader scrolls up", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`),
		wait(textLen+` > `+fmt.Sprint(before+600)))
	if got := eval[[]bool](b, page, `[window.scrollY < 50, !document.getElementById("follow").hidden]`); !got[0] || !got[1] {
		t.Errorf("after the reader scrolled up: at the top %v, follow button shown %v", got[0], got[1])
	}
	if eval[bool](b, page, `document.getElementById("transcript").dataset.ended === "true"`) {
		t.Fatal("the run ended before the check: make it longer")
	}
	b.do(page, "follow again", click("#follow"), wait(gap+` <= 60 && window.scrollY > 200`))
	b.do(page, "the end", wait(`document.getElementById("transcript").dataset.ended === "true"`), wait(gap+` <= 60`))
	b.checkConsole()
}

func commas(n int) string {
	s := fmt.Sprint(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}

// TestBrowserFleetAndNewRun: the Fleet page draws each queue's throughput
// and depth over the history the console sampled, the workers' last-seen
// times and the tools grouped by source (built-in and a NATS tool
// service); the New run page offers the presence's models, tools (by
// source) and queues, and what is picked is what the run gets.
func TestBrowserFleetAndNewRun(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	model := newPricedModel(0, func(prompt string, turn int, _ agent.Context) agent.ScriptedResponse {
		return agent.ScriptedResponse{Content: []agent.Content{agent.Text("Answer to " + prompt)}}
	}, "writer", "analyst")
	var src toolsource.Source
	f := newTestFleetWith(t, func(url string) worker.Config {
		src = textService(t, url)
		return worker.Config{Providers: map[string]worker.Provider{"priced": model}, ToolSources: []toolsource.Source{src}, DefaultModel: "priced/writer"}
	})
	c := newConsole(t, f, serverConfig{AllowControl: true, SampleEvery: 250 * time.Millisecond})
	b := newBrowser(t, c.URL)
	for i := range 6 {
		f.submit(&bus.RunRequest{ID: fmt.Sprintf("fl-%d", i), Prompt: "question " + fmt.Sprint(i), Model: &bus.ModelRef{Provider: "priced", ID: "writer"}})
	}
	page := b.tab()
	b.open(page, "/fleet")
	b.do(page, "history and presence",
		wait(`Number((document.querySelector('#queues tr[data-queue="default"] td[data-finished]') || {dataset: {}}).dataset.finished) === 6`),
		wait(`Number(document.querySelector('#queues tr[data-queue="default"] td.chart').dataset.points) >= 4`),
		wait(`document.querySelector('.source[data-source="service:text"]') !== null`))
	if got := eval[[]string](b, page, `[...document.querySelectorAll(".source")].map((s) => s.dataset.source + ": " + [...s.querySelectorAll(".chip")].map((c) => c.textContent).join(" "))`); len(got) != 2 ||
		!strings.HasPrefix(got[0], "builtin: calculator current_time") || got[1] != "service:text: text__count_words text__upper" {
		t.Errorf("tools by source: %q", got)
	}
	if got := eval[string](b, page, `document.querySelector('#workers tr[data-worker="test-worker-1"] .seen').textContent`); !strings.HasSuffix(got, " ago") {
		t.Errorf("worker last seen %q", got)
	}
	if got := eval[string](b, page, `document.querySelector("#tile-hour .value").textContent`); got != "6" {
		t.Errorf("finished in the last hour: %q", got)
	}
	if n := eval[int](b, page, `document.querySelectorAll('#queues tr[data-queue="default"] svg polyline').length`); n != 2 {
		t.Errorf("%d lines drawn for queue default, want throughput and depth", n)
	}

	// New run: pick-lists from the presence.
	b.open(page, "/new")
	b.do(page, "pick-lists", wait(`document.querySelectorAll("#new-tools input[type=checkbox]").length >= 4`))
	if got := eval[[]string](b, page, `[...document.querySelectorAll("#new-model option")].map((o) => o.value + "=" + o.textContent)`); !slices.Equal(got, []string{"=the worker's default (priced/writer)", "priced/analyst=priced/analyst", "priced/writer=priced/writer", "__other=other…"}) {
		t.Errorf("model pick-list: %q", got)
	}
	if got := eval[[]string](b, page, `[...document.querySelectorAll("#new-tools fieldset")].map((g) => g.querySelector("legend").textContent + ": " + [...g.querySelectorAll("input")].map((i) => i.value).join(" "))`); len(got) != 2 || got[1] != "service:text: text__count_words text__upper" {
		t.Errorf("tool pick-list: %q", got)
	}
	if got := eval[[]string](b, page, `[...document.querySelectorAll("#new-queue option")].map((o) => o.value)`); !slices.Equal(got, []string{"default", "other"}) {
		t.Errorf("queues: %q", got)
	}
	b.do(page, "submit with picks",
		chromedp.SetValue(chromedp.ID("new-prompt"), "picked"),
		setValue("#new-model", "priced/analyst"),
		setValue("#new-title", "Picked from the lists"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#new-tools input[value="text__upper"]').click(); document.querySelector('#new-tools input[value="calculator"]').click()`),
		setValue("#new-queue", "other"),
		click("#new-submit"),
		// One poll across the navigation the submit starts: a poll begun
		// in the old page's context failed when it went away ("Cannot
		// find context with specified id" in a loaded CI).
		chromedp.Func(func(ctx context.Context, tgt *chromedp.Target) error {
			for ctx.Err() == nil {
				if ok, err := chromedp.Evaluate[bool](`location.pathname.startsWith("/runs/") && document.body.dataset.ready === "true" && document.getElementById("transcript")?.dataset.ended === "true"`)(ctx, tgt); err == nil && ok {
					return nil
				}
				time.Sleep(50 * time.Millisecond)
			}
			return ctx.Err()
		}))
	id := strings.TrimPrefix(eval[string](b, page, `location.pathname`), "/runs/")
	var rec bus.RunRecord
	c.getJSON(t, "/api/runs/"+id, &rec)
	if rec.Model != "priced/analyst" || rec.Queue != "other" || rec.Title != "Picked from the lists" || rec.Cost <= 0 {
		t.Errorf("the picked run: %+v", rec)
	}
	if got := eval[string](b, page, `document.querySelector(".fleet-event.started").textContent`); !strings.Contains(got, "tools: calculator, text__upper") {
		t.Errorf("the run's tools: %q", got)
	}
	b.checkConsole()
}
