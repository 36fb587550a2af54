// Package netsplit is a network partition for tests: a TCP proxy to a
// NATS server that a test cuts, heals and stalls.
package netsplit

import (
	"context"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/bus"
)

// Proxy is a TCP proxy to a NATS server that a test cuts and heals: the
// client behind it loses its connection while the server, and other
// clients, go on.
type Proxy struct {
	ln     net.Listener
	target string
	mu     sync.Mutex
	cut    bool
	conns  []net.Conn
	wg     sync.WaitGroup
	// stalled: what goes through is dropped, the connections stay up;
	// swallowed is closed once something was.
	stalled   atomic.Bool
	swallowed chan struct{}
	swallow   sync.Once
}

// Start starts a proxy to target until the test ends.
func Start(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, swallowed: make(chan struct{})}
	p.wg.Go(p.accept)
	t.Cleanup(func() {
		_ = ln.Close()
		p.Cut()
		p.wg.Wait()
	})
	return p
}

// URL is the proxy's NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			_ = c.Close()
			_ = s.Close()
			continue
		}
		p.conns = append(p.conns, c, s)
		p.mu.Unlock()
		pipe := func(dst, src net.Conn) {
			buf := make([]byte, 32<<10)
			for {
				n, err := src.Read(buf)
				if n > 0 && p.stalled.Load() {
					p.swallow.Do(func() { close(p.swallowed) })
				} else if n > 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						break
					}
				}
				if err != nil {
					break
				}
			}
			_ = dst.Close()
			_ = src.Close()
		}
		p.wg.Go(func() { pipe(s, c) })
		p.wg.Go(func() { pipe(c, s) })
	}
}

// Cut closes every connection through the proxy and refuses new ones.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = true
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
}

// Heal lets connections through again.
func (p *Proxy) Heal() {
	p.mu.Lock()
	p.cut = false
	p.mu.Unlock()
}

// Connect connects a client through the proxy, reconnecting quickly; it
// closes with the test.
func (p *Proxy) Connect(ctx context.Context, t testing.TB) *bus.Client {
	t.Helper()
	c, err := bus.Connect(ctx, bus.ConnectOptions{URL: p.URL(),
		NATSOptions: []nats.Option{nats.ReconnectWait(20 * time.Millisecond)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

// Stall drops what goes through either way from now on, leaving the
// connections up: a request sent then gets no answer, and its sender
// does not know the connection is gone until Cut.
func (p *Proxy) Stall() { p.stalled.Store(true) }

// Unstall forwards again.
func (p *Proxy) Unstall() { p.stalled.Store(false) }

// Swallowed is closed once a stall dropped something.
func (p *Proxy) Swallowed() <-chan struct{} { return p.swallowed }

// WaitStatus waits until nc reaches status (a reconnect's end, or its
// start).
func WaitStatus(t testing.TB, nc *nats.Conn, status nats.Status) {
	t.Helper()
	ch := nc.StatusChanged(status)
	defer nc.RemoveStatusListener(ch)
	if nc.Status() == status {
		return
	}
	select {
	case <-ch:
	case <-time.After(20 * time.Second):
		t.Fatalf("connection %v, want %v", nc.Status(), status)
	}
}
