package workerproto

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/bus"
)

func FuzzDecodeControl(f *testing.F) {
	for _, s := range []string{
		`{"text":"answer in French"}`,
		`{"message":{"role":"user","content":[{"type":"text","text":"x"}],"timestamp":1}}`,
		`{"message":{"role":"assistant","content":[]}}`,
		`{"reason":"stop"}`, `{"text":""}`, `{}`, `{"text":"a","message":{"role":"user","content":"b"}}`, `x`,
		`{"toolCallId":"c1","decision":"approve","by":"a","arguments":{"x":[1,{"y":null}]}}`, `{"toolCallId":"c1","decision":"deny","reason":"no"}`,
	} {
		f.Add([]byte(s))
	}
	stored := time.UnixMilli(1_700_000_000_000)
	f.Fuzz(func(t *testing.T, data []byte) {
		m, err := DecodeUserControl(data, stored)
		if err == nil {
			if m.Role != "user" {
				t.Fatalf("control became a %q message", m.Role)
			}
			if _, err := json.Marshal(m); err != nil {
				t.Fatalf("accepted message does not encode: %v", err)
			}
		}
		if a, err := DecodeApproval(data); err == nil {
			if len(a.Problems()) > 0 || len(a.By) > bus.MaxApprovalBy {
				t.Fatalf("accepted answer with problems %v", a.Problems())
			}
		}
		reason := DecodeAbort(data)
		if len(reason) > MaxAbortReason+len("…")+4 {
			t.Fatalf("abort reason of %d bytes", len(reason))
		}
	})
}
