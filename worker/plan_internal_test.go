package worker

import (
	"testing"

	"github.com/agentfleet/agentfleet/bus"
)

// The request's faux script shapes the faux model: chunk size and pace.
func TestFauxOptionsFromTheScript(t *testing.T) {
	t.Parallel()
	for _, fixed := range []bool{true, false} {
		o := fauxOptions(&bus.FauxScript{TokenSize: 4, TokensPerSecond: 40, FixedPace: fixed})
		if o.TokenSize != 4 || o.TokensPerSecond != 40 || o.FixedPace != fixed {
			t.Errorf("fixedPace %v: %+v", fixed, o)
		}
	}
}
