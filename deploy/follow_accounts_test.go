package deploy

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// TestAccountsFollowNoSuchRun: every role of accounts.conf that follows
// runs is told that a run does not exist (bus.ErrRunNotFound, protocol §4)
// instead of waiting for ever. The follower's look for the run's last
// stored event is a STREAM.MSG.GET of AGENTS_EVENTS: a role without it
// waited out every look's timeout (a permissions violation, no answer),
// never decided, and followed for ever.
func TestAccountsFollowNoSuchRun(t *testing.T) {
	url, pw, slog := accountsServerLog(t)
	wc := connectAs(t, url, "worker", pw["worker"])
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := wc.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, role := range []string{"worker", "submitter", "observer", "approver", "console"} {
		c := connectAs(t, url, role, pw[role])
		c.SetFollowStall(100 * time.Millisecond)
		wg.Go(func() {
			// A few stall intervals suffice; a look waiting out its
			// timeout (2 s) for an answer that never comes does not.
			fctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			var last error
			for _, err := range c.Follow(fctx, "no-such-run-"+role) {
				last = err
			}
			if !errors.Is(last, bus.ErrRunNotFound) {
				t.Errorf("%s: following a run that does not exist ended with %v, want ErrRunNotFound", role, last)
			}
		})
	}
	wg.Wait()
	for _, line := range slog.Lines("Violation") {
		t.Errorf("server: %s", line)
	}
}
