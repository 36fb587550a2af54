package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"golang.org/x/crypto/bcrypt"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/toolsource"
	"github.com/agentfleet/agentfleet/worker"
)

// TestScreenshots takes the README's and docs/console.md's screenshots
// (docs/img/console-*.png, 1400×900) of a fleet at work: an embedded NATS
// server, a worker with a priced model whose answers are scripted by
// prompt (no model endpoint is reachable here), the built-in tools, a
// deploy tool that needs approval and a NATS tool service, and a few
// minutes of traffic on two queues (some runs fail, one is aborted, some
// wait for approval). Nothing on the pages is a fixture: every run went
// through the fleet. Run it to take them again:
//
//	CONSOLE_SCREENSHOTS=1 go test ./cmd/console -run TestScreenshots -timeout 15m
//
// CONSOLE_SCREENSHOTS_TRAFFIC sets the traffic's length (default 3m: the
// fleet page draws the history the console sampled meanwhile, every 10 s).
func TestScreenshots(t *testing.T) {
	t.Parallel()
	if os.Getenv("CONSOLE_SCREENSHOTS") == "" {
		t.Skip("set CONSOLE_SCREENSHOTS=1 to take docs/img/console-*.png")
	}
	chromiumPath(t)
	traffic := 3 * time.Minute
	if v := os.Getenv("CONSOLE_SCREENSHOTS_TRAFFIC"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatal(err)
		}
		traffic = d
	}
	model := newPricedModel(45, analyst, "analyst", "writer")
	deploy := agent.NewTool("deploy", "Deploy a service version to an environment.", func(_ context.Context, a struct {
		Service     string `json:"service" jsonschema:"required"`
		Version     string `json:"version" jsonschema:"required"`
		Environment string `json:"environment" jsonschema:"required,enum=staging,enum=production"`
	}, _ agent.UpdateFunc) (agent.ToolResult, error) {
		return agent.TextResult(fmt.Sprintf("deployed %s %s to %s", a.Service, a.Version, a.Environment)), nil
	})
	f := newTestFleetWith(t, func(url string) worker.Config {
		return worker.Config{WorkerID: "worker-eu-1", Version: "v0.9.0", Concurrency: 6,
			Providers: map[string]worker.Provider{"faux": model}, DefaultModel: "faux/analyst",
			Tools: []*agent.Tool{deploy}, ToolSources: []toolsource.Source{textService(t, url)}}
	})
	// A second worker, on the reports queue only.
	f.StartWorker(worker.Config{WorkerID: "worker-eu-2", Version: "v0.9.0", Queues: []string{"reports"}, Concurrency: 4,
		Providers: map[string]worker.Provider{"faux": model}, DefaultModel: "faux/writer", DrainTimeout: 2 * time.Second})
	if err := f.c.EnsureStreams(context.Background(), bus.StreamsConfig{Queues: []string{"default", "other", "reports"}, AckWait: 5 * time.Second}); err != nil {
		t.Fatal(err)
	}
	asAlice := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.SetBasicAuth("alice", "demo-password")
			h.ServeHTTP(w, r)
		})
	}
	c := newConsoleWith(t, f, serverConfig{AllowControl: true, Auth: screenshotAuth(t)}, asAlice)

	// Traffic: a run every second or two, a burst on the reports queue,
	// deployments that wait for approval, a failure now and then.
	ctx, cancel := context.WithTimeout(context.Background(), traffic)
	defer cancel()
	rng := rand.New(rand.NewPCG(61, 2))
	tenants := []string{"acme", "globex", "initech"}
	submit := func(queue, prompt string, gate bool) string {
		req := &bus.RunRequest{Prompt: prompt, Tools: toolsFor(prompt),
			Metadata: map[string]string{"tenant": tenants[rng.IntN(3)], "team": []string{"billing", "support", "platform"}[rng.IntN(3)]}}
		if gate {
			req.Approval = &bus.Approval{Tools: []string{"deploy"}, TimeoutSeconds: 4 * 3600}
		}
		sctx, scancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer scancel()
		res, err := f.c.Submit(sctx, queue, req)
		if err != nil {
			t.Error(err)
			return ""
		}
		return res.ID
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		burst := time.After(traffic / 3)
		deploys := time.After(traffic / 2)
		for ctx.Err() == nil {
			p := prompts[rng.IntN(len(prompts))]
			queue := "default"
			if strings.Contains(p, "notes") || strings.Contains(p, "Compare") {
				queue = "reports"
			}
			submit(queue, p, false)
			select {
			case <-burst:
				for range 14 {
					submit("reports", prompts[2+rng.IntN(2)], false)
				}
			case <-deploys:
				for _, svc := range []string{"billing-service 2.4.1", "search-api 1.19.0", "ledger 3.0.2"} {
					submit("default", "Deploy "+svc+" to production", true)
				}
				// A long report, aborted (the abort waits in the control
				// stream if the run has not started).
				slow := submit("default", "Write the quarterly capacity report", false)
				actx, acancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := f.c.SendControl(actx, slow, bus.KindAbort, bus.Control{Reason: "superseded by the monthly report"}); err != nil {
					t.Error(err)
				}
				acancel()
			case <-time.After(time.Duration(800+rng.IntN(1600)) * time.Millisecond):
			case <-ctx.Done():
			}
		}
	})
	wg.Wait()
	// The last runs finish, but not all: the runs page shows some running.
	submit("default", prompts[0], false)
	submit("reports", prompts[3], false)

	b := newBrowserSized(t, c.URL, 1400, 900)
	page := b.tab()
	b.do(page, "viewport", chromedp.EmulateViewport(1400, 900))
	b.open(page, "/")
	b.do(page, "runs", wait(`document.querySelectorAll("#runs-body tr[data-run]").length >= 20`))
	snap(t, b, page, "console-runs.png")

	var runs runsPage
	c.getJSON(t, "/api/runs?limit=500&q=monthly+cost&state=succeeded", &runs)
	if len(runs.Runs) == 0 {
		t.Fatal("no finished cost run to show")
	}
	b.open(page, "/runs/"+runs.Runs[0].ID)
	b.do(page, "run", wait(`document.getElementById("transcript").dataset.ended === "true" && document.getElementById("status").dataset.state === "succeeded"`))
	snap(t, b, page, "console-run.png")

	b.open(page, "/approvals")
	b.do(page, "approvals", wait(`document.querySelectorAll("#approvals-body tr[data-run]").length === 3`))
	snap(t, b, page, "console-approvals.png")

	b.open(page, "/fleet")
	b.do(page, "fleet", wait(`document.querySelectorAll("#queues tr[data-queue]").length === 3 && Number(document.querySelector("#queues td.chart").dataset.points) >= 6 && document.querySelectorAll(".source").length === 2`))
	snap(t, b, page, "console-fleet.png")

	b.open(page, "/new")
	b.do(page, "new run", wait(`document.querySelectorAll("#new-tools input[type=checkbox]").length >= 5`),
		chromedp.SetValue(chromedp.ID("new-prompt"), "What is the monthly cost of 14 GPU nodes at $2.48 per hour?"),
		setValue("#new-title", "GPU budget for Q1"),
		setValue("#new-model", "faux/analyst"),
		chromedp.Evaluate[chromedp.Void](`document.querySelector('#new-tools input[value="calculator"]').click()`))
	snap(t, b, page, "console-new.png")
	b.checkConsole()
}

