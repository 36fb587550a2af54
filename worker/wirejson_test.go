package worker_test

import (
	"bytes"
	"testing"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/worker"
)

// JSON on the wire writes <, > and & as they are, as the reference does:
// events, the run record and the stored request.
func TestWireJSONKeepsHTMLCharacters(t *testing.T) {
	t.Parallel()
	f := fleettest.Start(t, fleettest.Options{})
	f.StartWorker(worker.Config{})
	req := fleettest.FauxRun("is 1<2 && 3>2?",
		fleettest.ToolCall("c1", "calculator", map[string]any{"expression": "1<2"}),
		fleettest.Text("<b>yes</b> & done"))
	req.Tools = []string{"calculator"}
	req.Metadata = map[string]string{"team": "R&D <core>"}
	id := f.Submit("", req)
	envs := f.Follow(id)
	var all bytes.Buffer
	for _, e := range envs {
		all.Write(e.AppendJSON(nil))
	}
	for _, want := range []string{`1<2 && 3>2?`, `"expression":"1<2"`, `<b>yes</b> & done`} {
		if !bytes.Contains(all.Bytes(), []byte(want)) {
			t.Errorf("events lack %s as written", want)
		}
	}
	if bytes.Contains(all.Bytes(), []byte(`\u003c`)) || bytes.Contains(all.Bytes(), []byte(`\u0026`)) {
		t.Errorf("events escape HTML characters")
	}
	kv, err := f.Client.Records(fleettest.Context(t))
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(fleettest.Context(t), id)
	if err != nil || !bytes.Contains(e.Value(), []byte(`R&D <core>`)) {
		t.Errorf("record: %s %v", e.Value(), err)
	}
}
