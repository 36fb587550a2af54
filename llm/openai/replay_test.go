package openai

import (
	"bytes"
	"context"
	"encoding/json"
	"hash/fnv"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
)

// expectation is a fixture's NAME.expect.json (format in testdata/sse/README.md).
type expectation struct {
	Text       string `json:"text"`
	Thinking   string `json:"thinking"`
	StopReason string `json:"stopReason"`
	ToolCalls  []struct {
		ID        string         `json:"id"`
		Name      string         `json:"name"`
		Arguments map[string]any `json:"arguments"`
	} `json:"toolCalls"`
	ErrorContains string `json:"errorContains"`
	Usage         *struct {
		Input     int `json:"input"`
		Output    int `json:"output"`
		CacheRead int `json:"cacheRead"`
	} `json:"usage"`
}

type fixture struct {
	name string
	body []byte
	want expectation
}

// fixtures loads testdata/sse and, when set, $LLM_SSE_FIXTURES_DIR.
func fixtures(t testing.TB) []fixture {
	t.Helper()
	dirs := []string{filepath.Join("testdata", "sse")}
	if extra := os.Getenv("LLM_SSE_FIXTURES_DIR"); extra != "" {
		dirs = append(dirs, extra)
	}
	var out []fixture
	for i, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.sse"))
		if err != nil {
			t.Fatal(err)
		}
		if i == 0 && len(files) == 0 {
			t.Fatalf("no fixtures in %s", dir)
		}
		sort.Strings(files)
		for _, f := range files {
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			raw, err := os.ReadFile(strings.TrimSuffix(f, ".sse") + ".expect.json")
			if err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			fx := fixture{name: strings.TrimSuffix(filepath.Base(f), ".sse"), body: body}
			if i > 0 {
				fx.name = "env/" + fx.name
			}
			if err := json.Unmarshal(raw, &fx.want); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			out = append(out, fx)
		}
	}
	return out
}

// framings of a fixture body: as recorded, with CRLF or lone CR line ends,
// without the space after "data:", and cut at random byte boundaries.
var framings = []struct {
	name  string
	edit  func([]byte) []byte
	split bool
}{
	{name: "lf", edit: func(b []byte) []byte { return b }},
	{name: "crlf", edit: func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")) }},
	{name: "cr", edit: func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r")) }},
	{name: "nospace", edit: func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("data: "), []byte("data:")) }},
	{name: "split", edit: func(b []byte) []byte { return b }, split: true},
	{name: "crlf-split", edit: func(b []byte) []byte { return bytes.ReplaceAll(b, []byte("\n"), []byte("\r\n")) }, split: true},
}

func TestReplayFixtures(t *testing.T) {
	for _, fx := range fixtures(t) {
		t.Run(fx.name, func(t *testing.T) {
			for _, fr := range framings {
				t.Run(fr.name, func(t *testing.T) {
					body := fr.edit(fx.body)
					h := fnv.New64a()
					h.Write([]byte(fx.name + fr.name))
					rng := rand.New(rand.NewPCG(h.Sum64(), 1))
					srv := newServer(t, func(w http.ResponseWriter, r *http.Request) {
						w.Header().Set("Content-Type", "text/event-stream")
						rest := body
						for len(rest) > 0 {
							n := len(rest)
							if fr.split {
								n = min(n, 1+rng.IntN(64))
							}
							_, _ = w.Write(rest[:n])
							w.(http.Flusher).Flush()
							rest = rest[n:]
						}
					})
					p := newProvider(t, srv, nil)
					_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
					checkExpectation(t, msg, fx.want)
				})
			}
		})
	}
}

func checkExpectation(t *testing.T, msg *agent.Message, want expectation) {
	t.Helper()
	if got := msg.TextOf(); got != want.Text {
		t.Errorf("text = %q, want %q", got, want.Text)
	}
	if got := msg.ThinkingOf(); got != want.Thinking {
		t.Errorf("thinking = %q, want %q", got, want.Thinking)
	}
	if string(msg.StopReason) != want.StopReason {
		t.Errorf("stopReason = %q (%s), want %q", msg.StopReason, msg.ErrorMessage, want.StopReason)
	}
	if want.ErrorContains != "" && !strings.Contains(msg.ErrorMessage, want.ErrorContains) {
		t.Errorf("errorMessage = %q, want it to contain %q", msg.ErrorMessage, want.ErrorContains)
	}
	calls := msg.ToolCalls()
	if len(calls) != len(want.ToolCalls) {
		t.Fatalf("%d tool calls %s, want %d", len(calls), js(calls), len(want.ToolCalls))
	}
	for i, w := range want.ToolCalls {
		c := calls[i]
		if c.ID != w.ID || c.Name != w.Name {
			t.Errorf("call %d = %s %s, want %s %s", i, c.ID, c.Name, w.ID, w.Name)
		}
		if w.Arguments == nil {
			w.Arguments = map[string]any{}
		}
		if !reflect.DeepEqual(normalize(c.Arguments), normalize(w.Arguments)) {
			t.Errorf("call %d arguments = %s, want %s", i, js(c.Arguments), js(w.Arguments))
		}
	}
	if u := want.Usage; u != nil {
		got := msg.Usage
		if got.Input != u.Input || got.Output != u.Output || got.CacheRead != u.CacheRead {
			t.Errorf("usage = %+v, want input %d output %d cacheRead %d", got, u.Input, u.Output, u.CacheRead)
		}
		if got.TotalTokens != got.Input+got.Output+got.CacheRead+got.CacheWrite {
			t.Errorf("totalTokens %d is not the sum of %+v", got.TotalTokens, got)
		}
	}
}
