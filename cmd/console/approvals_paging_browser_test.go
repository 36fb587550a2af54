package main

import (
	"fmt"
	"testing"

	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// TestBrowserApprovalsPaging: the approvals page shows the first 100 runs
// of 120 waiting, "Older →" the other 20, "← First page" the first again.
func TestBrowserApprovalsPaging(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	fl := fleettest.Start(t, fleettest.Options{})
	f := &testFleet{Fleet: fl, t: t, srv: fl.Server, c: fl.Client}
	for i := range 120 {
		if err := fleettest.PutWaitingRun(fleettest.Context(t), fl.Client, "default", fmt.Sprintf("bp-%03d", i), "c1", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	c := newConsole(t, f, serverConfig{})
	b := newBrowser(t, c.URL)
	page := b.tab()
	b.open(page, "/approvals")
	rows := `document.querySelectorAll("#approvals-body tr[data-run]").length`
	b.do(page, "the first page lists 100 calls", wait(rows+` === 100 && !document.querySelector("#approvals-older").hidden && document.querySelector("#approvals-first").hidden`))
	b.do(page, "older", click("#approvals-older"), wait(rows+` === 20 && document.querySelector("#approvals-older").hidden && !document.querySelector("#approvals-first").hidden`))
	b.do(page, "first page", click("#approvals-first"), wait(rows+` === 100`))
}
