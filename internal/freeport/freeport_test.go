package freeport

import (
	"fmt"
	"net"
	"testing"
)

func TestPicksAreDistinctAndBelowTheEphemeralRange(t *testing.T) {
	low := EphemeralLow()
	if low <= Lowest {
		t.Skip("the ephemeral range starts too low to stay below it")
	}
	seen := map[int]bool{}
	for _, port := range PickN(t, 200) {
		if port < Lowest || port >= low {
			t.Fatalf("port %d, want in [%d, %d)", port, Lowest, low)
		}
		if seen[port] {
			t.Fatalf("port %d returned twice", port)
		}
		seen[port] = true
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			t.Fatalf("port %d is not free: %v", port, err)
		}
		ln.Close()
	}
}

// Every search starts at the same port: only holding each pick until all
// are picked keeps them distinct.
func TestPicksFromOneStartAreDistinct(t *testing.T) {
	low := EphemeralLow()
	if low <= Lowest {
		t.Skip("the ephemeral range starts too low to stay below it")
	}
	seen := map[int]bool{}
	for _, port := range pickN(t, 20, low, func(int) int { return 0 }) {
		if seen[port] {
			t.Fatalf("port %d returned twice", port)
		}
		seen[port] = true
	}
}

func TestPickSkipsATakenPort(t *testing.T) {
	// Hold a port, then start the search on it, at the range's end: the
	// search wraps to the range's start.
	held, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	taken := held.Addr().(*net.TCPAddr).Port
	if taken <= Lowest {
		t.Skip("the kernel gave a port below the range's start")
	}
	ln, err := listenFree(taken+1, func(span int) int { return span - 1 })
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	if port := ln.Addr().(*net.TCPAddr).Port; port == taken || port < Lowest || port > taken {
		t.Fatalf("port %d, want one in [%d, %d) other than the held %d", port, Lowest, taken+1, taken)
	}
}
