// Command toolservice is an example NATS tool service: a micro service
// whose endpoints are tools agentfleet workers discover and call. Run it
// (any number of instances) and start workers with --tool-services text:
//
//	go run ./examples/toolservice --nats nats://127.0.0.1:4222
//	worker --tool-services text
//	submit --tools text__upper "shout hello"
//
// docs/protocol.md ("Tool services") is the contract, for any language.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

func main() {
	url := flag.String("nats", envOr("NATS_URL", nats.DefaultURL), "NATS server URL [NATS_URL]")
	name := flag.String("name", "text", "service name: its tools are <name>__<endpoint>")
	prefix := flag.String("prefix", "agents", "subject prefix: endpoints live under <prefix>.tools.<name>")
	flag.Parse()
	nc, err := nats.Connect(*url, nats.Name("toolservice-"+*name))
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolservice:", err)
		os.Exit(1)
	}
	defer nc.Close()
	svc, err := addService(nc, *name, *prefix)
	if err != nil {
		fmt.Fprintln(os.Stderr, "toolservice:", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "tool service %s (instance %s) serving on %s\n", *name, svc.Info().ID, *url)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	_ = svc.Stop()
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// textArgs are the arguments of both tools (the worker has validated them
// against the schema before the call).
type textArgs struct {
	Text string `json:"text"`
}

const textSchema = `{"type":"object","properties":{"text":{"type":"string","description":"The text."}},"required":["text"]}`

// addService registers the service and its two tools.
func addService(nc *nats.Conn, name, prefix string) (micro.Service, error) {
	svc, err := micro.AddService(nc, micro.Config{Name: name, Version: "1.0.0", Description: "Text tools for agentfleet runs"})
	if err != nil {
		return nil, err
	}
	g := svc.AddGroup(prefix + ".tools." + name)
	tool := func(endpoint, description string, fn func(textArgs) (string, error)) error {
		return g.AddEndpoint(endpoint, micro.HandlerFunc(func(r micro.Request) {
			// Agentfleet-Deadline (unix ms): past it the worker has stopped
			// waiting, so the work would be wasted.
			if ms, err := strconv.ParseInt(r.Headers().Get("Agentfleet-Deadline"), 10, 64); err == nil && time.Now().UnixMilli() > ms {
				return
			}
			var a textArgs
			if err := json.Unmarshal(r.Data(), &a); err != nil {
				_ = r.Error("400", "arguments are not a JSON object: "+err.Error(), nil)
				return
			}
			out, err := fn(a)
			if err != nil {
				_ = r.Error("422", err.Error(), nil)
				return
			}
			// The result in the agent's shape: content blocks, details.
			_ = r.RespondJSON(map[string]any{
				"content": []map[string]any{{"type": "text", "text": out}},
				"details": map[string]any{"run": r.Headers().Get("Agentfleet-Run"), "bytes": len(out)},
			})
		}), micro.WithEndpointMetadata(map[string]string{"description": description, "schema": textSchema}))
	}
	if err := tool("upper", "Return the text in upper case.", func(a textArgs) (string, error) {
		return strings.ToUpper(a.Text), nil
	}); err != nil {
		return nil, err
	}
	if err := tool("count_words", "Count the words of the text.", func(a textArgs) (string, error) {
		if a.Text == "" {
			return "", fmt.Errorf("the text is empty")
		}
		return fmt.Sprint(len(strings.Fields(a.Text))), nil
	}); err != nil {
		return nil, err
	}
	return svc, nil
}
