package main

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"golang.org/x/crypto/bcrypt"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// answer is a response read whole.
type answer struct {
	code int
	hdr  http.Header
	body string
}

// doAs sends a request with Host host ("" keeps the URL's) and the given
// headers, as a browser that resolved host to the console would.
func (c *console) doAs(t *testing.T, method, path, host string, h http.Header, body string) answer {
	t.Helper()
	req, _ := http.NewRequest(method, c.URL+path, strings.NewReader(body))
	for k, v := range h {
		req.Header[k] = v
	}
	if host != "" {
		req.Host = host
	}
	resp, err := c.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// An event stream that was not refused is open: read its first line only.
	var b []byte
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		line, _ := bufio.NewReader(resp.Body).ReadString('\n')
		b = []byte(line)
	} else {
		b, _ = io.ReadAll(resp.Body)
	}
	return answer{resp.StatusCode, resp.Header, string(b)}
}

func (c *console) port() string {
	_, p, _ := net.SplitHostPort(c.Listener.Addr().String())
	return p
}

// noAbortStored checks that no abort of run is in AGENTS_CONTROL.
func noAbortStored(t *testing.T, f *testFleet, run string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := f.c.Stream(ctx, f.c.Names().ControlStream())
	if err != nil {
		t.Fatal(err)
	}
	if m, err := st.GetLastMsgForSubject(ctx, f.c.Names().Control(run, bus.KindAbort)); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("an abort of %s was stored: %v %+v", run, err, m)
	}
}

// TestRebindingHostRefused: a page on a rebinding name reaches the console
// with its own name in Host. Every route answers 421 naming the flag, the
// session's CSRF token is not in any answer, and a submit and an abort
// sent with a valid token store nothing.
func TestRebindingHostRefused(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{AllowControl: true})
	victim := f.submit(slowText("rebind-victim", strings.Repeat("long answer ", 30)))
	tok := c.csrfToken(t) // the attacker's best case: it knows the token
	post := http.Header{"Content-Type": {"application/json"}, "X-CSRF-Token": {tok}}
	routes := []struct{ method, path, body string }{
		{"GET", "/", ""}, {"GET", "/runs/" + victim, ""}, {"GET", "/static/app.js", ""},
		{"GET", "/api/session", ""}, {"GET", "/api/runs", ""}, {"GET", "/api/runs/" + victim, ""},
		{"GET", "/api/runs/" + victim + "/events", ""}, {"GET", "/api/fleet", ""},
		{"POST", "/api/runs", `{"id":"rebind-submitted","prompt":"hi"}`},
		{"POST", "/api/runs/" + victim + "/abort", `{"reason":"rebound"}`},
		{"POST", "/api/runs/" + victim + "/steer", `{"text":"rebound"}`},
	}
	for _, host := range []string{"evil.example", "rebind.test:" + c.port(), "evil.example:80", "127.0.0.1.evil.example:" + c.port(), "localhost.evil.example"} {
		for _, rt := range routes {
			h := http.Header{}
			if rt.method == "POST" {
				h = post.Clone()
				// A rebound page is same-origin with its own name.
				h.Set("Origin", "http://"+host)
			}
			a := c.doAs(t, rt.method, rt.path, host, h, rt.body)
			if a.code != http.StatusMisdirectedRequest || !strings.Contains(a.body, "--public-host") {
				t.Errorf("%s %s with Host %s: %d %q", rt.method, rt.path, host, a.code, clip(a.body))
			}
			if strings.Contains(a.body, tok) {
				t.Errorf("%s %s with Host %s: the CSRF token is in the answer", rt.method, rt.path, host)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := f.c.Status(ctx, "rebind-submitted"); !errors.Is(err, bus.ErrRunNotFound) {
		t.Errorf("the rebound submit was stored: %v", err)
	}
	noAbortStored(t, f, victim)
	r := c.waitRun(t, victim, func(r bus.RunRecord) bool { return r.Finished() })
	if r.State != bus.StatusSucceeded {
		t.Errorf("the victim run: %+v", r)
	}
}

// TestAllowedHostsServe: the names the console is reached by legitimately
// are answered: its listen address, localhost and loopback literals on any
// port (an SSH tunnel), and --public-host names.
func TestAllowedHostsServe(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	public, err := parsePublicHosts([]string{"console.example.com", "https://secure.example.com:8443", "http://10.9.8.7"})
	if err != nil {
		t.Fatal(err)
	}
	c := newConsole(t, f, serverConfig{PublicHosts: public})
	p := c.port()
	allowed := []string{c.Listener.Addr().String(), "localhost:" + p, "LOCALHOST:" + p, "localhost.:" + p, "localhost",
		"127.0.0.1:" + p, "127.0.0.2:9000", "[::1]:" + p, "[::1]", "localhost:9000",
		"console.example.com", "console.example.com:8080", "Console.Example.Com.", "secure.example.com:8443", "10.9.8.7", "10.9.8.7:80"}
	for _, host := range allowed {
		if a := c.doAs(t, "GET", "/api/session", host, nil, ""); a.code != http.StatusOK || !strings.Contains(a.body, `"csrf"`) {
			t.Errorf("Host %s: %d %s", host, a.code, clip(a.body))
		}
	}
	for _, host := range []string{"secure.example.com", "secure.example.com:443", "10.9.8.7:8080", "example.com", "console.example.com.evil", "[::2]:" + p, "10.0.0.1:" + p} {
		if a := c.doAs(t, "GET", "/api/session", host, nil, ""); a.code != http.StatusMisdirectedRequest {
			t.Errorf("Host %s: %d %s", host, a.code, clip(a.body))
		}
	}
}

// nonLoopbackIP is an address of this machine other than loopback, or nil.
func nonLoopbackIP() net.IP {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil
	}
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && !n.IP.IsLoopback() && !n.IP.IsLinkLocalUnicast() {
			return n.IP
		}
	}
	return nil
}

