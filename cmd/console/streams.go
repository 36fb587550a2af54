package main

import (
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"time"
)

// Defaults of --max-streams and --max-streams-per-client. A browser opens
// at most six HTTP/1.1 connections to one host, so one person's browser
// holds at most six event streams; 16 leaves room for a second browser or
// a script. Each stream is one ordered consumer on the NATS server and two
// goroutines here: 256 is above the 200 followed runs of
// BenchmarkConsoleFollows200Runs and keeps a flood of connections from
// making more than that many consumers.
const (
	defaultMaxStreams          = 256
	defaultMaxStreamsPerClient = 16
)

// streamRetryAfter is the Retry-After of a refused stream, in seconds.
const streamRetryAfter = 5

// streamLogEvery bounds the log lines about refused streams: a flood of
// connections gives one line per interval, with the count.
const streamLogEvery = 10 * time.Second

// streamLimiter bounds the open event streams, in all and per client.
type streamLimiter struct {
	total, perClient int // 0: no bound
	log              *slog.Logger

	mu       sync.Mutex
	open     int
	byClient map[string]int
	changed  chan struct{} // closed and replaced on every change
	refused  int           // since the last log line
	loggedAt time.Time
	refusals int // since the start
}

func newStreamLimiter(total, perClient int, log *slog.Logger) *streamLimiter {
	return &streamLimiter{total: total, perClient: perClient, log: log, byClient: map[string]int{}, changed: make(chan struct{})}
}

// acquire takes a place for one stream of client. It returns the function
// that gives the place back, or the reason it was refused.
func (l *streamLimiter) acquire(client string) (release func(), refusal string) {
	l.mu.Lock()
	switch {
	case l.total > 0 && l.open >= l.total:
		refusal = fmt.Sprintf("too many open event streams on this console (%d, --max-streams)", l.total)
	case l.perClient > 0 && l.byClient[client] >= l.perClient:
		refusal = fmt.Sprintf("too many open event streams from this client (%d, --max-streams-per-client): close a run page", l.perClient)
	}
	if refusal != "" {
		l.refused++
		l.refusals++
		l.notify()
		now := time.Now()
		logNow := now.Sub(l.loggedAt) >= streamLogEvery
		n, open := l.refused, l.open
		if logNow {
			l.refused, l.loggedAt = 0, now
		}
		l.mu.Unlock()
		if logNow {
			l.log.Warn("event streams refused", "reason", refusal, "client", client, "open", open, "refused", n)
		}
		return nil, refusal
	}
	l.open++
	l.byClient[client]++
	l.notify()
	l.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			l.mu.Lock()
			l.open--
			if l.byClient[client]--; l.byClient[client] == 0 {
				delete(l.byClient, client)
			}
			l.notify()
			l.mu.Unlock()
		})
	}, ""
}

// notify wakes the waiters of state; l.mu is held.
func (l *streamLimiter) notify() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// state returns the open streams, the refusals since the start and a
// channel closed at the next change of either.
func (l *streamLimiter) state() (open, refusals int, changed <-chan struct{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.open, l.refusals, l.changed
}

// streamClient is who a stream counts against: the user when users are
// told apart (basic auth), else the client's address (no auth, or one
// token shared by everyone): an IPv4 address, or an IPv6 address's /64
// (one host is commonly given a whole /64, so counting its addresses one
// by one would bound nothing). Behind a proxy every address is the
// proxy's.
func (s *server) streamClient(r *http.Request) string {
	if s.auth != nil && s.auth.users != nil {
		return "user " + userOf(r)
	}
	return "address " + clientAddress(r.RemoteAddr)
}

// clientAddress is the client of a remote address: its IPv4 address
// (IPv4-mapped IPv6 included), or its IPv6 address's /64.
func clientAddress(remote string) string {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		return host
	}
	if a = a.WithZone("").Unmap(); a.Is6() {
		return netip.PrefixFrom(a, 64).Masked().String()
	}
	return a.String()
}

// refuseStream answers a stream over a cap.
func refuseStream(w http.ResponseWriter, refusal string) {
	w.Header().Set("Retry-After", fmt.Sprint(streamRetryAfter))
	http.Error(w, "503 service unavailable: "+refusal+"; try again later.", http.StatusServiceUnavailable)
}
