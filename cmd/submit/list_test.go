package main

import (
	"testing"
	"time"
)

func TestParseListBound(t *testing.T) {
	now := time.Now()
	if tm, _, _, err := parseListBound("1h", false); err != nil || tm.After(now.Add(-time.Hour+time.Minute)) || tm.Before(now.Add(-time.Hour-time.Minute)) {
		t.Errorf("1h: %v %v", tm, err)
	}
	if tm, _, _, err := parseListBound("2026-11-29T18:00:00Z", false); err != nil || !tm.Equal(time.Date(2026, 11, 29, 18, 0, 0, 0, time.UTC)) {
		t.Errorf("rfc3339: %v %v", tm, err)
	}
	if _, seq, _, err := parseListBound("@42", true); err != nil || seq != 42 {
		t.Errorf("@42: %d %v", seq, err)
	}
	if _, _, run, err := parseListBound("run-7", true); err != nil || run != "run-7" {
		t.Errorf("run: %q %v", run, err)
	}
	for _, bad := range []struct {
		v        string
		allowRun bool
	}{{"run-7", false}, {"@0", true}, {"@x", true}, {"a.b", true}, {"-1h", false}} {
		if _, _, _, err := parseListBound(bad.v, bad.allowRun); err == nil {
			t.Errorf("%q (run allowed %v) accepted", bad.v, bad.allowRun)
		}
	}
}
