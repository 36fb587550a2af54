//go:build adversarial

package adversarial

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/internal/logbuf"
	"github.com/agentfleet/agentfleet/worker"
)

// The web console is attacked as a hostile web page would: after DNS
// rebinding (its name now resolves to 127.0.0.1, so the browser sends the
// console requests as the page's own origin, with Host set to the
// attacker's name), and with a flood of event streams. The console is the
// real binary, connected as the console role of accounts.conf.

// buildConsole builds cmd/console once for a test.
func buildConsole(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "console")
	if out, err := exec.Command("go", "build", "-o", bin, "../cmd/console").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// consoleProc is a console process.
type consoleProc struct {
	base string // http://127.0.0.1:PORT
	port string
	log  *logbuf.Buffer
}

var consoleStarted = regexp.MustCompile(`msg="console started" addr=http://(\S+)`)

// startConsoleAs runs the console binary as the console role with args
// until the test ends.
func startConsoleAs(t *testing.T, f *fleet, bin string, args ...string) *consoleProc {
	t.Helper()
	cmd := exec.Command(bin, append([]string{"--nats", f.URL, "--addr", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), "NATS_URL=", "NATS_USER=console", "NATS_PASSWORD="+f.Passwords["console"])
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &consoleProc{log: &logbuf.Buffer{}}
	addr := make(chan string, 1)
	read := make(chan struct{})
	go func() {
		defer close(read)
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			fmt.Fprintln(p.log, sc.Text())
			if m := consoleStarted.FindStringSubmatch(sc.Text()); m != nil {
				addr <- m[1]
			}
		}
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		<-read
		_ = cmd.Wait()
	})
	select {
	case a := <-addr:
		p.base = "http://" + a
		_, p.port, _ = net.SplitHostPort(a)
	case <-read:
		t.Fatalf("the console exited:\n%s", p.log.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("the console never started:\n%s", p.log.String())
	}
	return p
}

