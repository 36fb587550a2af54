package worker

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// slowDialer gives the worker a connection that reads at most 32 KiB a
// call and one call a millisecond (about 32 MiB/s): what the server sends
// faster waits in its buffer for the worker, as behind a busy worker.
type slowDialer struct{ net.Dialer }

func (d *slowDialer) Dial(network, addr string) (net.Conn, error) {
	c, err := d.Dialer.Dial(network, addr)
	if err != nil {
		return nil, err
	}
	return slowConn{c}, nil
}

type slowConn struct{ net.Conn }

func (c slowConn) Read(b []byte) (int, error) {
	time.Sleep(time.Millisecond) // the pace of a slow reader, not a wait
	return c.Conn.Read(b[:min(len(b), 32<<10)])
}

// A backlog of large requests meets a worker with many free slots and a
// slow read side. Fetched at once (FetchNoWait of every free slot) they
// were 45 MB queued for the worker, and the server, past its max_pending,
// disconnected it as a slow consumer, again and again: no run finished.
// Each fetch of several now asks for at most its share of FetchBytes (the
// pull requests carry max_bytes), and the server never holds more for the
// worker than it may.
//
// The loops' own pull requests read every message of a request however
// slowly (nats.go's fetch gave up on its inbox a second after its last
// message, and a review saw up to 19% of the runs here take a second
// delivery under two busy loops; the loops' own gave up 2 s past a
// request's expiry, and a loaded CI saw a run in attempt 2): every run
// here is picked up once.
func TestLargeRequestsAreFetchedWithinTheByteBound(t *testing.T) {
	t.Parallel()
	srv := startJetStream(t, 16<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	sub, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.ClientURL()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.Close)
	if err := sub.EnsureStreams(ctx, bus.StreamsConfig{}); err != nil {
		t.Fatal(err)
	}

	// The pull requests of the queue consumers, as the server gets them.
	var (
		mu    sync.Mutex
		pulls []string
	)
	watch, err := sub.Conn().Subscribe("$JS.API.CONSUMER.MSG.NEXT."+sub.Names().RunsStream()+".>", func(m *nats.Msg) {
		mu.Lock()
		pulls = append(pulls, string(m.Data))
		mu.Unlock()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = watch.Unsubscribe() })

	// 64 requests of about 700 KB: a short answer, then scripted replies
	// the run never reaches, so its events stay small.
	filler := strings.Repeat("x", 1000)
	const runs = 64
	ids := make([]string, runs)
	for i := range ids {
		script := fauxTexts("done")
		for range 690 {
			script.Responses = append(script.Responses, agent.ScriptedResponse{Content: []agent.Content{agent.Text(filler)}})
		}
		res, err := sub.Submit(ctx, "", &bus.RunRequest{Prompt: fmt.Sprint("large ", i), Faux: script})
		if err != nil {
			t.Fatal(err)
		}
		ids[i] = res.ID
	}

	wc, err := bus.Connect(ctx, bus.ConnectOptions{URL: srv.ClientURL(), Name: "slow-worker",
		NATSOptions: []nats.Option{nats.SetCustomDialer(&slowDialer{})}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(wc.Close)
	// Three pull loops of 1.5 MiB each: two requests a fetch. AckWait is
	// long beside a loaded machine's pauses (a 5 s one gave a second
	// delivery under -race at a load of 16, with nothing lost) and short
	// beside the test's bound, so a request a fetch dropped is delivered
	// again, and seen as attempt 2, within it.
	const fetchBytes = 9 << 19
	startInternalOn(t, wc, Config{Concurrency: 64, FetchBytes: fetchBytes, AckWait: 20 * time.Second}, nil)

	t.Cleanup(func() {
		if t.Failed() { // why the runs did not finish, say
			t.Logf("slow consumers: %d; the worker's reconnects: %d", srv.NumSlowConsumersClients(), wc.Conn().Stats().Reconnects)
		}
	})
	for _, id := range ids {
		rec := waitRecord(t, sub, id, "finished", func(r *bus.RunRecord) bool { return r.Finished() })
		if rec.State != bus.StatusSucceeded || rec.Attempt != 1 {
			t.Fatalf("run %s: %s in attempt %d (%s)", id, rec.State, rec.Attempt, rec.Error)
		}
	}
	if n := srv.NumSlowConsumersClients(); n != 0 {
		t.Errorf("the server took %d clients for slow consumers", n)
	}
	if n := wc.Conn().Stats().Reconnects; n != 0 {
		t.Errorf("the worker reconnected %d times", n)
	}

	// Every fetch of several carried the loop's share as its byte bound.
	const bound = fetchBytes / 3
	mu.Lock()
	defer mu.Unlock()
	several := 0
	for _, p := range pulls {
		var req struct {
			Batch    int  `json:"batch"`
			MaxBytes int  `json:"max_bytes"`
			NoWait   bool `json:"no_wait"`
		}
		if err := json.Unmarshal([]byte(p), &req); err != nil {
			t.Fatalf("pull request %q: %v", p, err)
		}
		if req.Batch <= 1 {
			continue
		}
		several++
		if req.MaxBytes != bound {
			t.Errorf("a fetch of %d asked for max_bytes %d, want %d: %s", req.Batch, req.MaxBytes, bound, p)
		}
	}
	if several == 0 {
		t.Fatalf("no fetch of several among %d pull requests", len(pulls))
	}
}

// startJetStream starts an embedded nats-server with JetStream for the
// test; maxPending 0 keeps the server's default.
func startJetStream(t *testing.T, maxPending int64) *server.Server {
	t.Helper()
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true,
		StoreDir: t.TempDir(), MaxPending: maxPending, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server did not start")
	}
	return srv
}
