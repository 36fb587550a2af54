package main

import (
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// The run page lists a parent's child runs with their states, each
// linking to its page; a child's page links back to its parent.
func TestBrowserRunChildren(t *testing.T) {
	t.Parallel()
	chromiumPath(t)
	f := newTestFleet(t)
	c := newConsole(t, f, serverConfig{})
	b := newBrowser(t, c.URL)
	f.submit(treeParent("tree-page"))
	c.waitRun(t, "tree-page", func(r bus.RunRecord) bool { return r.State == bus.StatusSucceeded })
	k, err := f.c.ChildKey(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	a := k.RunID("tree-page", "a")
	page := b.tab()
	b.open(page, "/runs/tree-page")
	b.do(page, "the children listed", wait(`document.querySelectorAll('#children-body tr').length === 2`))
	href := eval[string](b, page, `document.querySelector('#children-body tr[data-child=`+jsString(a)+`] a').getAttribute('href')`)
	if href != "/runs/"+a {
		t.Fatalf("child link %q", href)
	}
	if text := eval[string](b, page, `document.querySelector('#children-body tr[data-child=`+jsString(a)+`]').textContent`); !strings.Contains(text, "succeeded") {
		t.Fatalf("child row %q", text)
	}
	child := b.tab()
	b.open(child, "/runs/"+a)
	b.do(child, "the parent linked", wait(`!!document.querySelector('#parent-link a')`))
	if href := eval[string](b, child, `document.querySelector('#parent-link a').getAttribute('href')`); href != "/runs/tree-page" {
		t.Fatalf("parent link %q", href)
	}
}
