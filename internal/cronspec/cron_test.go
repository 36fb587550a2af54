package cronspec

import (
	"testing"
	"time"
)

// Prev is the latest fire time at or before t: the inverse of Next's
// step, also for rare patterns (a leap day's hour) and in a time zone.
func TestPrev(t *testing.T) {
	berlin, err := time.LoadLocation("Europe/Berlin")
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 7, 18, 1, 28, 500e6, time.UTC) // a Monday
	for _, c := range []struct {
		pattern string
		loc     *time.Location
		want    time.Time
	}{
		{"* * * * * *", nil, time.Date(2026, 12, 7, 18, 1, 28, 0, time.UTC)},
		{"*/2 * * * * *", nil, time.Date(2026, 12, 7, 18, 1, 28, 0, time.UTC)},
		{"0 0 9 * * MON", berlin, time.Date(2026, 12, 7, 8, 0, 0, 0, time.UTC)},
		{"* * 3 29 2 *", nil, time.Date(2024, 2, 29, 3, 59, 59, 0, time.UTC)},
		{"@daily", nil, time.Date(2026, 12, 7, 0, 0, 0, 0, time.UTC)},
	} {
		got, err := Prev(c.pattern, c.loc, at)
		if err != nil || !got.Equal(c.want) {
			t.Errorf("Prev(%q) = %v %v, want %v", c.pattern, got, err, c.want)
		}
		if next, err := Next(c.pattern, c.loc, got); err != nil || !next.After(at) {
			t.Errorf("Next(%q, %v) = %v %v: not after %v", c.pattern, got, next, err, at)
		}
	}
	if _, err := Prev("* * * 31 2 *", nil, at); err == nil {
		t.Error("a pattern that never fires has a previous time")
	}
}
