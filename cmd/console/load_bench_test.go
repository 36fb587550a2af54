package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// BenchmarkConsoleFollows200Runs runs the console binary against a fleet
// with 200 concurrent paced faux runs, follows every run's events through
// the console (200 SSE streams, as 200 open run pages would), and measures
// how long a steer posted through the console takes to come back on the
// run's stream as the user message the run took. The runs call a tool
// every turn (about a quarter of a second), so a steer waits for at most
// one turn. It reports the latency's p50/p95/max and the console process's
// CPU and memory.
//
//	go test -run '^$' -bench ConsoleFollows200Runs -benchtime 200x ./cmd/console
func BenchmarkConsoleFollows200Runs(b *testing.B) {
	// chunks is each run's pace: 50 chunks of 4 characters a second is a
	// fast model streaming one token per event; 20 of 8 is a model that
	// streams two tokens per event.
	for _, c := range []struct{ runs, chunks, chunkTokens int }{{50, 50, 1}, {200, 50, 1}, {200, 20, 2}} {
		name := fmt.Sprintf("runs=%d/chunks=%dx%d", c.runs, c.chunks, c.chunkTokens)
		b.Run(name, func(b *testing.B) { benchmarkFollow(b, c.runs, c.chunks, c.chunkTokens) })
	}
}

