package main

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// TestFleetReadsAreShared: GET /api/fleet lists the work queue's consumers
// and makes a consumer on the presence bucket; 500 concurrent requests
// share a few reads (one at a time, each answering for a second) instead
// of making 500 consumers, and every one is answered in full.
func TestFleetReadsAreShared(t *testing.T) {
	t.Parallel()
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{})
	// What each read asks the JetStream API, seen by a subscriber of the
	// same account.
	nc := f.c.Conn()
	creates, err := nc.SubscribeSync("$JS.API.CONSUMER.CREATE." + workersBucketStream(f.c.Names()) + ".>")
	if err != nil {
		t.Fatal(err)
	}
	lists, err := nc.SubscribeSync("$JS.API.CONSUMER.LIST." + f.c.Names().RunsStream())
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	const n = 500
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: n}}
	defer hc.CloseIdleConnections()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for range n {
		wg.Go(func() {
			resp, err := hc.Get(c.URL + "/api/fleet")
			if err != nil {
				errs <- err.Error()
				return
			}
			defer resp.Body.Close()
			var got fleetInfo
			if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
				errs <- resp.Status
				return
			}
			if len(got.Queues) != 2 || got.Workers == nil {
				errs <- "an answer without the fleet"
			}
		})
	}
	wg.Wait()
	took := time.Since(start)
	close(errs)
	bad := map[string]int{}
	for e := range errs {
		bad[e]++
	}
	if len(bad) > 0 {
		t.Errorf("%d concurrent requests: %v", n, bad)
	}
	// The console's API requests were fanned out to the subscriptions
	// before their answers; a round trip of the subscriber's own
	// connection then has them all in its queue.
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	nCreates, _, _ := creates.Pending()
	nLists, _, _ := lists.Pending()
	// One read per second at most, plus the one the first requests found
	// stale.
	limit := int(took/fleetFresh) + 2
	if nCreates > limit || nLists > limit || nCreates == 0 {
		t.Errorf("%d requests in %s made %d presence consumers and %d consumer listings, want 1..%d", n, took.Round(time.Millisecond), nCreates, nLists, limit)
	}
}

// workersBucketStream is the presence bucket's stream: KV_agents_workers.
func workersBucketStream(n bus.Names) string { return "KV_" + workersBucket(n) }

// TestFleetReadsOneAtATime: while a read is under way the other requests
// wait for it (not for a lock: one whose client left returns at once), and
// all get its answer; the read goes on when the request that started it
// leaves.
func TestFleetReadsOneAtATime(t *testing.T) {
	t.Parallel()
	started, release := make(chan struct{}), make(chan struct{})
	var reads atomic.Int32
	fr := &fleetReads{read: func(ctx context.Context) fleetInfo {
		if reads.Add(1) == 1 {
			close(started)
		}
		select {
		case <-release:
		case <-ctx.Done():
			return fleetInfo{Errors: []string{"the read was ended: " + ctx.Err().Error()}}
		}
		return fleetInfo{Errors: []string{"read"}}
	}}
	first, leave := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	answers := make(chan fleetInfo, 21)
	wg.Go(func() {
		info, _ := fr.get(first)
		answers <- info
	})
	<-started
	leave() // the first request's client leaves: its read goes on
	gone, cancel := context.WithCancel(context.Background())
	cancel()
	if _, ok := fr.get(gone); ok {
		t.Error("a request whose client left was answered")
	}
	for range 20 {
		wg.Go(func() {
			info, ok := fr.get(context.Background())
			if !ok {
				t.Error("a waiting request was not answered")
			}
			answers <- info
		})
	}
	close(release)
	wg.Wait()
	close(answers)
	for info := range answers {
		if len(info.Errors) != 1 || info.Errors[0] != "read" {
			t.Errorf("an answer: %v", info.Errors)
		}
	}
	if n := reads.Load(); n != 1 {
		t.Errorf("%d reads, want 1", n)
	}
}
