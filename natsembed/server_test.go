package natsembed_test

import (
	"errors"
	"net"
	"strings"
	"testing"

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
