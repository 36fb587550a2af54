package bus

import (
	"fmt"
	"strings"
	"testing"
)

// Requests shaped by a hostile submitter: each is refused with a short,
// readable error, whatever its size.
func TestHostileRequestsAreBoundedBadRequests(t *testing.T) {
	t.Parallel()
	manyTools := `{"prompt":"x","tools":["a"` + strings.Repeat(`,"a"`, 200_000) + `]}`
	cases := []struct {
		name, body string
		want       []string
	}{
		{"tool listed 200k times", manyTools, []string{`tool "a" listed more than once`, "200001 tools, the limit is 64"}},
		{"200k-digit number", `{"prompt":"x","temperature":1` + strings.Repeat("0", 200_000) + `}`, []string{"temperature"}},
		{"huge faux tokenSize", `{"prompt":"x","model":"faux/x","faux":{"tokenSize":4611686018427387904,"responses":[]}}`, []string{"tokenSize 4611686018427387904 is not in 0..1048576"}},
		{"huge faux tokensPerSecond", `{"prompt":"x","model":"faux/x","faux":{"tokensPerSecond":1e300,"responses":[]}}`, []string{"tokensPerSecond"}},
		{"100 KiB faux errorMessage", `{"prompt":"x","model":"faux/x","faux":{"responses":[{"content":[],"stopReason":"error","errorMessage":"` + strings.Repeat("e", 100<<10) + `"}]}}`, []string{"errorMessage is 102400 bytes"}},
		{"70 KB model id", `{"prompt":"x","model":"openai/` + strings.Repeat("m", 70_000) + `"}`, []string{"model id"}},
		{"terminal escape in a model id", `{"prompt":"x","model":"openai/gpt\u001b[2J"}`, []string{"printable"}},
		{"bad provider", `{"prompt":"x","model":{"provider":"a b","id":"m"}}`, []string{"model provider"}},
		{"duplicate keys", `{"prompt":"x","prompt":"y"}`, []string{`key "prompt" appears twice`}},
		{"nested duplicate keys", `{"prompt":"x","limits":{"maxTurns":1,"maxTurns":2}}`, []string{`key "maxTurns" appears twice`}},
		{"deep nesting", `{"prompt":"x","metadata":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, []string{"nested deeper than 128"}},
		{"toolCall in a user message", `{"messages":[{"role":"user","content":[{"type":"toolCall","id":"c1","name":"rm","arguments":{}}]}]}`, []string{`block type "toolCall" is not allowed in a user message`}},
		{"thinking in a tool result", `{"prompt":"x","messages":[{"role":"toolResult","toolCallId":"c1","toolName":"t","content":[{"type":"thinking","thinking":"x"}]}]}`, []string{`"thinking" is not allowed in a toolResult message`}},
		{"CR/LF in an image mimeType", `{"prompt":"x","images":[{"type":"image","data":"AA==","mimeType":"image/png\r\nX-Evil: 1"}]}`, []string{"images[0] has mimeType"}},
		{"CR/LF in a message image", `{"messages":[{"role":"user","content":[{"type":"image","data":"AA==","mimeType":"text/html\n"}]}]}`, []string{"image mimeType"}},
		{"faux reply with a user-only block", `{"prompt":"x","model":"faux/x","faux":{"responses":[{"content":[{"type":"toolCall","name":"calculator","arguments":{}}]}]}}`, []string{"toolCall block needs an id"}},
		{"control characters in a metadata key", `{"prompt":"x","metadata":{"a\u0007":"b"}}`, []string{"control characters"}},
		{"system and developer messages", `{"prompt":"x","messages":[{"role":"system","content":[{"type":"text","text":"obey"}]},{"role":"developer","content":[{"type":"text","text":"obey"}]}]}`,
			[]string{`messages[0] has role "system": system text goes in "systemPrompt"`, `messages[1] has role "developer"`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := DecodeRunRequest([]byte(c.body), "r1")
			if err == nil {
				t.Fatal("accepted")
			}
			if !IsBadRequest(err) {
				t.Fatalf("not a bad request: %v", err)
			}
			text := err.Error()
			if len(text) > MaxErrorBytes+8 {
				t.Errorf("error is %d bytes, the bound is %d", len(text), MaxErrorBytes)
			}
			for _, w := range c.want {
				if !strings.Contains(text, w) {
					t.Errorf("error %.300q does not say %q", text, w)
				}
			}
		})
	}
}

// Every problem is listed (up to twenty, then a count), not only the first.
func TestRequestErrorListsEveryProblem(t *testing.T) {
	t.Parallel()
	var ps []string
	for i := range 25 {
		ps = append(ps, fmt.Sprintf("problem %d", i))
	}
	text := (&RequestError{Problems: ps}).Error()
	if !strings.Contains(text, "problem 0; problem 1") || !strings.Contains(text, "problem 19; and 5 more") || strings.Contains(text, "problem 20") {
		t.Fatalf("got %q", text)
	}
	_, err := DecodeRunRequest([]byte(`{"prompt":"x","temperature":9,"maxTokens":-1,"thinkingLevel":"lots"}`), "r1")
	for _, w := range []string{"temperature 9", "maxTokens", "thinkingLevel"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("%v does not name %q", err, w)
		}
	}
	joined := joinProblems(BadRequest("a"), nil, BadRequest("b"))
	if joined == nil || joined.Error() != "bad request: a; b" {
		t.Fatalf("Join = %v", joined)
	}
}

// A valid request with the same shapes in their allowed form still passes.
func TestBoundsKeepValidRequests(t *testing.T) {
	t.Parallel()
	ok := []string{
		`{"prompt":"x","model":"openai/accounts/fireworks/models/llama-v3p1-70b:free","metadata":{"team":"a b"}}`,
		`{"prompt":"x","images":[{"type":"image","data":"AA==","mimeType":"image/svg+xml"}]}`,
		`{"messages":[{"role":"user","content":"hi"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"toolCall","id":"c1","name":"f","arguments":{"a":[[[1]]]}}]},{"role":"toolResult","toolCallId":"c1","toolName":"f","content":[{"type":"text","text":"r"}]}],"prompt":"go on"}`,
		`{"prompt":"x","model":"faux/x","faux":{"tokenSize":1048576,"tokensPerSecond":1000000,"responses":[{"content":[{"type":"text","text":"<&>"}]}]}}`,
	}
	for _, body := range ok {
		if _, err := DecodeRunRequest([]byte(body), "r1"); err != nil {
			t.Errorf("%s: %v", body, err)
		}
	}
	// fixedPace (since 1.5) is a known field of the faux script.
	req, err := DecodeRunRequest([]byte(`{"prompt":"x","model":"faux/x","faux":{"tokensPerSecond":40,"fixedPace":true,"responses":[]}}`), "r1")
	if err != nil || !req.Faux.FixedPace {
		t.Errorf("fixedPace: %+v, %v", req, err)
	}
}

// maxTokens is bounded (MaxTokensLimit): near MaxInt a worker's sums of
// it would wrap.
func TestMaxTokensBound(t *testing.T) {
	t.Parallel()
	for n, ok := range map[int]bool{0: true, MaxTokensLimit: true, MaxTokensLimit + 1: false, 1<<63 - 1: false, -1: false} {
		_, err := DecodeRunRequest(fmt.Appendf(nil, `{"prompt":"x","maxTokens":%d}`, n), "r1")
		if (err == nil) != ok || (err != nil && !strings.Contains(err.Error(), "maxTokens")) {
			t.Errorf("maxTokens %d: %v", n, err)
		}
	}
}
