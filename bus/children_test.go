package bus_test

import (
	"bytes"
	"slices"
	"sync"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
	"github.com/agentfleet/agentfleet/internal/fleettest"
)

// Every worker reads the same child key, whoever created it, so a call's
// child has one id on every worker; another key names another child.
func TestChildKeyIsOneForTheFleet(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	ctx := fleettest.Context(t)
	keys := make([]bus.ChildKey, 8)
	var wg sync.WaitGroup
	for i := range keys {
		wg.Go(func() {
			k, err := f.Client.ChildKey(ctx)
			if err != nil {
				t.Error(err)
			}
			keys[i] = k
		})
	}
	wg.Wait()
	for _, k := range keys[1:] {
		if !bytes.Equal(k, keys[0]) || len(k) != 32 {
			t.Fatalf("keys differ: %x %x", k, keys[0])
		}
	}
	id := keys[0].RunID("plan", "k0")
	if !bus.ValidID(id) || len(id) != 41 || id != keys[0].RunID("plan", "k0") {
		t.Fatalf("id %q", id)
	}
	other := bus.ChildKey(bytes.Repeat([]byte{1}, 32))
	if other.RunID("plan", "k0") == id || keys[0].RunID("plan", "k1") == id {
		t.Fatal("ids collide")
	}
}

// A sealed child request verifies only as it was sealed: on its queue,
// byte for byte, with the key that sealed it.
func TestChildSealVerifiesOnlyTheSealedRequest(t *testing.T) {
	t.Parallel()
	k := bus.ChildKey(bytes.Repeat([]byte{7}, 32))
	req := &bus.RunRequest{ID: "c1", Prompt: "research A",
		Child: &bus.ChildOf{ParentRunID: "plan", RootRunID: "plan", Depth: 1, Proof: bus.ProofPlaceholder}}
	body, err := agent.MarshalJSON(req)
	if err != nil {
		t.Fatal(err)
	}
	sealed, err := k.Seal("default", body)
	if err != nil {
		t.Fatal(err)
	}
	dec, err := bus.DecodeRunRequest(sealed, "c1")
	if err != nil {
		t.Fatal(err)
	}
	proof := dec.Child.Proof
	if !k.Verify("default", sealed, proof) {
		t.Fatal("the sealed request does not verify")
	}
	altered := bytes.Replace(sealed, []byte("research A"), []byte("research B"), 1)
	for name, ok := range map[string]bool{
		"another queue":  k.Verify("batch", sealed, proof),
		"another body":   k.Verify("default", altered, proof),
		"another key":    bus.ChildKey(bytes.Repeat([]byte{8}, 32)).Verify("default", sealed, proof),
		"no key":         bus.ChildKey(nil).Verify("default", sealed, proof),
		"the proof only": k.Verify("default", body, bus.ProofPlaceholder),
		"a short proof":  k.Verify("default", sealed, proof[:63]),
	} {
		if ok {
			t.Errorf("%s verifies", name)
		}
	}
	if _, err := k.Seal("default", sealed); err == nil {
		t.Error("a body without the placeholder was sealed")
	}
	// A link without a proof is a bad request wherever it is checked.
	req.Child.Proof = ""
	if err := req.Validate("c1"); err == nil || !slices.ContainsFunc(err.(*bus.RequestError).Problems, func(p string) bool {
		return bytes.Contains([]byte(p), []byte("child.proof is missing"))
	}) {
		t.Errorf("a link without a proof: %v", err)
	}
}
