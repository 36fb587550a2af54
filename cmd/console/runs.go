package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

// The runs page reads the records with bus.ListPage, the bounded listing
// of `submit list` (docs/protocol.md §7): newest write first, a page at a
// time, backwards from a cursor. Its cost is the records between a page's
// ends, not the bucket's size, so a console restarted on a week of history
// lists it all.

const (
	defaultPageSize = 50
	maxPageSize     = 500
	// listScan bounds the records one page reads: a filter that matches
	// few records stops there, says "scanned N of M", and goes on from
	// its cursor when asked.
	listScan = 10_000
)

// runsPage is the body of GET /api/runs.
type runsPage struct {
	// Version changes whenever a record is written: pass it as ?after= to
	// wait for the next write (the first page stays live that way).
	Version uint64          `json:"version"`
	Runs    []bus.RunRecord `json:"runs"`
	// Next is the cursor of the next (older) page, "" at the end: a
	// records-stream sequence, or a place in the queued runs (bus.ListPage).
	Next string `json:"next,omitempty"`
	// Scanned of Stored: the records this page read, of the bucket's.
	Scanned int    `json:"scanned"`
	Stored  uint64 `json:"stored"`
	// Truncated: the scan stopped at its bound before the page was full.
	Truncated bool `json:"truncated,omitempty"`
	Ready     bool `json:"ready"`
}

// listOptions reads the runs page's query: state, queue, model, tenant,
// meta (key=value, repeatable), q (part of the id or title), since and
// until (RFC 3339), before (a cursor), limit.
func listOptions(q map[string][]string) (bus.ListOptions, error) {
	get := func(k string) string {
		if v := q[k]; len(v) > 0 {
			return strings.TrimSpace(v[0])
		}
		return ""
	}
	o := bus.ListOptions{State: get("state"), Queue: get("queue"), Model: get("model"), Tenant: get("tenant"),
		Text: get("q"), Limit: defaultPageSize, MaxScan: listScan}
	if l := get("limit"); l != "" {
		n, err := strconv.Atoi(l)
		if err != nil || n < 1 {
			return o, badQuery("limit %q must be a positive number", l)
		}
		o.Limit = min(n, maxPageSize)
	}
	if b := get("before"); b != "" {
		if bus.CheckListCursor(b) != nil {
			return o, badQuery("before %q must be a page cursor", b)
		}
		o.Cursor = b
	}
	for _, kv := range q["meta"] {
		k, v, ok := strings.Cut(kv, "=")
		if k = strings.TrimSpace(k); !ok || k == "" {
			return o, badQuery("meta %q must be key=value", kv)
		}
		if o.Metadata == nil {
			o.Metadata = map[string]string{}
		}
		o.Metadata[k] = strings.TrimSpace(v)
	}
	for _, t := range []struct {
		name string
		to   *time.Time
	}{{"since", &o.Since}, {"until", &o.Before}} {
		if v := get(t.name); v != "" {
			ts, err := time.Parse(time.RFC3339, v)
			if err != nil {
				return o, badQuery("%s %q must be an RFC 3339 time", t.name, v)
			}
			*t.to = ts
		}
	}
	return o, nil
}

type queryError struct{ msg string }

func (e queryError) Error() string { return e.msg }

func badQuery(format string, args ...any) error {
	return queryError{msg: fmt.Sprintf(format, args...)}
}

func (s *server) listRuns(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	o, err := listOptions(q)
	o.MaxScan = s.listScan
	if err != nil {
		writeError(w, http.StatusBadRequest, "%v", err)
		return
	}
	if a := q.Get("after"); a != "" {
		after, err := strconv.ParseUint(a, 10, 64)
		if err != nil {
			writeError(w, http.StatusBadRequest, "after %q must be a version number", a)
			return
		}
		if !s.waitChange(r.Context(), after) {
			return
		}
	}
	v, _ := s.records.watchVersion()
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	page, err := s.client.ListPage(ctx, o)
	if err != nil {
		writeError(w, http.StatusBadGateway, "%v", err)
		return
	}
	out := runsPage{Version: v, Runs: page.Records, Next: page.NextCursor, Scanned: page.Scanned, Stored: page.Stored,
		Truncated: page.Truncated, Ready: s.records.isReady()}
	if out.Runs == nil {
		out.Runs = []bus.RunRecord{}
	}
	writeJSON(w, http.StatusOK, out)
}

// waitChange waits (up to the long-poll bound) until the records change
// after version; false when the client went away.
func (s *server) waitChange(ctx context.Context, after uint64) bool {
	t := time.NewTimer(s.longPoll)
	defer t.Stop()
	for {
		v, changed := s.records.watchVersion()
		if v != after {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
}
