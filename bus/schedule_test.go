package bus

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// A bad schedule is refused with every problem named, the time zone's
// with @every in words a user can act on.
func TestScheduleValidateListsEveryProblem(t *testing.T) {
	s := &Schedule{Name: "a.b", Queue: "q", Every: "500ms", At: &time.Time{}, TimeZone: "Europe/Berlin", Overlap: "sometimes",
		CatchUp: "twice", Request: []byte(`{"id":"x","prompt":"hi","metadata":{"schedule":"mine"}}`)}
	err := s.Validate()
	var re *RequestError
	if !errors.As(err, &re) {
		t.Fatalf("Validate: %v, want a *RequestError", err)
	}
	for _, want := range []string{`schedule name "a.b"`, "exactly one of cron, every and at (got 2)", "every 500ms must be whole seconds",
		"a time zone applies only to a cron schedule", `overlap "sometimes"`, `catchUp "twice"`, "request.id must be empty",
		`request.metadata "schedule" is set by each fire`} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("problems lack %q:\n%v", want, err)
		}
	}
	// Review 57, finding 10: Local is each machine's zone.
	local := &Schedule{Name: "weekly", Queue: "q", Cron: "0 0 9 * * MON", TimeZone: "Local", Request: []byte(`{"prompt":"hi"}`)}
	if err := local.Validate(); err == nil || !strings.Contains(err.Error(), "time zone Local") {
		t.Errorf("time zone Local: %v", err)
	}
	ok := &Schedule{Name: "weekly", Queue: "q", Cron: "0 0 9 * * MON", TimeZone: "Europe/Berlin", Request: []byte(`{"prompt":"hi"}`)}
	if err := ok.Validate(); err != nil {
		t.Errorf("a good schedule: %v", err)
	}
}

// A fire's planned time comes from the spec and the fire, not a clock:
// @every the server's next less the interval, a cron its latest time at
// or before the fire was stored (in its zone), a trigger its header.
func TestFirePlanned(t *testing.T) {
	at := func(s string) time.Time {
		v, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	every := &Schedule{Every: "90s"}
	h := nats.Header{}
	h.Set("Nats-Schedule-Next", "2027-01-04T08:01:30Z")
	if p, trig, err := every.FirePlanned(h, at("2027-01-04T08:00:00.300Z")); err != nil || trig || !p.Equal(at("2027-01-04T08:00:00Z")) {
		t.Errorf("@every: %v %v %v", p, trig, err)
	}
	cron := &Schedule{Cron: "0 0 9 * * MON", TimeZone: "Europe/Berlin"}
	// 09:00 Berlin on Monday 2027-01-04 is 08:00 UTC; stored 300 ms late.
	if p, _, err := cron.FirePlanned(nats.Header{}, at("2027-01-04T08:00:00.300Z")); err != nil || !p.Equal(at("2027-01-04T08:00:00Z")) {
		t.Errorf("cron: %v %v", p, err)
	}
	th := nats.Header{}
	th.Set(HeaderScheduleTrigger, "2027-01-05T10:00:00.123Z")
	if p, trig, err := cron.FirePlanned(th, at("2027-01-05T10:00:01Z")); err != nil || !trig || !p.Equal(at("2027-01-05T10:00:00.123Z")) {
		t.Errorf("trigger: %v %v %v", p, trig, err)
	}
	a, b := ScheduleRunID("q", "n", at("2027-01-04T08:00:00Z"), false), ScheduleRunID("q", "n", at("2027-01-04T08:00:00Z"), true)
	if a == b || !ValidID(a) || a != ScheduleRunID("q", "n", at("2027-01-04T08:00:00Z"), false) {
		t.Errorf("run ids %s %s", a, b)
	}
}
