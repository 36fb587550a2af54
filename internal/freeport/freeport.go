// Package freeport picks TCP ports for tests that must know a server's
// port before it listens (a cluster's routes, a restart on the same port).
//
// Ports are picked below the kernel's ephemeral range: a port from that
// range can be taken by any outgoing connection (a cluster's routes, a
// client) between the pick and the bind, or while a server restarts on it;
// that once left a fault-suite node unable to bind its route port. Ports
// below the range are only ever bound on purpose.
package freeport

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// Pick returns a TCP port that was free a moment ago on 127.0.0.1.
func Pick(t testing.TB) int {
	t.Helper()
	return PickN(t, 1)[0]
}

// PickN returns n distinct free ports: each is held until all are
// picked, so none is returned twice. (Separate calls may repeat one not
// yet bound, at about 1 in 20,000 a pick.)
func PickN(t testing.TB, n int) []int {
	t.Helper()
	return pickN(t, n, EphemeralLow(), rand.IntN)
}

func pickN(t testing.TB, n, below int, intN func(int) int) []int {
	t.Helper()
	ports := make([]int, 0, n)
	for range n {
		ln, err := listenFree(below, intN)
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		ports = append(ports, ln.Addr().(*net.TCPAddr).Port)
	}
	return ports
}

const (
	// Lowest is the lowest port picked: those below are left to system
	// services.
	Lowest = 10000
	// defaultLow is used where the range cannot be read (only Linux's
	// is): it is Linux's default start, below macOS's and Windows' 49152,
	// but inside FreeBSD's default range (10000-65535), where a pick can
	// still be taken by an outgoing connection.
	defaultLow = 32768
)

// EphemeralLow is the first port of the kernel's ephemeral range: every
// pick is below it.
func EphemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return defaultLow
	}
	var low, high int
	if _, err := fmt.Sscan(string(b), &low, &high); err != nil {
		return defaultLow
	}
	return low
}

// listenFree listens on the first free port of [Lowest, below) from a
// random start (so that packages testing in parallel rarely try the same
// one); below <= Lowest (a range set unusually low) lets the kernel
// pick.
func listenFree(below int, intN func(int) int) (net.Listener, error) {
	if below <= Lowest {
		return net.Listen("tcp", "127.0.0.1:0")
	}
	span := below - Lowest
	start := intN(span)
	for i := range min(span, 1000) {
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", Lowest+(start+i)%span))
		if err == nil {
			return ln, nil
		}
	}
	return nil, fmt.Errorf("no free port in [%d, %d)", Lowest, below)
}
