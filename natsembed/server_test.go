package natsembed_test

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/natsembed"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// A second server on the same port is refused with ErrPortBusy and a
// message that names the address.
func TestBusyPortIsRefusedClearly(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	port := srv.NATS().Addr().(*net.TCPAddr).Port
	_, err = natsembed.Start(natsembed.Options{Port: port, StoreDir: t.TempDir()})
	if !errors.Is(err, natsembed.ErrPortBusy) || !strings.Contains(err.Error(), srv.NATS().Addr().String()) {
		t.Fatalf("busy port: %v", err)
	}
}

func TestStoreDirIsRequired(t *testing.T) {
	if _, err := natsembed.Start(natsembed.Options{Port: -1}); err == nil {
		t.Fatal("started without a store dir")
	}
}

// The sync setting reaches the server JetStream runs with: "always" makes
// every write fsync, an interval sets the background sync.
func TestSyncReachesTheServer(t *testing.T) {
	for _, c := range []struct {
		sync   string
		always bool
		every  time.Duration
	}{{"", false, 2 * time.Minute}, {"always", true, 0}, {"10s", false, 10 * time.Second}} {
		srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir(), Sync: c.sync})
		if err != nil {
			t.Fatal(err)
		}
		js := srv.NATS().JetStreamConfig()
		srv.Shutdown()
		if js == nil || js.SyncAlways != c.always || (c.every != 0 && js.SyncInterval != c.every) {
			t.Errorf("sync %q: the server runs with %+v", c.sync, js)
		}
	}
	for _, bad := range []string{"sometimes", "-1s", "0s", "30"} {
		if _, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir(), Sync: bad}); err == nil || !strings.Contains(err.Error(), "always") {
			t.Errorf("sync %q: %v", bad, err)
		}
	}
}

func TestStreamCreatesQueuedAtShutdownLeaveNoStore(t *testing.T) {
	before := goleak.IgnoreCurrent()
	t.Run("server", func(t *testing.T) {
		srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(srv.Shutdown)
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		// Queue stream creations without waiting for their answers, then
		// leave: the server's shutdown (the cleanup) comes while they are
		// still queued: Shutdown lets them finish first.
		for i := range 100 {
			cfg := fmt.Sprintf(`{"name":"s%d","subjects":["s%d.>"],"storage":"file"}`, i, i)
			if err := nc.PublishRequest(fmt.Sprintf("$JS.API.STREAM.CREATE.s%d", i), nats.NewInbox(), []byte(cfg)); err != nil {
				t.Fatal(err)
			}
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
		nc.Close()
	})
	if err := goleak.Find(before); err != nil {
		t.Fatal(err)
	}
}

// A create sent right before Close (no wait for its answer) may be read
// from the socket by the server only after Shutdown began to wait.
func TestAStreamCreateSentAtCloseLeavesNoStore(t *testing.T) {
	before := goleak.IgnoreCurrent()
	for i := range 50 {
		srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		nc, err := nats.Connect(srv.URL())
		if err != nil {
			t.Fatal(err)
		}
		cfg := fmt.Sprintf(`{"name":"s%d","subjects":["s%d.>"],"storage":"file"}`, i, i)
		if err := nc.PublishRequest(fmt.Sprintf("$JS.API.STREAM.CREATE.s%d", i), nats.NewInbox(), []byte(cfg)); err != nil {
			t.Fatal(err)
		}
		nc.Close()
		srv.Shutdown()
	}
	if err := goleak.Find(before); err != nil {
		t.Fatal(err)
	}
}
