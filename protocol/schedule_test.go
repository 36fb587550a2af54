package protocol_test

import (
	"encoding/json"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/protocol"
)

// A schedule as the Go client stores it (a cron with a time zone, and a
// paused @every one) fits schedule.schema.json, strictly.
func TestScheduleStoredValidates(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx := fleettest.Context(t)
	f.ServeScheduleOps(bus.DefaultQueue)
	v, err := protocol.NewValidator(protocol.Strict())
	if err != nil {
		t.Fatal(err)
	}
	req, err := json.Marshal(fleettest.FauxRun("triage", fleettest.Text("done")))
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*bus.Schedule{
		{Name: "weekly", Queue: bus.DefaultQueue, Cron: "0 0 9 * * MON", TimeZone: "Europe/Berlin", Overlap: bus.OverlapAbort, Request: req},
		{Name: "often", Queue: bus.DefaultQueue, Every: "90s", CatchUp: bus.CatchUpNone, Paused: true, Request: req},
	} {
		if _, err := f.Client.CreateSchedule(ctx, s, false); err != nil {
			t.Fatal(err)
		}
		st, err := f.Client.JetStream().Stream(ctx, f.Client.Names().SchedulesStream())
		if err != nil {
			t.Fatal(err)
		}
		m, err := st.GetLastMsgForSubject(ctx, f.Client.Names().ScheduleDef(s.Queue, s.Name))
		if err != nil {
			t.Fatal(err)
		}
		if err := v.Validate(protocol.Schedule, m.Data); err != nil {
			t.Errorf("%s: %v\n%s", s.Name, err, m.Data)
		}
	}
}
