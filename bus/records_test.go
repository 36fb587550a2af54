package bus

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/natsembed"
)

// A records bucket lookup that waits on NATS (its request lost) holds up
// no other caller: every Follow asks for the bucket at its start, and one
// lookup held the client's lock until its context ended.
func TestRecordsLookupHoldsUpNoOtherCaller(t *testing.T) {
	t.Parallel()
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	// A JetStream API under another prefix that drops the first lookup of
	// the records bucket's stream and passes everything else on.
	dropped := make(chan struct{})
	var lookups atomic.Int32
	proxy, err := nc.Subscribe("$JSX.API.>", func(m *nats.Msg) {
		api := strings.TrimPrefix(m.Subject, "$JSX.API.")
		if api == "STREAM.INFO.KV_agents_runs" && lookups.Add(1) == 1 {
			close(dropped)
			return
		}
		_ = nc.PublishMsg(&nats.Msg{Subject: "$JS.API." + api, Reply: m.Reply, Header: m.Header, Data: m.Data})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer proxy.Unsubscribe()
	c, err := NewClient(nc, "")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.EnsureStreams(ctx, StreamsConfig{}); err != nil {
		t.Fatal(err)
	}
	if c.js, err = jetstream.NewWithAPIPrefix(nc, "$JSX.API"); err != nil {
		t.Fatal(err)
	}
	slowCtx, slowCancel := context.WithTimeout(ctx, 30*time.Second)
	defer slowCancel()
	slow := make(chan error, 1)
	go func() {
		_, err := c.Records(slowCtx)
		slow <- err
	}()
	<-dropped
	fctx, fcancel := context.WithTimeout(ctx, 5*time.Second)
	defer fcancel()
	if _, err := c.Records(fctx); err != nil {
		t.Fatalf("a second caller, while the first lookup waits: %v", err)
	}
	slowCancel()
	<-slow
	if kv, err := c.Records(ctx); err != nil || kv == nil {
		t.Fatalf("after both: %v", err)
	}
}
