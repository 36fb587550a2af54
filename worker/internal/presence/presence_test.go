package presence

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// Bound cuts long descriptions and keeps as many tools as the entry's
// bounds allow, in order, saying how many it left out.
func TestBoundKeepsTheEntryWithinItsLimits(t *testing.T) {
	long := strings.Repeat("é", bus.MaxPresenceDescription)
	all := make([]bus.PresenceTool, bus.MaxPresenceTools+10)
	for i := range all {
		all[i] = bus.PresenceTool{Name: "t" + strings.Repeat("x", i%7), Source: "builtin", Description: long, Available: true}
	}
	tools, truncated, omitted := Bound(all)
	if !truncated || omitted == 0 || len(tools)+omitted != len(all) {
		t.Fatalf("kept %d, truncated %v, omitted %d of %d", len(tools), truncated, omitted, len(all))
	}
	size := 0
	for _, tl := range tools {
		if len(tl.Description) > bus.MaxPresenceDescription+len("…") {
			t.Fatalf("a description of %d bytes", len(tl.Description))
		}
		b, _ := json.Marshal(tl)
		size += len(b) + 1
	}
	if size > bus.MaxPresenceToolBytes || len(tools) > bus.MaxPresenceTools {
		t.Fatalf("%d tools of %d bytes, over the bounds", len(tools), size)
	}
	if got, tr, om := Bound(all[:2]); len(got) != 2 || !tr || om != 0 {
		t.Fatalf("two tools: kept %d, truncated %v, omitted %d", len(got), tr, om)
	}
}
