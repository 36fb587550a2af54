package bus

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"
)

// The decoders of everything a stranger can send: run requests, control
// messages and event envelopes. They must never panic, and what they accept
// must be well-formed. Seeds are in testdata/fuzz/<Name>/ besides these.

func FuzzDecodeRunRequest(f *testing.F) {
	for _, s := range []string{
		`{"prompt":"hi"}`,
		`{"id":"r1","model":"openai/gpt-4o-mini","systemPrompt":"s","prompt":"p","tools":["calculator"],"limits":{"maxTurns":3,"timeoutSeconds":10,"maxTotalTokens":100},"metadata":{"k":"v"}}`,
		`{"model":{"provider":"faux","id":"x"},"faux":{"responses":[{"content":[{"type":"text","text":"a"}]}],"tokenSize":1}}`,
		`{"messages":[{"role":"user","content":"x","timestamp":1}],"continueFrom":"r0","temperature":0,"maxTokens":5}`,
		`{"prompt":"p","thinkingLevel":"high","toolExecution":"sequential","steeringMode":"all","followUpMode":"one-at-a-time"}`,
		`{"id":"../x"}`, `[]`, `null`, `{"prompt":1}`, "{\"prompt\":\"\xff\"}",
	} {
		f.Add([]byte(s), "r1")
	}
	f.Fuzz(func(t *testing.T, data []byte, run string) {
		req, err := DecodeRunRequest(data, run)
		if err != nil {
			if !IsBadRequest(err) {
				t.Fatalf("error is not a bad request: %v", err)
			}
			if msg := err.Error(); msg == "" || !utf8.ValidString(msg) {
				t.Fatalf("unreadable error %q", msg)
			}
			return
		}
		if req.ID != "" && !ValidID(req.ID) {
			t.Fatalf("accepted invalid id %q", req.ID)
		}
		if _, err := json.Marshal(req); err != nil {
			t.Fatalf("accepted request does not encode: %v", err)
		}
	})
}

func FuzzDecodeEnvelope(f *testing.F) {
	for _, s := range []string{
		`{"run":"r1","seq":1,"attempt":1,"worker":"w","ts":1,"event":{"type":"run_started","queue":"default","worker":"w","attempt":1,"tools":[]}}`,
		`{"run":"r1","seq":2,"attempt":1,"worker":"w","ts":1,"event":{"type":"message_update","assistantMessageEvent":{"type":"text_delta","contentIndex":0,"delta":"hi"}}}`,
		`{"run":"r1","seq":3,"attempt":1,"worker":"w","ts":1,"controlSeq":7,"event":{"type":"message_end","message":{"role":"user","content":"x","timestamp":1}}}`,
		`{"run":"r1","seq":4,"attempt":1,"worker":"w","ts":1,"event":{"type":"run_finished","status":"succeeded","usage":{},"cost":0,"turns":1,"durationMs":3}}`,
		`{"run":"r1","seq":5,"attempt":2,"worker":"w","ts":1,"event":{"type":"run_resumed","attempt":2,"messagesRestored":3}}`,
		`{"event":{}}`, `{"event":null}`, `{}`, `1`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		env, err := DecodeEnvelope(data)
		if err != nil {
			return
		}
		if env.Type == "" {
			t.Fatal("decoded envelope without a type")
		}
		ev, err := env.Decode()
		if err != nil {
			return
		}
		var tr Transcript
		_ = tr.Apply(env) // the reducer takes anything that decodes
		if ev.Type != env.Type && !strings.Contains(string(env.Event), ev.Type) {
			t.Fatalf("type %q vs %q", ev.Type, env.Type)
		}
	})
}
