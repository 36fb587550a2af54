// Package overflow recognises a provider's "the prompt does not fit the
// model's context window" error in the text of a failed model call, as
// pi-ai's isContextOverflow does: pi's patterns, plus the shapes of the
// OpenAI-compatible servers the fleet talks to (testdata/overflow holds
// each server's body). A caller that sees ErrContextOverflow can shrink
// the context and try again; any other failure is not its to retry.
package overflow

import (
	"errors"
	"fmt"
	"regexp"
)

// ErrContextOverflow is a model call refused because its prompt exceeds
// the model's context window.
var ErrContextOverflow = errors.New("context overflow: the prompt exceeds the model's context window")

// patterns are pi-ai's (utils/overflow.ts), in its order, then ours.
var patterns = []*regexp.Regexp{
	regexp.MustCompile(`(?i)prompt is too long`),                                  // Anthropic
	regexp.MustCompile(`(?i)input is too long for requested model`),               // Amazon Bedrock
	regexp.MustCompile(`(?i)exceeds the context window`),                          // OpenAI Responses
	regexp.MustCompile(`(?i)input token count.*exceeds the maximum`),              // Gemini
	regexp.MustCompile(`(?i)maximum prompt length is \d+`),                        // xAI
	regexp.MustCompile(`(?i)reduce the length of the messages`),                   // Groq
	regexp.MustCompile(`(?i)maximum context length is \d+ tokens`),                // OpenAI chat, vLLM, OpenRouter, LiteLLM
	regexp.MustCompile(`(?i)exceeds the limit of \d+`),                            // GitHub Copilot
	regexp.MustCompile(`(?i)too large for model with \d+ maximum context length`), // Mistral
	regexp.MustCompile(`(?i)exceeds the available context size`),                  // llama.cpp server
	regexp.MustCompile(`(?i)greater than the context length`),                     // LM Studio
	regexp.MustCompile(`(?i)context window exceeds limit`),                        // MiniMax
	regexp.MustCompile(`(?i)exceeded model token limit`),                          // Kimi
	regexp.MustCompile(`(?i)context[_ ]length[_ ]exceeded`),                       // generic
	regexp.MustCompile(`(?i)too many tokens`),                                     // generic
	regexp.MustCompile(`(?i)token limit exceeded`),                                // generic
	// Not in pi: Ollama's text, and LiteLLM's exception name, which it
	// puts in front of whatever the upstream said.
	regexp.MustCompile(`(?i)input length exceeds the context length`), // Ollama
	regexp.MustCompile(`ContextWindowExceededError`),                  // LiteLLM proxy
}

// noBody is pi's check for Cerebras and Mistral, which answer an
// overflow with a bare 400 or 413: as pi's JS SDK writes it ("400 status
// code (no body)"), and as llm/openai does, the HTTP status line alone
// ("400 Bad Request", "413 Request Entity Too Large").
var noBody = regexp.MustCompile(`(?i)^4(00|13)(\s*(status code)?\s*\(no body\)| [a-z ]+$|$)`)

// Classify returns ErrContextOverflow, wrapped with the provider's text,
// when errorMessage (a failed call's message, as llm/openai writes it:
// "<status>: <the provider's message>") says the prompt did not fit;
// otherwise nil.
func Classify(errorMessage string) error {
	if errorMessage == "" {
		return nil
	}
	if noBody.MatchString(errorMessage) {
		return fmt.Errorf("%w: %s", ErrContextOverflow, errorMessage)
	}
	for _, p := range patterns {
		if p.MatchString(errorMessage) {
			return fmt.Errorf("%w: %s", ErrContextOverflow, errorMessage)
		}
	}
	return nil
}

// Is reports whether errorMessage is a context overflow.
func Is(errorMessage string) bool { return Classify(errorMessage) != nil }
