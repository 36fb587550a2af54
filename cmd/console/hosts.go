package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
)

// DNS rebinding: a page on a name the attacker controls can make that name
// resolve to 127.0.0.1, and the browser then treats the console as the
// page's own origin, cookies and CSRF token included. The one thing the
// attacker cannot change is the name the browser sends in Host, so the
// console answers only the names it knows: localhost, loopback literals,
// its listen address and the operator's --public-host names.

// publicHost is one --public-host: a name (or address) the console is
// reached by, with the scheme and port when the operator gave them.
type publicHost struct {
	scheme string // "http", "https", or "" for either
	host   string // lower case, no trailing dot, IPv6 without brackets
	port   string // "" for any; the scheme's default when a scheme is given
}

// String is the flag value it was parsed from, normalised.
func (p publicHost) String() string {
	h := p.host
	if strings.Contains(h, ":") {
		h = "[" + h + "]"
	}
	if p.port != "" && p.port != defaultPort(p.scheme) {
		h += ":" + p.port
	}
	if p.scheme != "" {
		return p.scheme + "://" + h
	}
	return h
}

func defaultPort(scheme string) string {
	switch scheme {
	case "http":
		return "80"
	case "https":
		return "443"
	}
	return ""
}

// parsePublicHosts reads --public-host values: host, host:port,
// http://host[:port] or https://host[:port].
func parsePublicHosts(vals []string) ([]publicHost, error) {
	var out []publicHost
	for _, v := range vals {
		p, err := parsePublicHost(v)
		if err != nil {
			return nil, fmt.Errorf("--public-host %q: %w", clip(v), err)
		}
		out = append(out, p)
	}
	return out, nil
}

func parsePublicHost(v string) (publicHost, error) {
	raw := v
	scheme := ""
	if s, rest, ok := strings.Cut(v, "://"); ok {
		scheme = strings.ToLower(s)
		if scheme != "http" && scheme != "https" {
			return publicHost{}, errors.New("the scheme must be http or https")
		}
		raw = rest
	}
	u, err := url.Parse("http://" + raw)
	if err != nil {
		return publicHost{}, errors.New("use host, host:port or https://host[:port]")
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return publicHost{}, errors.New("only a scheme, a host and a port: no user, path or query")
	}
	p := publicHost{scheme: scheme, host: normHost(u.Hostname()), port: u.Port()}
	if p.host == "" || strings.ContainsAny(p.host, "*/ ") {
		return publicHost{}, errors.New("no host name")
	}
	if p.port != "" {
		if n, err := strconv.Atoi(p.port); err != nil || n < 1 || n > 65535 {
			return publicHost{}, errors.New("the port must be 1 to 65535")
		}
	} else {
		p.port = defaultPort(scheme)
	}
	return p, nil
}

// normHost lower-cases a host name and drops a trailing dot and IPv6
// brackets, so that one name has one spelling.
func normHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// splitHost splits a Host header (or an Origin's host) into name and port
// ("" when it has none).
func splitHost(hostport string) (host, port string) {
	if h, p, err := net.SplitHostPort(hostport); err == nil {
		return normHost(h), p
	}
	return normHost(hostport), ""
}

// hostPolicy is which Host and Origin the console answers.
type hostPolicy struct {
	// listenHost is --addr's host when it names one interface or name
	// (not 0.0.0.0 or ::); "" otherwise.
	listenHost string
	public     []publicHost
}

func newHostPolicy(listenAddr string, public []publicHost) hostPolicy {
	hp := hostPolicy{public: public}
	if h, _, err := net.SplitHostPort(listenAddr); err == nil {
		h = normHost(h)
		if ip := net.ParseIP(h); h != "" && (ip == nil || !ip.IsUnspecified()) {
			hp.listenHost = h
		}
	}
	return hp
}