// TestListenAddressServes runs the command on a non-loopback address, as
// given and as a wildcard: a request for that address is answered, one
// for another name is not.
func TestListenAddressServes(t *testing.T) {
	t.Parallel()
	ip := nonLoopbackIP()
	if ip == nil {
		t.Skip("this machine has no address other than loopback")
	}
	f := newTestFleet(t)
	for _, addr := range []string{ip.String() + ":0", "0.0.0.0:0"} {
		t.Run(addr, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			ready := make(chan string, 1)
			exit := make(chan int, 1)
			var stderr logbuf.Buffer
			go func() {
				exit <- run(ctx, []string{"--addr", addr, "--insecure", "--log-level", "warn", "--nats", f.srv.URL()}, func(string) string { return "" }, &stderr, ready)
			}()
			var got string
			select {
			case got = <-ready:
			case code := <-exit:
				t.Fatalf("exit %d: %s", code, stderr.String())
			}
			_, port, _ := net.SplitHostPort(got)
			base := "http://" + net.JoinHostPort(ip.String(), port)
			hc := &http.Client{Timeout: 10 * time.Second}
			get := func(host string) int {
				req, _ := http.NewRequest("GET", base+"/api/session", nil)
				req.Host = host
				resp, err := hc.Do(req)
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
				return resp.StatusCode
			}
			if code := get(net.JoinHostPort(ip.String(), port)); code != http.StatusOK {
				t.Errorf("the listen address %s:%s: %d", ip, port, code)
			}
			if code := get("evil.example:" + port); code != http.StatusMisdirectedRequest {
				t.Errorf("another name: %d", code)
			}
			hc.CloseIdleConnections()
			cancel()
			if code := <-exit; code != 0 {
				t.Errorf("exit %d: %s", code, stderr.String())
			}
		})
	}
}

