package main

import (
	"encoding/json"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// TestBrowserSchedules: the Schedules page lists a paused schedule; Resume
// makes it fire (its row shows a last run), Pause stops it, Trigger fires
// it once more and names the run.
func TestBrowserSchedules(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	fl := fleettest.Start(t, fleettest.Options{})
	fl.StartWorker(worker.Config{})
	f := &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
	req, err := json.Marshal(fleettest.FauxRun("tick", fleettest.Text("tock")))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fl.Client.CreateSchedule(fleettest.Context(t), &bus.Schedule{Name: "ui-tick", Queue: "default", Every: "1s", Paused: true, Request: req}, false); err != nil {
		t.Fatal(err)
	}
	c := newConsole(t, f, serverConfig{AllowControl: true})
	b := newBrowser(t, c.URL)
	page := b.tab()
	b.open(page, "/schedules")
	row := `document.querySelector("#schedules-body tr[data-schedule='ui-tick']")`
	b.do(page, "the paused schedule is listed", wait(row+` && `+row+`.dataset.paused === "true" && `+row+`.textContent.includes("@every 1s")`))
	b.do(page, "resume", click(`#schedules-body tr[data-schedule='ui-tick'] button[data-act=resume]`),
		wait(row+` && `+row+`.dataset.paused === "false" && `+row+`.querySelector("[data-last-state]")`))
	b.do(page, "pause", click(`#schedules-body tr[data-schedule='ui-tick'] button[data-act=pause]`), wait(row+`.dataset.paused === "true"`))
	b.do(page, "trigger", click(`#schedules-body tr[data-schedule='ui-tick'] button[data-act=trigger]`),
		wait(`document.getElementById("toast").textContent.includes("triggered ui-tick: run sch-")`))
}