// honest asks the console as its own page would (Host 127.0.0.1:PORT).
func (p *consoleProc) honest(t *testing.T, path string, v any) {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	resp, err := hc.Get(p.base + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK || json.Unmarshal(b, v) != nil {
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
}

func randomHex() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// rebindTarget is what the attacks aim at: a finished run whose transcript
// holds a secret, a running run to abort, and the console's CSRF token.
type rebindTarget struct {
	secret, secretRun, victim, csrf string
}

func prepareRebindTarget(t *testing.T, f *fleet, p *consoleProc) rebindTarget {
	t.Helper()
	sub := f.Connect(t, "submitter")
	c := ctx(t, 60*time.Second)
	tg := rebindTarget{secret: "SECRET-" + randomHex(), secretRun: "rebind-secret-" + randomHex(), victim: "rebind-victim-" + randomHex()}
	req := fauxRun(tg.secretRun, "tell me the secret", fleettest.Text(tg.secret))
	if _, err := sub.Submit(c, "", req); err != nil {
		t.Fatal(err)
	}
	if tr, err := sub.LoadTranscript(c, tg.secretRun); err != nil || !tr.Done() {
		t.Fatalf("the secret run: %v", err)
	}
	victim := fauxRun(tg.victim, "work slowly")
	victim.Faux = &bus.FauxScript{TokenSize: 1, TokensPerSecond: 20, Responses: []agent.ScriptedResponse{fleettest.Text(strings.Repeat("slow ", 400))}}
	if _, err := sub.Submit(c, "", victim); err != nil {
		t.Fatal(err)
	}
	for env, err := range sub.Follow(c, tg.victim) {
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(env.Event), `"message_update"`) {
			break // running
		}
	}
	var s struct {
		CSRF string `json:"csrf"`
	}
	p.honest(t, "/api/session", &s)
	if s.CSRF == "" {
		t.Fatal("no CSRF token from the console's own page")
	}
	tg.csrf = s.CSRF
	t.Cleanup(func() {
		// The victim's owner ends it, so that the worker drains at once.
		c := ctx(t, 30*time.Second)
		_, _ = sub.SendControl(c, tg.victim, bus.KindAbort, bus.Control{Reason: "the test is over"})
		_, _ = sub.LoadTranscript(c, tg.victim)
	})
	return tg
}

// nothingDone checks that the attack stored no run and no control message
// for the victim, and that what it read holds neither secret.
func (tg rebindTarget) nothingDone(t *testing.T, f *fleet, submitted string, read string) {
	t.Helper()
	c := ctx(t, 10*time.Second)
	if _, err := f.Worker.Status(c, submitted); !errors.Is(err, bus.ErrRunNotFound) {
		t.Errorf("the attacker's submit %s was stored: %v", submitted, err)
	}
	names := f.Worker.Names()
	st, err := f.Worker.JetStream().Stream(c, names.ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	for _, kind := range []string{bus.KindAbort, bus.KindSteer} {
		if m, err := st.GetLastMsgForSubject(c, names.Control(tg.victim, kind)); !errors.Is(err, jetstream.ErrMsgNotFound) {
			t.Errorf("the victim run's %s was stored: %v %v", kind, err, m)
		}
	}
	if rec, err := f.Worker.Status(c, tg.victim); err != nil || rec.State != bus.StateRunning {
		t.Errorf("the victim run after the attack: %v %+v", err, rec)
	}
	if strings.Contains(read, tg.csrf) {
		t.Errorf("the attacker read the console's CSRF token")
	}
	if strings.Contains(read, tg.secret) {
		t.Errorf("the attacker read a run's transcript (%s)", tg.secret)
	}
}

// TestConsoleRebindingGoClient sends, with a plain HTTP client, exactly
// what a browser sends after the attacker's name rebound to 127.0.0.1:
// Host rebind.test:PORT, Origin http://rebind.test:PORT on POSTs, the
// Sec-Fetch headers of a same-origin fetch, and the CSRF token (the
// attacker's best case). To a console with --allow-control and to a
// read-only one: every route answers 421, nothing is read, submitted or
// aborted.
func TestConsoleRebindingGoClient(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	bin := buildConsole(t)
	rw := startConsoleAs(t, f, bin, "--allow-control")
	ro := startConsoleAs(t, f, bin)
	tg := prepareRebindTarget(t, f, rw)
	hc := &http.Client{Timeout: 10 * time.Second}
	defer hc.CloseIdleConnections()
	var read strings.Builder
	for _, p := range []*consoleProc{rw, ro} {
		host := "rebind.test:" + p.port
		for _, rt := range []struct{ method, path, body string }{
			{"GET", "/", ""}, {"GET", "/static/app.js", ""}, {"GET", "/api/session", ""}, {"GET", "/api/runs", ""},
			{"GET", "/api/runs/" + tg.secretRun, ""}, {"GET", "/api/runs/" + tg.secretRun + "/events", ""}, {"GET", "/api/fleet", ""},
			{"POST", "/api/runs", `{"id":"rebound-submit-go","prompt":"pwned"}`},
			{"POST", "/api/runs/" + tg.victim + "/abort", `{"reason":"rebound"}`},
			{"POST", "/api/runs/" + tg.victim + "/steer", `{"text":"rebound"}`},
		} {
			req, _ := http.NewRequest(rt.method, p.base+rt.path, strings.NewReader(rt.body))
			req.Host = host
			req.Header.Set("User-Agent", "Mozilla/5.0 (X11; Linux x86_64) Chrome/140.0.0.0")
			req.Header.Set("Accept", "*/*")
			req.Header.Set("Sec-Fetch-Site", "same-origin")
			req.Header.Set("Sec-Fetch-Mode", "cors")
			req.Header.Set("Sec-Fetch-Dest", "empty")
			req.Header.Set("Referer", "http://"+host+"/attack")
			if rt.method == "POST" {
				req.Header.Set("Origin", "http://"+host)
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("X-CSRF-Token", tg.csrf)
			}
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			read.Write(b)
			if resp.StatusCode != http.StatusMisdirectedRequest {
				t.Errorf("%s %s%s as the rebound page: %d %.200s", rt.method, p.base, rt.path, resp.StatusCode, b)
			}
		}
	}
	tg.nothingDone(t, f, "rebound-submit-go", read.String())
}

// chromium finds Debian's chromium (or $CHROMIUM); without one the test
// skips, except in CI.
func chromium(t *testing.T) string {
	t.Helper()
	if p := os.Getenv("CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome", "headless-shell"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if os.Getenv("CI") == "true" {
		t.Fatal("no chromium binary and CI=true: apt-get install chromium, or set CHROMIUM")
	}
	t.Skip("no chromium binary (apt-get install chromium, or set CHROMIUM)")
	return ""
}

// attackPage is the hostile page: it reads the session (the CSRF token),
// the runs, a finished run's record and transcript, then submits a run
// and aborts another with the token, all as its own origin, and leaves
// what it got in window.__result.
const attackPage = `<!doctype html><title>cute cats</title><script>
(async () => {
  const out = {};
  const keep = async (name, path, init) => {
    try {
      const r = await fetch(path, init);
      out[name] = { status: r.status, body: (await r.text()).slice(0, 4000) };
    } catch (e) { out[name] = { error: String(e) }; }
  };
  await keep("session", "/api/session");
  let csrf = "";
  try { csrf = JSON.parse(out.session.body).csrf || ""; } catch {}
  await keep("runs", "/api/runs");
  await keep("record", "/api/runs/SECRET_RUN");
  await keep("transcript", "/api/runs/SECRET_RUN/events");
  const post = (body) => ({ method: "POST", headers: { "Content-Type": "application/json", "X-CSRF-Token": csrf }, body: JSON.stringify(body) });
  await keep("submit", "/api/runs", post({ id: "rebound-submit-browser", prompt: "pwned" }));
  await keep("abort", "/api/runs/VICTIM/abort", post({ reason: "rebound" }));
  window.__result = out;
  window.__done = true;
})();
</script>`

// TestConsoleRebindingBrowser is the attack in a real headless Chromium.
// DNS rebinding is emulated with a proxy the browser is told to use: it
// answers http://rebind.test:PORT/attack (PORT the console's) with the
// hostile page, as the attacker's server did before the name rebound,
// and forwards every other request for rebind.test:PORT to the console
// unchanged, as the rebound name does. The page is then same-origin with
// the console, exactly as after a real rebinding: the browser's
// same-origin policy no longer protects the console, only the console's
// own checks do.
func TestConsoleRebindingBrowser(t *testing.T) {
	path := chromium(t)
	f := startFleet(t, &worker.Config{})
	p := startConsoleAs(t, f, buildConsole(t), "--allow-control")
	tg := prepareRebindTarget(t, f, p)
	rebound := "rebind.test:" + p.port
	page := strings.NewReplacer("SECRET_RUN", tg.secretRun, "VICTIM", tg.victim).Replace(attackPage)
	console, _ := url.Parse(p.base)
	forward := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(console)
			pr.Out.Host = pr.In.Host // the browser's Host: rebind.test:PORT
		},
		FlushInterval: -1,
	}
	var mu sync.Mutex
	var seen []string
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Host != rebound {
			http.Error(w, "not proxied", http.StatusBadGateway)
			return
		}
		mu.Lock()
		seen = append(seen, r.Method+" "+r.URL.Path)
		mu.Unlock()
		if r.URL.Path == "/attack" {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = io.WriteString(w, page)
			return
		}
		forward.ServeHTTP(w, r)
	}))
	defer proxy.Close()

	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.ProxyServer(proxy.URL),
		chromedp.UserDataDir(t.TempDir()))
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	defer cancelAlloc()
	bctx, cancel := chromedp.NewContext(actx)
	defer cancel()
	// The browser lives as long as bctx: start it without a timeout.
	if err := chromedp.Do(bctx); err != nil {
		t.Fatalf("start chromium %s: %v", path, err)
	}
	tctx, cancelRun := context.WithTimeout(bctx, 90*time.Second)
	defer cancelRun()
	if err := chromedp.Do(tctx, chromedp.Navigate("http://"+rebound+"/attack"),
		chromedp.Poll[chromedp.Void](`window.__done === true`, chromedp.WithPollingTimeout(60*time.Second))); err != nil {
		t.Fatalf("the hostile page: %v", err)
	}
	result, err := chromedp.Run(tctx, chromedp.Evaluate[string](`JSON.stringify(window.__result)`))
	if err != nil {
		t.Fatalf("the hostile page's result: %v", err)
	}
	var got map[string]struct {
		Status int    `json:"status"`
		Body   string `json:"body"`
		Error  string `json:"error"`
	}
	if err := json.Unmarshal([]byte(result), &got); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"session", "runs", "record", "transcript", "submit", "abort"} {
		r := got[name]
		t.Logf("the hostile page's %s: %d %s", name, r.Status, r.Error)
		if r.Status != http.StatusMisdirectedRequest {
			t.Errorf("the hostile page's %s: %d %s %.200s", name, r.Status, r.Error, r.Body)
		}
	}
	mu.Lock()
	if len(seen) < 7 {
		t.Errorf("the browser's requests through the rebound name: %q", seen)
	}
	mu.Unlock()
	tg.nothingDone(t, f, "rebound-submit-browser", result)
}

