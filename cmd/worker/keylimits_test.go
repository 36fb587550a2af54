package main

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/worker"
)

// --concurrency-key-limit takes pattern=N entries in order and names the
// bad one.
func TestParseKeyLimits(t *testing.T) {
	got, err := parseKeyLimits([]string{"customer-*=2", " vip-* = 5"})
	if err != nil || len(got) != 2 || got[0] != (worker.KeyLimit{Pattern: "customer-*", Limit: 2}) || got[1] != (worker.KeyLimit{Pattern: "vip-*", Limit: 5}) {
		t.Fatalf("%+v, %v", got, err)
	}
	for _, bad := range []string{"customer-*", "=2", "x=0", "x=20000", "[=1"} {
		if _, err := parseKeyLimits([]string{bad}); err == nil || !strings.Contains(err.Error(), "--concurrency-key-limit") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
