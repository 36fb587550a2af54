package natsembed

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/agentfleet/agentfleet/internal/freeport"
	"github.com/agentfleet/agentfleet/internal/logbuf"
)

// The wait's policy, over a scripted server: Shutdown's tests cover the
// real one, whose request floods cannot be held steady under load.

func TestSettleGivesUpAndWarnsWhileRequestsKeepComing(t *testing.T) {
	var warned []string
	start := time.Now()
	settleAPI(func() apiLoad { return apiLoad{inflight: 1} }, 50*time.Millisecond,
		func(f string, v ...any) { warned = append(warned, fmt.Sprintf(f, v...)) })
	if len(warned) != 1 || !strings.Contains(warned[0], "JetStream API requests keep coming") {
		t.Fatalf("warnings %q", warned)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond {
		t.Fatalf("gave up after %v", waited)
	}
}

func TestSettleEndsAtOnceWithoutJetStream(t *testing.T) {
	polls := 0
	settleAPI(func() apiLoad { polls++; return apiLoad{done: true} }, time.Hour, noWarning(t))
	if polls != 1 {
		t.Fatalf("%d polls", polls)
	}
}

// A request seen starts the quiet spell again; the wait ends only after a
// spell of settleQuiet, measured here from the first quiet poll after the
// last request (before the wait's own start of the spell) to the return
// (after its end).
func TestSettleNeedsAQuietSpellLongEnough(t *testing.T) {
	var firstQuiet time.Time
	quiet, polls := 0, 0
	settleAPI(func() apiLoad {
		polls++
		if polls == 1 || polls == 3 { // quiet polls before and after
			quiet = 0
			return apiLoad{inflight: 1}
		}
		if quiet++; quiet == 1 {
			firstQuiet = time.Now()
		}
		return apiLoad{}
	}, time.Hour, noWarning(t))
	if spell := time.Since(firstQuiet); spell < settleQuiet || quiet < settlePolls || polls < 3 {
		t.Fatalf("ended %v and %d quiet polls after the last request (poll %d)", spell, quiet, polls)
	}
}

// Polls slower than the spell (the poller descheduled): the wait still
// takes settlePolls of them.
func TestSettleNeedsEnoughQuietPolls(t *testing.T) {
	quiet := 0
	settleAPI(func() apiLoad {
		quiet++
		time.Sleep(settleQuiet + 5*time.Millisecond)
		return apiLoad{}
	}, time.Hour, noWarning(t))
	if quiet < settlePolls {
		t.Fatalf("ended after %d quiet polls", quiet)
	}
}

func noWarning(t *testing.T) func(string, ...any) {
	return func(f string, v ...any) { t.Errorf("warned: "+f, v...) }
}

// A port bound by another process between Start's check and the server's
// own bind is ErrPortBusy, known when the server's Start returns (the wait
// is an hour: a test timeout if it were waited out).
func TestAPortTakenAfterTheCheckIsPortBusy(t *testing.T) {
	port := freeport.Pick(t)
	held, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	o := Options{Host: "127.0.0.1", Port: port, StoreDir: t.TempDir()}
	if err := listen(t.Context(), newServer(t, o), o, time.Hour); !errors.Is(err, ErrPortBusy) {
		t.Fatalf("got %v, want ErrPortBusy", err)
	}
	held.Close()
	if err := portFree(fmt.Sprintf("127.0.0.1:%d", port)); err != nil {
		t.Fatalf("a free port reads as busy: %v", err)
	}
}

// A server still recovering its streams when the start is slow is waited
// for, not shut down (a Shutdown then would leave streams recovered after
// it running, and fail the start), and the wait is logged.
func TestASlowStartIsWaitedFor(t *testing.T) {
	dir := storeWithStreams(t, 100)
	before := goleak.IgnoreCurrent()
	var logs logbuf.Buffer
	o := Options{Host: "127.0.0.1", Port: -1, StoreDir: dir, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
	s := newServer(t, o)
	if err := listen(t.Context(), s, o, time.Nanosecond); err != nil {
		t.Fatal(err)
	}
	if info, err := s.Jsz(&server.JSzOptions{}); err != nil || info.Streams != 100 {
		t.Fatalf("%v streams recovered (%v)", info.Streams, err)
	}
	(&Server{s: s}).Shutdown()
	if err := goleak.Find(before); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(logs.String(), "Still starting after") {
		t.Fatalf("the wait is not logged:\n%s", logs.String())
	}
}

// A start abandoned (a stop signal while the store recovers) returns at
// once; the server shuts down once its start returns, leaving nothing.
func TestAnAbandonedStartShutsDownAfterwards(t *testing.T) {
	dir := storeWithStreams(t, 100)
	before := goleak.IgnoreCurrent()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	o := Options{Host: "127.0.0.1", Port: -1, StoreDir: dir}
	s := newServer(t, o)
	if err := listen(ctx, s, o, time.Hour); !errors.Is(err, context.Canceled) {
		t.Fatalf("got %v, want context.Canceled", err)
	}
	s.WaitForShutdown()
	if err := goleak.Find(before); err != nil {
		t.Fatal(err)
	}
}

// storeWithStreams leaves a JetStream store with n file streams.
func storeWithStreams(t *testing.T, n int) string {
	t.Helper()
	dir := t.TempDir()
	first, err := Start(Options{Port: -1, StoreDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	defer first.Shutdown()
	nc, err := nats.Connect(first.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: fmt.Sprintf("S%d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// An address the machine does not have is not a busy port.
func TestAnAddressNotHereIsNotPortBusy(t *testing.T) {
	_, err := Start(Options{Host: "192.0.2.1", Port: freeport.Pick(t), StoreDir: t.TempDir()})
	if err == nil || errors.Is(err, ErrPortBusy) {
		t.Fatalf("got %v", err)
	}
}

// A store JetStream cannot use is named as the cause.
func TestAStoreJetStreamCannotUseIsNamed(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "jetstream"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := Start(Options{Port: -1, StoreDir: dir})
	if err == nil || !strings.Contains(err.Error(), "Can't start JetStream") {
		t.Fatalf("got %v", err)
	}
}

func newServer(t *testing.T, o Options) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: o.Host, Port: o.Port, JetStream: true,
		StoreDir: o.StoreDir, NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