func benchmarkFollow(b *testing.B, runs, chunks, chunkTokens int) {
	f := newTestFleetN(b, runs+8)
	base, pid := startConsoleProcess(b, f.srv.URL())
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: runs + 16, MaxConnsPerHost: 0}}
	b.Cleanup(hc.CloseIdleConnections)

	var sess struct {
		CSRF string `json:"csrf"`
	}
	getJSONFrom(b, hc, base+"/api/session", &sess)

	// Each turn streams a short text and a calculator call (about 40
	// characters).
	script := &bus.FauxScript{TokenSize: chunkTokens, TokensPerSecond: float64(chunks * chunkTokens)}
	for i := range bus.MaxFauxResponses {
		script.Responses = append(script.Responses, agent.ScriptedResponse{Content: []agent.Content{
			agent.Text("Step " + strconv.Itoa(i) + ": computing."),
			agent.ToolCall("c"+strconv.Itoa(i), "calculator", map[string]any{"expression": "1+1"})},
			StopReason: agent.StopReasonToolUse})
	}
	ids := make([]string, runs)
	for i := range ids {
		ids[i] = fmt.Sprintf("load-%03d", i)
		f.submit(&bus.RunRequest{ID: ids[i], Prompt: "keep going", Tools: []string{"calculator"}, Faux: script,
			Limits: &bus.Limits{MaxTurns: bus.MaxTurnsLimit, TimeoutSeconds: 3600}})
	}

	// The followers: one SSE stream per run.
	var (
		mu       sync.Mutex
		pending  = map[string]chan arrival{} // steer text -> arrival
		events   atomic.Int64
		started  sync.WaitGroup
		followed sync.WaitGroup
	)
	ctx, cancel := context.WithCancel(context.Background())
	started.Add(runs)
	for _, id := range ids {
		followed.Go(func() {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/runs/"+id+"/events", nil)
			resp, err := hc.Do(req)
			if err != nil {
				started.Done()
				return
			}
			defer resp.Body.Close()
			sc := bufio.NewScanner(resp.Body)
			sc.Buffer(make([]byte, 64<<10), 2<<20)
			first := true
			for sc.Scan() {
				line := sc.Bytes()
				if !bytes.HasPrefix(line, []byte("data: ")) {
					continue
				}
				events.Add(1)
				if first && bytes.Contains(line, []byte(`"message_update"`)) {
					first = false
					started.Done()
				}
				if bytes.Contains(line, []byte(`"message_end"`)) && bytes.Contains(line, []byte(`"role":"user"`)) {
					if i := bytes.Index(line, []byte("steer-")); i >= 0 {
						j := i + bytes.IndexByte(line[i:], '"')
						mu.Lock()
						ch := pending[string(line[i:j])]
						mu.Unlock()
						if ch != nil {
							ch <- arrival{at: time.Now(), stored: envelopeTS(line)}
						}
					}
				}
			}
			if first {
				started.Done()
			}
		})
	}
	b.Cleanup(func() {
		actx, acancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer acancel()
		for _, id := range ids {
			_, _ = f.c.Abort(actx, id, "benchmark over")
		}
		cancel()
		followed.Wait()
	})
	started.Wait()

	cpu0, wall0 := processCPU(b, pid), time.Now()
	self0 := processCPU(b, os.Getpid())
	events0 := events.Load()
	lat := make([]time.Duration, 0, b.N)
	delivery := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for i := range b.N {
		id := ids[i%runs]
		text := "steer-" + strconv.Itoa(i)
		ch := make(chan arrival, 1)
		mu.Lock()
		pending[text] = ch
		mu.Unlock()
		body, _ := json.Marshal(map[string]string{"text": text})
		req, _ := http.NewRequest(http.MethodPost, base+"/api/runs/"+id+"/steer", bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-CSRF-Token", sess.CSRF)
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			b.Fatal(err)
		}
		msg, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusAccepted {
			b.Fatalf("steer %s: %d %s", id, resp.StatusCode, msg)
		}
		select {
		case a := <-ch:
			lat = append(lat, a.at.Sub(t0))
			// The envelope's ts is when the worker published the user
			// message: the rest is the console's delivery.
			delivery = append(delivery, a.at.Sub(a.stored))
		case <-time.After(30 * time.Second):
			b.Fatalf("steer %q of %s never came back on the run's stream", text, id)
		}
	}
	b.StopTimer()
	wall := time.Since(wall0)
	if _, err := exec.LookPath("chromium"); err == nil && runs >= 200 {
		// The same from a real page: fill the steer form, click, and time
		// in the page until the message shows in the transcript.
		br := newBrowser(b, base)
		page := br.tab()
		br.open(page, "/runs/"+ids[1])
		br.do(page, "page streams", wait(`document.querySelector("#transcript .msg-assistant")`))
		var onPage []time.Duration
		for i := range 40 {
			ms, err := chromedp.Run(page, chromedp.Evaluate[float64](`(async (text) => {
				const t0 = performance.now();
				const tr = document.getElementById("transcript");
				const shown = () => [...tr.querySelectorAll(".msg-user")].some((m) => m.textContent.includes(text));
				const seen = new Promise((res) => {
					const mo = new MutationObserver(() => { if (shown()) { mo.disconnect(); res(); } });
					mo.observe(tr, { childList: true, subtree: true, characterData: true });
				});
				document.getElementById("steer-text").value = text;
				document.querySelector("#steer-form button").click();
				await seen;
				return performance.now() - t0;
			})(`+jsString("steer-page-"+strconv.Itoa(i))+`)`, chromedp.EvalAwaitPromise))
			if err != nil {
				b.Fatal(err)
			}
			onPage = append(onPage, time.Duration(ms*float64(time.Millisecond)))
		}
		slices.Sort(onPage)
		b.ReportMetric(float64(onPage[len(onPage)*95/100].Microseconds())/1000, "page-p95-ms")
		b.ReportMetric(float64(onPage[len(onPage)/2].Microseconds())/1000, "page-p50-ms")
		br.checkConsole()
	}
	cpu := processCPU(b, pid) - cpu0
	self := processCPU(b, os.Getpid()) - self0
	rss, peak := processMemory(b, pid)
	slices.Sort(lat)
	slices.Sort(delivery)
	pct := func(d []time.Duration, p float64) float64 {
		return float64(d[min(len(d)-1, int(p*float64(len(d))))].Microseconds()) / 1000
	}
	b.ReportMetric(pct(lat, 0.50), "p50-ms")
	b.ReportMetric(pct(lat, 0.95), "p95-ms")
	b.ReportMetric(pct(delivery, 0.95), "delivery-p95-ms")
	b.ReportMetric(float64(lat[len(lat)-1].Microseconds())/1000, "max-ms")
	b.ReportMetric(100*cpu.Seconds()/wall.Seconds(), "console-cpu-%")
	// The rest of the fleet: NATS, the worker and the 200 followers.
	b.ReportMetric(100*self.Seconds()/wall.Seconds(), "nats+worker+clients-cpu-%")
	b.ReportMetric(float64(rss)/(1<<20), "console-rss-MiB")
	b.ReportMetric(float64(peak)/(1<<20), "console-peak-rss-MiB")
	b.ReportMetric(float64(events.Load()-events0)/wall.Seconds(), "sse-events/s")
	b.ReportMetric(0, "ns/op")
}