// local reports whether a host name is the console's own: localhost, a
// loopback literal, the listen address, or the address the client
// connected to (a wildcard listen address answers on each interface's
// address). Any port: an SSH tunnel or a port mapping changes it, and
// the rebinding attack needs a name, not a port.
func (hp hostPolicy) local(host string, r *http.Request) bool {
	if host == "localhost" || (hp.listenHost != "" && host == hp.listenHost) {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	if ip.IsLoopback() {
		return true
	}
	if la, ok := r.Context().Value(http.LocalAddrContextKey).(*net.TCPAddr); ok && la.IP.Equal(ip) {
		return true
	}
	return false
}

// publicFor returns the --public-host a Host header names.
func (hp hostPolicy) publicFor(hostHeader string) (publicHost, bool) {
	host, port := splitHost(hostHeader)
	for _, p := range hp.public {
		if p.host != host {
			continue
		}
		switch {
		case p.port == "" || p.port == port:
			return p, true
		case port == "" && (p.port == defaultPort(p.scheme) || (p.scheme == "" && (p.port == "80" || p.port == "443"))):
			return p, true
		}
	}
	return publicHost{}, false
}

// hostAllowed reports whether the console answers a request's Host.
func (hp hostPolicy) hostAllowed(r *http.Request) bool {
	if r.Host == "" {
		return false
	}
	if _, ok := hp.publicFor(r.Host); ok {
		return true
	}
	host, _ := splitHost(r.Host)
	return hp.local(host, r)
}

// originAllowed reports whether an Origin header names one of the
// console's own origins: a --public-host (its scheme and port when given),
// or, for a local name, exactly the origin of the request itself (the
// same scheme, name and port as its Host), never another site or another
// port of localhost.
func (hp hostPolicy) originAllowed(origin string, r *http.Request) bool {
	u, err := url.Parse(origin)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil || (u.Path != "" && u.Path != "/") {
		return false
	}
	host, port := normHost(u.Hostname()), u.Port()
	if port == "" {
		port = defaultPort(u.Scheme)
	}
	for _, p := range hp.public {
		if p.host == host && (p.scheme == "" || p.scheme == u.Scheme) && (p.port == "" || p.port == port) {
			return true
		}
	}
	if !hp.local(host, r) {
		return false
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	rh, rp := splitHost(r.Host)
	if rp == "" {
		rp = defaultPort(scheme)
	}
	return u.Scheme == scheme && rh == host && rp == port
}

// secure reports whether the browser reached the console over https: the
// request came over TLS, or its Host is a --public-host given as https://
// (a proxy in front terminates TLS). X-Forwarded-Proto is not trusted: any
// client can send it.
func (hp hostPolicy) secure(r *http.Request) bool {
	if r.TLS != nil {
		return true
	}
	p, ok := hp.publicFor(r.Host)
	return ok && p.scheme == "https"
}

// refuseHost answers a request for a name the console does not answer to.
func refuseHost(w http.ResponseWriter, r *http.Request) {
	host, _ := splitHost(r.Host)
	text := fmt.Sprintf("421 misdirected request: this console does not answer to Host %q.\n"+
		"It answers to localhost, loopback addresses, its --addr and the names given with --public-host (AGENTS_CONSOLE_PUBLIC_HOST).\n"+
		"If this console is served as %q, start it with --public-host %s (or https://%s behind a TLS proxy).\n",
		clip(r.Host), clip(host), clip(host), clip(host))
	http.Error(w, text, http.StatusMisdirectedRequest)
}

// refuseOrigin answers a request sent by a page of another origin.
func refuseOrigin(w http.ResponseWriter, origin string) {
	text := fmt.Sprintf("403 forbidden: cross-origin request refused: Origin %q is not this console's.\n"+
		"If the console's pages are served from it, start the console with --public-host %s (AGENTS_CONSOLE_PUBLIC_HOST).\n",
		clip(origin), clip(origin))
	http.Error(w, text, http.StatusForbidden)
}

// clip bounds a client-chosen string quoted in an answer or a log line.
func clip(s string) string {
	if len(s) > 100 {
		return s[:100] + "..."
	}
	return s
}

// names lists the --public-host values, for the start log line.
func (hp hostPolicy) names() []string {
	out := make([]string, 0, len(hp.public))
	for _, p := range hp.public {
		out = append(out, p.String())
	}
	return out
}
