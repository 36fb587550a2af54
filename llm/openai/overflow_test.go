package openai

import (
	"context"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/llm/overflow"
)

// TestContextOverflowBodies sends each server's context-length error body
// (llm/overflow/testdata/overflow) as a 400 and checks that the failed
// call's message is classified as an overflow; the other 400 bodies
// (testdata/other) are not.
func TestContextOverflowBodies(t *testing.T) {
	for _, dir := range []string{"overflow", "other"} {
		files, err := filepath.Glob(filepath.Join("..", "overflow", "testdata", dir, "*.json"))
		if err != nil || len(files) < 5 {
			t.Fatalf("%s fixtures: %v %v", dir, files, err)
		}
		for _, f := range files {
			body, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			t.Run(dir+"/"+filepath.Base(f), func(t *testing.T) {
				srv := newServer(t, func(w http.ResponseWriter, _ *http.Request) {
					w.Header().Set("Content-Type", "application/json")
					w.WriteHeader(http.StatusBadRequest)
					_, _ = w.Write(body)
				})
				p := newProvider(t, srv, nil)
				_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
				if msg.StopReason != agent.StopReasonError || !strings.HasPrefix(msg.ErrorMessage, "400") {
					t.Fatalf("message %+v", msg)
				}
				err := overflow.Classify(msg.ErrorMessage)
				if want := dir == "overflow"; (err != nil) != want || (want && !errors.Is(err, overflow.ErrContextOverflow)) {
					t.Fatalf("Classify(%q) = %v, want overflow %v", msg.ErrorMessage, err, want)
				}
			})
		}
	}
}

// TestContextOverflowNoBody: Cerebras and Mistral answer an overflow with
// a bare 400 or 413 (pi's check); the failed call's message, as this
// adapter writes it (the status line alone), is an overflow.
func TestContextOverflowNoBody(t *testing.T) {
	for _, code := range []int{http.StatusBadRequest, http.StatusRequestEntityTooLarge} {
		srv := newServer(t, func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(code) })
		p := newProvider(t, srv, nil)
		_, msg := run(t, context.Background(), p, testModel, userContext("hi"), agent.StreamOptions{})
		if msg.StopReason != agent.StopReasonError || !overflow.Is(msg.ErrorMessage) {
			t.Errorf("%d without a body: %q is not an overflow", code, msg.ErrorMessage)
		}
	}
}