// startConsoleProcess builds and starts the console binary on a free port
// and returns its URL and process id; it is stopped when the test ends.
func startConsoleProcess(b *testing.B, natsURL string) (string, int) {
	b.Helper()
	bin := filepath.Join(b.TempDir(), "console")
	if out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput(); err != nil {
		b.Fatalf("go build: %v\n%s", err, out)
	}
	// Every run's stream comes from this one address: no per-client cap.
	cmd := exec.Command(bin, "--nats", natsURL, "--addr", "127.0.0.1:0", "--allow-control", "--log-format", "json", "--log-level", "warn",
		"--max-streams", "1000", "--max-streams-per-client", "0")
	cmd.Env = append(os.Environ(), "NATS_URL=")
	cmd.Stderr = os.Stderr
	// The listening address: --log-level warn hides "console started",
	// so ask the kernel instead.
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if addr := listeningAddr(cmd.Process.Pid); addr != "" {
			base := "http://" + addr
			if resp, err := http.Get(base + "/api/session"); err == nil {
				resp.Body.Close()
				return base, cmd.Process.Pid
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	b.Fatal("the console never listened")
	return "", 0
}

// listeningAddr finds the TCP port a process listens on, from /proc.
func listeningAddr(pid int) string {
	inodes := map[string]bool{}
	fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	for _, fd := range fds {
		l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name()))
		if err == nil && strings.HasPrefix(l, "socket:[") {
			inodes[strings.Trim(l[len("socket:"):], "[]")] = true
		}
	}
	tcp, err := os.ReadFile("/proc/net/tcp")
	if err != nil {
		return ""
	}
	for _, line := range strings.Split(string(tcp), "\n")[1:] {
		f := strings.Fields(line)
		if len(f) < 10 || f[3] != "0A" || !inodes[f[9]] { // 0A: LISTEN
			continue
		}
		_, port, _ := strings.Cut(f[1], ":")
		p, err := strconv.ParseUint(port, 16, 16)
		if err == nil {
			return "127.0.0.1:" + strconv.FormatUint(p, 10)
		}
	}
	return ""
}

// processCPU is the user+system CPU time of a process.
func processCPU(b *testing.B, pid int) time.Duration {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		b.Fatal(err)
	}
	// Fields after the command name, which is in parentheses.
	f := strings.Fields(string(stat[bytes.LastIndexByte(stat, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

// processMemory is the resident set size of a process, now and at peak.
func processMemory(b *testing.B, pid int) (rss, peak int64) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, _ := strings.Cut(line, ":")
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		switch k {
		case "VmRSS":
			rss = kb << 10
		case "VmHWM":
			peak = kb << 10
		}
	}
	return rss, peak
}

func getJSONFrom(b *testing.B, hc *http.Client, url string, v any) {
	b.Helper()
	resp, err := hc.Get(url)
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		b.Fatal(err)
	}
}

// arrival is when a steer came back on a run's stream, and when its
// envelope was published.
type arrival struct{ at, stored time.Time }

// envelopeTS reads an envelope's "ts" (Unix milliseconds) from an SSE
// data line.
func envelopeTS(line []byte) time.Time {
	i := bytes.Index(line, []byte(`"ts":`))
	if i < 0 {
		return time.Time{}
	}
	rest := line[i+len(`"ts":`):]
	j := bytes.IndexAny(rest, ",}")
	ms, err := strconv.ParseInt(string(rest[:j]), 10, 64)
	if err != nil {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}
