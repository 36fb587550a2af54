package bus

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"testing"
	"time"
)

// rewriteClient is a client on its own server with n finished records
// r0000..r<n-1> (r0000 the oldest) and a put that writes a record.
func rewriteClient(t *testing.T, n int) (context.Context, *Client, func(id, state string, waiting bool) uint64) {
	t.Helper()
	ctx, c := ownServerClient(t)
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// These test the records walk: the listing of a fleet with no waiting
	// index (before 1.9).
	if err := c.js.DeleteStream(ctx, c.names.WaitingStream()); err != nil {
		t.Fatal(err)
	}
	put := func(id, state string, waiting bool) uint64 {
		t.Helper()
		r := RunRecord{ID: id, Queue: "default", State: state, HeartbeatAt: time.Now()}
		if waiting {
			r.Waiting = &Waiting{For: WaitingApproval, Since: time.Now()}
		}
		data, _ := json.Marshal(r)
		rev, err := kv.Put(ctx, id, data)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	for i := range n {
		put(fmt.Sprintf("r%04d", i), StatusSucceeded, false)
	}
	return ctx, c, put
}

// onFirstWindow runs f once, after a listing's first window is read.
func onFirstWindow(c *Client, f func()) {
	done := false
	c.afterListRange = func(uint64) {
		if !done {
			done = true
			f()
		}
	}
}

// TestListKeepsARecordRewrittenDuringTheScan: a waiting run heartbeats
// while a listing reads the bucket. Its record moves from below the scan
// to above where it began; the listing still has it, once, as written
// last. Before the catch-up, `submit approvals` missed a waiting run now
// and then.
func TestListKeepsARecordRewrittenDuringTheScan(t *testing.T) {
	t.Parallel()
	ctx, c, put := rewriteClient(t, 600)
	put("r0000", StateRunning, true) // the oldest write: the last window
	for i := range 300 {
		put(fmt.Sprintf("r%04d", 1+i), StatusFailed, false) // move 300 above it
	}
	var rev uint64
	onFirstWindow(c, func() { rev = put("r0000", StateRunning, true) })
	recs, err := c.List(ctx, ListOptions{State: StateWaiting})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].ID != "r0000" || recs[0].Revision != rev {
		t.Fatalf("waiting runs %v (want r0000 at revision %d)", recsOf(recs), rev)
	}
}

// TestListDropsTheOldCopyOfARecordRewrittenDuringTheScan: a record read
// before its rewrite is listed as rewritten, or not at all when it no
// longer matches (a run that finished meanwhile).
func TestListDropsTheOldCopyOfARecordRewrittenDuringTheScan(t *testing.T) {
	t.Parallel()
	ctx, c, put := rewriteClient(t, 300)
	put("r0299", StateRunning, true) // the newest write: the first window
	var rev uint64
	onFirstWindow(c, func() { rev = put("r0299", StateRunning, true) })
	recs, err := c.List(ctx, ListOptions{State: StateRunning})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 1 || recs[0].Revision != rev {
		t.Fatalf("running runs %v (want r0299 once, at revision %d)", recsOf(recs), rev)
	}
	onFirstWindow(c, func() { put("r0299", StatusSucceeded, false) })
	recs, err = c.List(ctx, ListOptions{State: StateRunning})
	if err != nil || len(recs) != 0 {
		t.Fatalf("running runs after r0299 finished: %v %v", recsOf(recs), err)
	}
}

// TestListPagesWithARecordRewrittenDuringTheFirstPage: paging lists every
// record once when the oldest is rewritten while the first page is read:
// it comes first, and the record it pushes off the page starts the next.
func TestListPagesWithARecordRewrittenDuringTheFirstPage(t *testing.T) {
	t.Parallel()
	const n = 300
	ctx, c, put := rewriteClient(t, n)
	onFirstWindow(c, func() { put("r0000", StateRunning, false) })
	var got []string
	var before uint64
	for {
		p, err := c.ListPage(ctx, ListOptions{Limit: 50, BeforeSeq: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Records) > 50 {
			t.Fatalf("a page of %d records", len(p.Records))
		}
		got = append(got, recsOf(p.Records)...)
		if p.Next == 0 {
			break
		}
		before = p.Next
	}
	want := []string{"r0000"}
	for i := n - 1; i >= 1; i-- {
		want = append(want, fmt.Sprintf("r%04d", i))
	}
	if !slices.Equal(got, want) {
		t.Fatalf("pages gave %d records (want %d): %v", len(got), len(want), got[:min(len(got), 8)])
	}
}

func recsOf(recs []RunRecord) []string {
	out := make([]string, len(recs))
	for i, r := range recs {
		out[i] = r.ID
	}
	return out
}

// TestAPageFilledByItsCatchUpIsNotTruncated: the scan's bound stopped it
// before a match, and the catch-up found one: the page is full, not cut
// short.
func TestAPageFilledByItsCatchUpIsNotTruncated(t *testing.T) {
	t.Parallel()
	ctx, c, put := rewriteClient(t, 300)
	put("r0000", StateRunning, true)
	for i := range 200 {
		put(fmt.Sprintf("r%04d", 1+i), StatusFailed, false)
	}
	onFirstWindow(c, func() { put("r0000", StateRunning, true) })
	p, err := c.ListPage(ctx, ListOptions{State: StateWaiting, Limit: 1, MaxScan: 10})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Records) != 1 || p.Records[0].ID != "r0000" || p.Truncated {
		t.Fatalf("page %v truncated %v, want r0000 and not truncated", recsOf(p.Records), p.Truncated)
	}
}

// TestListCatchesUpOverMoreThanOneWindow: more than a window of writes
// lands during the scan; the catch-up reads them all, in windows, none
// skipped or listed twice at a window's edge.
func TestListCatchesUpOverMoreThanOneWindow(t *testing.T) {
	t.Parallel()
	const n, during = 300, maxWindow + 10
	ctx, c, put := rewriteClient(t, n)
	onFirstWindow(c, func() {
		for i := range during {
			put(fmt.Sprintf("f%05d", i), StatusSucceeded, false)
		}
	})
	recs, err := c.List(ctx, ListOptions{Limit: n + during})
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for i := during - 1; i >= 0; i-- {
		want = append(want, fmt.Sprintf("f%05d", i))
	}
	for i := n - 1; i >= 0; i-- {
		want = append(want, fmt.Sprintf("r%04d", i))
	}
	if got := recsOf(recs); !slices.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Fatalf("listed %d records, want %d; they differ from index %d: %v", len(got), len(want), i, got[i:min(len(got), i+4)])
	}
}