// TestOriginChecked: a request carrying Origin is answered only when that
// origin is the console's own (scheme, name and port): pages of another
// site, another port of localhost, or the wrong scheme are refused, on
// reads and on control.
func TestOriginChecked(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	public, err := parsePublicHosts([]string{"https://console.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	c := newConsole(t, f, serverConfig{AllowControl: true, PublicHosts: public})
	p := c.port()
	tok := c.csrfToken(t)
	steer := func(host, origin string) answer {
		h := http.Header{"Content-Type": {"application/json"}, "X-CSRF-Token": {tok}}
		if origin != "" {
			h.Set("Origin", origin)
		}
		// An abort of a run nobody submitted: 202 once past the checks.
		return c.doAs(t, "POST", "/api/runs/origin-none/abort", host, h, `{}`)
	}
	for _, tc := range []struct{ host, origin string }{
		{"127.0.0.1:" + p, "https://evil.example"},
		{"127.0.0.1:" + p, "http://evil.example:" + p},
		{"127.0.0.1:" + p, "http://127.0.0.1:1"},    // another local server's page
		{"127.0.0.1:" + p, "http://localhost:" + p}, // not the page's own origin
		{"127.0.0.1:" + p, "https://127.0.0.1:" + p},
		{"127.0.0.1:" + p, "null"},
		{"127.0.0.1:" + p, "http://127.0.0.1:" + p + "/path"},
		{"console.example.com", "http://console.example.com"}, // https only
		{"console.example.com", "https://console.example.com:8443"},
		{"console.example.com", "https://evil.example"},
	} {
		if a := steer(tc.host, tc.origin); a.code != http.StatusForbidden || !strings.Contains(a.body, "cross-origin request refused") {
			t.Errorf("Host %s Origin %s: %d %s", tc.host, tc.origin, a.code, clip(a.body))
		}
		// Reads too: a page of another origin gets nothing.
		h := http.Header{"Origin": {tc.origin}}
		if a := c.doAs(t, "GET", "/api/session", tc.host, h, ""); a.code != http.StatusForbidden || strings.Contains(a.body, tok) {
			t.Errorf("GET /api/session Host %s Origin %s: %d %s", tc.host, tc.origin, a.code, clip(a.body))
		}
	}
	for _, tc := range []struct{ host, origin string }{
		{"127.0.0.1:" + p, ""},
		{"127.0.0.1:" + p, "http://127.0.0.1:" + p},
		{"localhost:" + p, "http://localhost:" + p},
		{"localhost:9000", "http://localhost:9000"}, // an SSH tunnel
		{"[::1]:" + p, "http://[::1]:" + p},
		{"console.example.com", "https://console.example.com"},
		{"console.example.com", "https://console.example.com:443"},
		// A proxy that sends the console its own address as Host.
		{"127.0.0.1:" + p, "https://console.example.com"},
	} {
		if a := steer(tc.host, tc.origin); a.code != http.StatusAccepted {
			t.Errorf("Host %s Origin %s: %d %s", tc.host, tc.origin, a.code, clip(a.body))
		}
	}
}

// htpasswdAuth is basic auth with these users, each with password "pw".
func htpasswdAuth(t *testing.T, users ...string) *auth {
	t.Helper()
	hash, err := bcrypt.GenerateFromPassword([]byte("pw"), bcrypt.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	for _, u := range users {
		b.WriteString(u + ":" + string(hash) + "\n")
	}
	file := filepath.Join(t.TempDir(), "htpasswd")
	if err := os.WriteFile(file, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	a, err := loadAuth(file, "")
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// openStream opens a run's event stream as user ("" sends no credentials)
// from local address from ("" any); it returns the response, open or
// refused.
func (c *console) openStream(t *testing.T, run, user, from string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest("GET", c.URL+"/api/runs/"+run+"/events", nil)
	if user != "" {
		req.SetBasicAuth(user, "pw")
	}
	hc := c.Client()
	if from != "" {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(from)}}
		hc = &http.Client{Transport: &http.Transport{DialContext: d.DialContext, DisableKeepAlives: true}}
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { resp.Body.Close() })
	return resp
}

// waitStreams waits until the console holds n event streams.
func (c *console) waitStreams(t *testing.T, n int) {
	t.Helper()
	c.waitLimiter(t, fmt.Sprintf("%d event streams open", n), func(open, _ int) bool { return open == n })
}

// waitLimiter waits until the stream caps' state satisfies ok.
func (c *console) waitLimiter(t *testing.T, what string, ok func(open, refusals int) bool) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		open, refusals, changed := c.s.streams.state()
		if ok(open, refusals) {
			return
		}
		select {
		case <-changed:
		case <-deadline:
			t.Fatalf("waiting for %s: %d open, %d refused", what, open, refusals)
		}
	}
}

// eventConsumers is the number of consumers on AGENTS_EVENTS.
func eventConsumers(t *testing.T, f *testFleet) int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := f.c.Stream(ctx, f.c.Names().EventsStream())
	if err != nil {
		t.Fatal(err)
	}
	info, err := st.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return info.State.Consumers
}

