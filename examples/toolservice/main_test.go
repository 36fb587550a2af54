package main

import (
	"context"
	"testing"
	"time"

	"github.com/agentfleet/agentfleet/internal/fleettest"
	"github.com/agentfleet/agentfleet/toolsource"
)

// The example serves two tools a worker's discovery finds and calls.
func TestExampleToolService(t *testing.T) {
	f := fleettest.Start(t, fleettest.Options{NoStreams: true})
	svc, err := addService(f.Client.Conn(), "text", "agents")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = svc.Stop() }()
	src, err := toolsource.NewServices(fleettest.Connect(t, f.URL()).Conn(), toolsource.ServiceOptions{Allowed: []string{"text"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	done := make(chan struct{})
	rctx, stop := context.WithCancel(ctx)
	go func() { src.Run(rctx); close(done) }()
	defer func() { stop(); <-done }()
	<-src.Ready()
	tools, ok := src.Resolve(ctx, "text")
	if !ok || len(tools) != 2 || tools[0].Name != "text__count_words" || tools[1].Name != "text__upper" {
		t.Fatalf("tools %v %v", tools, ok)
	}
	res, err := tools[1].Execute(ctx, "c1", map[string]any{"text": "hello"}, nil)
	if err != nil || res.Content[0].Text != "HELLO" {
		t.Fatalf("upper: %+v %v", res, err)
	}
	_, err = tools[0].Execute(ctx, "c2", map[string]any{"text": ""}, nil)
	if err == nil || err.Error() != "text__count_words failed: the text is empty (code 422)" {
		t.Fatalf("count_words: %v", err)
	}
}
