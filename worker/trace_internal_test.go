package worker

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
)

func TestContentJSONIsCut(t *testing.T) {
	big := strings.Repeat("é", MaxTracedContent) // 2 bytes each
	got := contentJSON(genAIMessages([]agent.Message{agent.UserText(big)}, false))
	if len(got) > MaxTracedContent || len(got) < MaxTracedContent-1 || !utf8.ValidString(got) {
		t.Fatalf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	small := contentJSON(genAIMessages([]agent.Message{agent.UserText("hi", agent.Content{Type: agent.ContentImage, Data: "QUJD", MimeType: "image/png"})}, false))
	var msgs []genAIMessage
	if err := json.Unmarshal([]byte(small), &msgs); err != nil || strings.Contains(small, "QUJD") ||
		len(msgs) != 1 || len(msgs[0].Parts) != 2 || msgs[0].Parts[1].Type != "blob" || msgs[0].Parts[1].MimeType != "image/png" {
		t.Fatalf("%s: %v", small, err)
	}
}
