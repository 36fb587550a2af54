package bus

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// benchRequestBody is the request `submit bench --deltas 20` sends.
func benchRequestBody(tb testing.TB) []byte {
	tb.Helper()
	m := ModelRef{Provider: "faux", ID: "faux-1"}
	req := &RunRequest{Model: &m, Prompt: "hello", Metadata: map[string]string{"bench": "1"},
		Faux: &FauxScript{Responses: []agent.ScriptedResponse{{Content: []agent.Content{agent.Text(strings.Repeat("lorem ipsum dolo", 20))}}}}}
	b, err := json.Marshal(req)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// The worker decodes every request it picks up: at thousands of runs a
// second this is a visible part of the pickup path.
func BenchmarkDecodeRunRequest(b *testing.B) {
	body := benchRequestBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeRunRequest(body, "r1"); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCheckJSONShape(b *testing.B) {
	body := benchRequestBody(b)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if err := checkJSONShape(body); err != nil {
			b.Fatal(err)
		}
	}
}
