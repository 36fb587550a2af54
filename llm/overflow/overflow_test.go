package overflow_test

import (
	"errors"
	"testing"

	"github.com/agentfleet/agentfleet/llm/overflow"
)

func TestClassify(t *testing.T) {
	yes := []string{
		"prompt is too long: 213462 tokens > 200000 maximum",
		"400 status code (no body)",
		"413 (no body)",
		"400 Bad Request",              // llm/openai: an empty 400
		"413 Request Entity Too Large", // and 413
		"413",
		"400 Bad Request: This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
		"the input length exceeds the context length",
		"400 Bad Request: Prompt contains 40000 tokens and 0 draft tokens, too large for model with 32768 maximum context length", // Mistral
	}
	for _, s := range yes {
		if err := overflow.Classify(s); !errors.Is(err, overflow.ErrContextOverflow) {
			t.Errorf("Classify(%q) = %v", s, err)
		}
	}
	no := []string{"", "Internal server error", "400 Bad Request: invalid request", "404 Not Found", "4000 tokens", "400 Bad Request: invalid tool_choice", "429 Too Many Requests: rate limit",
		"connection error: EOF"}
	for _, s := range no {
		if overflow.Is(s) {
			t.Errorf("Is(%q) = true", s)
		}
	}
}