func refused503(t *testing.T, what string, resp *http.Response, want string) {
	t.Helper()
	if resp.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("%s: %d, want 503", what, resp.StatusCode)
		return // an open stream: its body never ends
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") || !strings.Contains(string(b), want) {
		t.Errorf("%s: %d Retry-After %q %s", what, resp.StatusCode, resp.Header.Get("Retry-After"), b)
	}
}

// TestStreamCapsPerUserAndTotal: past the per-client cap (per basic-auth
// user) and the total cap, a stream gets a 503 with Retry-After and no
// consumer is made; closing a stream frees its place.
func TestStreamCapsPerUserAndTotal(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	var log logbuf.Buffer
	c := newConsole(t, f, serverConfig{Auth: htpasswdAuth(t, "alice", "bob", "carol"), MaxStreams: 3, MaxStreamsPerClient: 2,
		Logger: slog.New(slog.NewTextHandler(&log, nil))})
	base := eventConsumers(t, f)
	open := func(user string) *http.Response {
		t.Helper()
		r := c.openStream(t, "caps-quiet", user, "")
		if r.StatusCode != http.StatusOK {
			t.Fatalf("%s's stream: %d", user, r.StatusCode)
		}
		return r
	}
	a1 := open("alice")
	open("alice")
	refused503(t, "alice's third", c.openStream(t, "caps-quiet", "alice", ""), "--max-streams-per-client")
	open("bob")
	refused503(t, "carol's first past the total", c.openStream(t, "caps-quiet", "carol", ""), "--max-streams)")
	c.waitStreams(t, 3)
	if n := eventConsumers(t, f); n > base+3 {
		t.Errorf("%d consumers on the events stream, at most %d expected", n, base+3)
	}
	if !strings.Contains(log.String(), "event streams refused") {
		t.Errorf("no log line about the refused streams:\n%s", log.String())
	}
	a1.Body.Close()
	c.waitStreams(t, 2)
	open("carol")
	if r := c.openStream(t, "caps-quiet", "alice", ""); r.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("alice past the total again: %d", r.StatusCode)
	}
}

// TestStreamCapsPerAddress: without users the per-client cap counts the
// client's address; a flood from one address makes no more consumers than
// the cap, and another address still gets its streams.
func TestStreamCapsPerAddress(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{MaxStreams: 10, MaxStreamsPerClient: 4})
	base := eventConsumers(t, f)
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[int]int{}
	var bodies []io.Closer
	for range 40 {
		wg.Go(func() {
			req, _ := http.NewRequest("GET", c.URL+"/api/runs/caps-flood/events", nil)
			hc := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
			resp, err := hc.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			codes[resp.StatusCode]++
			bodies = append(bodies, resp.Body)
			mu.Unlock()
		})
	}
	wg.Wait()
	if codes[http.StatusOK] != 4 || codes[http.StatusServiceUnavailable] != 36 {
		t.Errorf("40 streams from one address: %v, want 4 open and 36 refused", codes)
	}
	if n := eventConsumers(t, f); n > base+4 {
		t.Errorf("%d consumers on the events stream, at most %d expected", n, base+4)
	}
	// 127.0.0.2 is another client (all of 127/8 is this machine).
	if r := c.openStream(t, "caps-flood", "", "127.0.0.2"); r.StatusCode != http.StatusOK {
		t.Errorf("another address: %d", r.StatusCode)
	}
	for _, b := range bodies {
		b.Close()
	}
	c.waitStreams(t, 1)
	if n := eventConsumers(t, f); n > base+1 {
		t.Errorf("%d consumers on the events stream after the streams closed, at most %d expected", n, base+1)
	}
}

