package main

import (
	"strings"
	"testing"
)

// --tenant-weights takes tenant=W entries; one error names every bad one.
func TestTenantWeightsFlag(t *testing.T) {
	got, err := parseTenantWeights([]string{"acme=2", " globex = 0.5 ", "_=1"})
	if err != nil || got["acme"] != 2 || got["globex"] != 0.5 || got["_"] != 1 {
		t.Fatalf("%v %v", got, err)
	}
	_, err = parseTenantWeights([]string{"acme=0", "a.b=1", "ok=1", "x=much"})
	if err == nil {
		t.Fatal("bad weights accepted")
	}
	for _, bad := range []string{`"acme=0"`, `"a.b=1"`, `"x=much"`} {
		if !strings.Contains(err.Error(), bad) {
			t.Errorf("error %q does not name %s", err, bad)
		}
	}
	if strings.Contains(err.Error(), `"ok=1"`) {
		t.Errorf("error %q names a good entry", err)
	}
}
