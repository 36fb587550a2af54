package bus

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// TestListQueuedRunPickedUpBeforeTheQueuedRead: a run picked up between a
// first page's read of the records' top and its read of the queued runs
// has neither a request without a record nor a record at or below top. It
// is listed once all the same, paging with the queued cursor.
func TestListQueuedRunPickedUpBeforeTheQueuedRead(t *testing.T) {
	ctx, c := ownServerClient(t)
	kv, err := c.Records(ctx)
	if err != nil {
		t.Fatal(err)
	}
	seqs := map[string]uint64{}
	for _, id := range []string{"q1", "q2", "q3", "q4", "q5"} {
		res, err := c.Submit(ctx, "", &RunRequest{ID: id, Prompt: "hi"})
		if err != nil {
			t.Fatal(err)
		}
		seqs[id] = res.Seq
	}
	done := false
	c.beforeListQueued = func() {
		if done {
			return
		}
		done = true // a worker picks q1 up
		data, _ := json.Marshal(RunRecord{ID: "q1", Queue: "default", State: StateRunning, RequestSeq: seqs["q1"], HeartbeatAt: time.Now()})
		if _, err := kv.Put(ctx, "q1", data); err != nil {
			t.Error(err)
		}
	}
	seen := map[string]int{}
	var order []string
	cursor := ""
	for page := 0; page < 20; page++ {
		p, err := c.ListPage(ctx, ListOptions{Limit: 2, Cursor: cursor})
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range p.Records {
			seen[r.ID]++
			order = append(order, fmt.Sprintf("%s:%s", r.ID, r.State))
		}
		if p.NextCursor == "" {
			break
		}
		cursor = p.NextCursor
	}
	for _, id := range []string{"q1", "q2", "q3", "q4", "q5"} {
		if seen[id] != 1 {
			t.Errorf("%s listed %d times (order %v)", id, seen[id], order)
		}
	}
}