// TestStreamCapsPerIPv6Prefix: without users an IPv6 client counts by its
// address's /64 (a host commonly has a whole /64: one stream per address
// bounded nothing), an IPv4 client by its address; another /64 is another
// client.
func TestStreamCapsPerIPv6Prefix(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	// The test gives each request its client address (RemoteAddr), as
	// the listener would.
	c := newConsoleWith(t, f, serverConfig{MaxStreams: 20, MaxStreamsPerClient: 2}, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			r.RemoteAddr = r.Header.Get("X-Test-Remote-Addr")
			h.ServeHTTP(w, r)
		})
	})
	open := func(from string) *http.Response {
		t.Helper()
		req, _ := http.NewRequest("GET", c.URL+"/api/runs/caps-v6/events", nil)
		req.Header.Set("X-Test-Remote-Addr", from)
		resp, err := c.Client().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}
	for _, step := range []struct {
		from string
		want int
	}{
		{"[2001:db8:1:2::1]:50000", http.StatusOK},
		{"[2001:db8:1:2:aaaa:bbbb:cccc:dddd]:50001", http.StatusOK},
		{"[2001:db8:1:2:ffff::9]:50002", http.StatusServiceUnavailable}, // the same /64
		{"[fe80::1%eth0]:50003", http.StatusOK},
		{"[2001:db8:1:3::1]:50004", http.StatusOK}, // the next /64
		{"10.0.0.1:50005", http.StatusOK},
		{"10.0.0.1:50006", http.StatusOK},
		{"[::ffff:10.0.0.1]:50007", http.StatusServiceUnavailable}, // 10.0.0.1 again
		{"10.0.0.2:50008", http.StatusOK},
	} {
		resp := open(step.from)
		if resp.StatusCode != step.want {
			t.Errorf("a stream from %s: %d, want %d", step.from, resp.StatusCode, step.want)
		}
	}
	for in, want := range map[string]string{
		"[2001:db8:1:2:3:4:5:6]:1": "2001:db8:1:2::/64", "[fe80::1%eth0]:1": "fe80::/64",
		"[::ffff:192.0.2.7]:1": "192.0.2.7", "192.0.2.7:1": "192.0.2.7", "not an address": "not an address",
	} {
		if got := clientAddress(in); got != want {
			t.Errorf("clientAddress(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestTokenLoginChecked: ?token= sets the cookie only for the right token;
// the cookie is Secure when the console is reached over https: TLS, or a
// --public-host given as https:// (a proxy terminates TLS).
func TestTokenLoginChecked(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	const token = "0123456789abcdef-token"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ta, err := loadAuth("", file)
	if err != nil {
		t.Fatal(err)
	}
	public, err := parsePublicHosts([]string{"https://console.example.com", "plain.example.com"})
	if err != nil {
		t.Fatal(err)
	}
	login := func(c *console, host, tok string) *http.Response {
		t.Helper()
		hc := *c.Client()
		hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
		req, _ := http.NewRequest("GET", c.URL+"/fleet?token="+tok, nil)
		if host != "" {
			req.Host = host
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp
	}
	c := newConsole(t, f, serverConfig{Auth: ta, PublicHosts: public})
	for _, bad := range []string{"wrong", token + "x", token[:len(token)-1], ""} {
		if resp := login(c, "", bad); resp.StatusCode != http.StatusUnauthorized || len(resp.Cookies()) != 0 || resp.Header.Get("Set-Cookie") != "" {
			t.Errorf("?token=%s: %d %v", bad, resp.StatusCode, resp.Cookies())
		}
	}
	for _, tc := range []struct {
		c      *console
		host   string
		secure bool
	}{
		{c, "", false},
		{c, "plain.example.com", false},
		{c, "console.example.com", true},
		{startConsole(t, f, serverConfig{Auth: ta}, nil, true), "", true},
	} {
		resp := login(tc.c, tc.host, token)
		cs := resp.Cookies()
		if resp.StatusCode != http.StatusSeeOther || len(cs) != 1 || cs[0].Value != token || !cs[0].HttpOnly || cs[0].SameSite != http.SameSiteStrictMode || cs[0].Secure != tc.secure {
			t.Errorf("login via %s (Host %q): %d %v, want Secure=%v", tc.c.URL, tc.host, resp.StatusCode, resp.Header.Values("Set-Cookie"), tc.secure)
		}
	}
}

// TestTokenLoginRedirectsToThisSite: the login's redirect (the same page
// without the token) never names another site, whatever slashes and
// backslashes the path starts with (a protocol-relative Location
// "//evil.example/" was an open redirect); the rest of the query is kept.
func TestTokenLoginRedirectsToThisSite(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	const token = "0123456789abcdef-token"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	ta, err := loadAuth("", file)
	if err != nil {
		t.Fatal(err)
	}
	c := newConsole(t, f, serverConfig{Auth: ta})
	hc := *c.Client()
	hc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	for path, want := range map[string]string{
		"//evil.example/":       "/evil.example/",
		"///evil.example/x":     "/evil.example/x",
		"/%2Fevil.example/":     "/evil.example/",
		"/%2F%2Fevil.example/":  "/evil.example/",
		"/%5Cevil.example/":     "/evil.example/",
		"/%5C%5Cevil.example/":  "/evil.example/",
		"/%2F%5C/evil.example/": "/evil.example/",
		"/fleet":                "/fleet",
		"/runs/r1":              "/runs/r1",
		"/runs/r1?view=raw":     "/runs/r1?view=raw",
	} {
		sep := "?"
		if strings.Contains(path, "?") {
			sep = "&"
		}
		resp, err := hc.Get(c.URL + path + sep + "token=" + token)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		loc := resp.Header.Get("Location")
		if resp.StatusCode != http.StatusSeeOther || loc != want {
			t.Errorf("GET %s with the token: %d Location %q, want %q", path, resp.StatusCode, loc, want)
		}
		if u, err := url.Parse(strings.ReplaceAll(loc, "\\", "/")); err != nil || u.Host != "" || u.Scheme != "" {
			t.Errorf("GET %s with the token: Location %q names another site", path, loc)
		}
	}
}

// TestTrustFlags: --public-host and the stream caps, as flags and from
// the environment, and the values refused.
func TestTrustFlags(t *testing.T) {
	t.Parallel()
	env := map[string]string{}
	getenv := func(k string) string { return env[k] }
	var stderr bytes.Buffer
	o, err := parseFlags([]string{"--public-host", "a.example,https://b.example:8443", "--public-host", "c.example"}, getenv, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.publicHosts, " ") != "a.example https://b.example:8443 c.example" || o.maxStreams != 256 || o.maxPerClient != 16 {
		t.Errorf("flags: %+v", o)
	}
	env["AGENTS_CONSOLE_PUBLIC_HOST"] = "https://console.example.com, d.example"
	env["AGENTS_CONSOLE_MAX_STREAMS"] = "1000"
	env["AGENTS_CONSOLE_MAX_STREAMS_PER_CLIENT"] = "0"
	o, err = parseFlags(nil, getenv, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(o.publicHosts, " ") != "https://console.example.com d.example" || o.maxStreams != 1000 || o.maxPerClient != 0 {
		t.Errorf("environment: %+v", o)
	}
	ph, _ := parsePublicHosts(o.publicHosts)
	if got := fmt.Sprint(newHostPolicy("", ph).names()); got != "[https://console.example.com d.example]" {
		t.Errorf("names %s", got)
	}
	env = map[string]string{}
	for _, bad := range [][]string{{"--public-host", "ftp://x.example"}, {"--public-host", "https://x.example/path"},
		{"--public-host", "x.example:99999"}, {"--public-host", "user@x.example"}, {"--public-host", "*.example"},
		{"--max-streams", "-1"}, {"--max-streams-per-client", "-2"}} {
		if _, err := parseFlags(bad, getenv, &stderr); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	env["AGENTS_CONSOLE_MAX_STREAMS"] = "many"
	if _, err := parseFlags(nil, getenv, &stderr); err == nil || !strings.Contains(err.Error(), "AGENTS_CONSOLE_MAX_STREAMS") {
		t.Errorf("a bad AGENTS_CONSOLE_MAX_STREAMS: %v", err)
	}
}

// TestBrowserFollowsAfterARefusedStream: a run page whose event stream is
// refused (the console holds its --max-streams) tries again, and shows
// the run once a place is free.
func TestBrowserFollowsAfterARefusedStream(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{MaxStreams: 1})
	id := f.submit(slowText("refused-page", "shown after the refusal"))
	c.waitRun(t, id, func(r bus.RunRecord) bool { return r.Finished() })
	hold := c.openStream(t, "refused-quiet", "", "")
	b := newBrowser(t, c.URL)
	page := b.tab()
	b.open(page, "/runs/"+id)
	c.waitLimiter(t, "the page's stream refused", func(_, refusals int) bool { return refusals > 0 })
	if eval[bool](b, page, `document.getElementById("transcript").dataset.ended === "true"`) {
		t.Fatal("the page got the run's events while its stream was refused")
	}
	hold.Body.Close()
	b.do(page, "the page follows once a place is free",
		wait(`document.getElementById("transcript").dataset.ended === "true"`),
		wait(`document.getElementById("transcript").textContent.includes("shown after the refusal")`))
	b.checkConsole()
}