// prompts are the traffic's runs; analyst answers each.
var prompts = []string{
	"What is the monthly cost of 14 GPU nodes at $2.48 per hour?",
	"Summarise incident INC-2291 and list the follow-ups",
	"Draft release notes for billing-service 2.4.1",
	"Compare Q3 and Q4 support ticket volumes",
	"Shout the on-call rotation for this week",
	"What time is it in UTC?",
	"Write the quarterly capacity report",
	"Retry the flaky export of invoices",
}

// toolsFor is the tools a prompt's run is given.
func toolsFor(prompt string) []string {
	switch {
	case strings.HasPrefix(prompt, "What is the monthly cost"):
		return []string{"calculator"}
	case strings.HasPrefix(prompt, "What time"):
		return []string{"current_time"}
	case strings.HasPrefix(prompt, "Shout"):
		return []string{"text__upper"}
	case strings.HasPrefix(prompt, "Deploy"):
		return []string{"deploy"}
	}
	return nil
}

// analyst is the scripted model's answer to each prompt, turn by turn.
func analyst(prompt string, turn int, llm agent.Context) agent.ScriptedResponse {
	text := func(s string) agent.ScriptedResponse {
		return agent.ScriptedResponse{Content: []agent.Content{agent.Text(s)}}
	}
	call := func(say, tool string, args map[string]any) agent.ScriptedResponse {
		return agent.ScriptedResponse{Content: []agent.Content{agent.Text(say), agent.ToolCall(fmt.Sprintf("call-%d", turn+1), tool, args)}, StopReason: agent.StopReasonToolUse}
	}
	result := ""
	if n := len(llm.Messages); n > 0 && llm.Messages[n-1].Role == agent.RoleToolResult {
		result = llm.Messages[n-1].TextOf()
	}
	switch {
	case strings.HasPrefix(prompt, "What is the monthly cost"):
		if turn == 0 {
			return call("A month of on-demand capacity is 730 hours; let me compute it.", "calculator", map[string]any{"expression": "14 * 2.48 * 730"})
		}
		return text("## Monthly cost\n\n14 GPU nodes at **$2.48/h** for a 730-hour month come to **$" + result + "**.\n\n" +
			"| item | value |\n|---|--:|\n| nodes | 14 |\n| rate | $2.48 / hour |\n| hours in a month | 730 |\n| **total** | **$" + result + "** |\n\n" +
			"- A one-year reservation (about 38% off) would bring it near **$15,700**.\n- Spot capacity is cheaper still, but can be reclaimed mid-run.\n\n" +
			"Prices from the `gpu-a100` rate card; see [the pricing page](https://example.com/pricing).")
	case strings.HasPrefix(prompt, "Deploy "):
		svc := strings.Fields(strings.TrimPrefix(prompt, "Deploy "))
		if turn == 0 {
			return call("This needs an approval: deploying to production.", "deploy", map[string]any{"service": svc[0], "version": svc[1], "environment": "production"})
		}
		return text("Done: " + result + ".")
	case strings.HasPrefix(prompt, "Shout"):
		if turn == 0 {
			return call("", "text__upper", map[string]any{"text": "on call this week: dana (primary), lee (secondary)"})
		}
		return text("**" + result + "**")
	case strings.HasPrefix(prompt, "What time"):
		if turn == 0 {
			return call("", "current_time", map[string]any{})
		}
		return text("It is " + result + ".")
	case strings.HasPrefix(prompt, "Retry the flaky"):
		return agent.ScriptedResponse{StopReason: agent.StopReasonError, ErrorMessage: "429 Too Many Requests: rate limit reached for requests per minute"}
	case strings.HasPrefix(prompt, "Summarise incident"):
		return text("## INC-2291: checkout latency\n\n**Impact:** p95 checkout latency rose from 380 ms to 4.2 s for 47 minutes; no orders were lost.\n\n" +
			"**Cause:** a connection-pool limit of 20 on `payments-db` after the 14:05 config push.\n\n### Follow-ups\n\n" +
			"1. Restore the pool limit to 120 and alert on saturation.\n2. Add the pool size to the config-push diff check.\n3. Load-test checkout at 2× peak before the holiday freeze.")
	case strings.HasPrefix(prompt, "Draft release notes"):
		return text("# billing-service 2.4.1\n\n### Fixed\n\n- Invoices in `EUR` no longer round the VAT line twice.\n- Retries of failed card payments keep their idempotency key.\n\n" +
			"### Changed\n\n- The export job runs at 02:00 UTC instead of midnight.\n\n> Upgrade note: no migration needed.")
	case strings.HasPrefix(prompt, "Compare Q3"):
		return text("## Support tickets, Q3 → Q4\n\n| category | Q3 | Q4 | change |\n|---|--:|--:|--:|\n| billing | 1,204 | 988 | −18% |\n" +
			"| login | 642 | 701 | +9% |\n| exports | 310 | 122 | −61% |\n| **total** | **2,156** | **1,811** | **−16%** |\n\n" +
			"Exports fell after the scheduler fix shipped in October; login tickets rose with the SSO roll-out.")
	case strings.HasPrefix(prompt, "Write the quarterly"):
		return text("# Capacity report\n\n" + strings.Repeat("Compute use grew in every region this quarter; storage grew faster than planned. ", 30))
	}
	return text("Done.")
}

// screenshotAuth is basic auth with one user, alice.
func screenshotAuth(t *testing.T) *auth {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("demo-password"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(file, []byte("alice:"+string(hash)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := loadAuth(file, "")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// snap writes the tab's viewport to docs/img/name.
func snap(t *testing.T, b *browser, ctx context.Context, name string) {
	t.Helper()
	// The page's own clock and animations settle.
	b.do(ctx, "settle", chromedp.Evaluate[chromedp.Void](`window.scrollTo(0, 0)`))
	png, err := chromedp.Run(ctx, chromedp.CaptureScreenshot())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join("..", "..", "docs", "img", name)
	if err := os.WriteFile(path, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("wrote %s", path)
}