// TestConsoleStreamFlood opens 1,000 event streams at once, first from
// one address, then from 100 (all of 127/8 is this machine): the console
// keeps at most --max-streams-per-client (16) of one client and
// --max-streams (256) in all, answers the rest 503, and the consumers it
// makes on AGENTS_EVENTS stay within those bounds; closed streams give
// their consumers back.
func TestConsoleStreamFlood(t *testing.T) {
	f := startFleet(t, &worker.Config{})
	p := startConsoleAs(t, f, buildConsole(t))
	cons := f.Connect(t, "console")
	consumers := func() int {
		c := ctx(t, 10*time.Second)
		st, err := cons.JetStream().Stream(c, cons.Names().EventsStream())
		if err != nil {
			t.Fatal(err)
		}
		info, err := st.Info(c)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Consumers
	}
	waitConsumers := func(n int) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for got := consumers(); got > n; got = consumers() {
			if time.Now().After(deadline) {
				t.Fatalf("%d consumers on the events stream, want at most %d", got, n)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	base := consumers()

	flood := func(addresses int) (open []io.Closer, refused int) {
		t.Helper()
		clients := make([]*http.Client, addresses)
		for i := range clients {
			d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.IPv4(127, 0, 1, byte(i+1))}}
			clients[i] = &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
		}
		var mu sync.Mutex
		var wg sync.WaitGroup
		other := map[int]int{}
		for i := range 1000 {
			wg.Go(func() {
				req, _ := http.NewRequest("GET", p.base+"/api/runs/flood-"+randomHex()+"/events", nil)
				resp, err := clients[i%addresses].Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				defer mu.Unlock()
				switch resp.StatusCode {
				case http.StatusOK:
					open = append(open, resp.Body)
				case http.StatusServiceUnavailable:
					refused++
					if resp.Header.Get("Retry-After") == "" {
						other[-1]++
					}
					resp.Body.Close()
				default:
					other[resp.StatusCode]++
					resp.Body.Close()
				}
			})
		}
		wg.Wait()
		if len(other) > 0 {
			t.Errorf("other answers (-1: a 503 without Retry-After): %v", other)
		}
		return open, refused
	}
	closeAll := func(bodies []io.Closer) {
		for _, b := range bodies {
			b.Close()
		}
	}

	open, refused := flood(1)
	if len(open) != 16 || refused != 984 {
		t.Errorf("1,000 streams from one address: %d open, %d refused; want 16 and 984", len(open), refused)
	}
	if n := consumers(); n > base+16 {
		t.Errorf("1,000 streams from one address made %d consumers, want at most %d", n-base, 16)
	}
	closeAll(open)
	waitConsumers(base)

	open, refused = flood(100)
	if len(open) != 256 || refused != 744 {
		t.Errorf("1,000 streams from 100 addresses: %d open, %d refused; want 256 and 744", len(open), refused)
	}
	if n := consumers(); n > base+256 {
		t.Errorf("1,000 streams from 100 addresses made %d consumers, want at most %d", n-base, 256)
	}
	if !strings.Contains(p.log.String(), "event streams refused") {
		t.Errorf("the console logged no refusal:\n%s", p.log.String())
	}
	closeAll(open)
	waitConsumers(base)
}
