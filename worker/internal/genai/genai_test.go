package genai

import (
	"encoding/json"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
)

func TestContentJSONIsCut(t *testing.T) {
	const limit = 64 << 10
	big := strings.Repeat("é", limit) // 2 bytes each
	got := ContentJSON(Messages([]agent.Message{agent.UserText(big)}, false), limit)
	if len(got) > limit || len(got) < limit-1 || !utf8.ValidString(got) {
		t.Fatalf("%d bytes, valid UTF-8 %v", len(got), utf8.ValidString(got))
	}
	small := ContentJSON(Messages([]agent.Message{agent.UserText("hi", agent.Content{Type: agent.ContentImage, Data: "QUJD", MimeType: "image/png"})}, false), limit)
	var msgs []Message
	if err := json.Unmarshal([]byte(small), &msgs); err != nil || strings.Contains(small, "QUJD") ||
		len(msgs) != 1 || len(msgs[0].Parts) != 2 || msgs[0].Parts[1].Type != "blob" || msgs[0].Parts[1].MimeType != "image/png" {
		t.Fatalf("%s: %v", small, err)
	}
}
