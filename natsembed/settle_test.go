package natsembed

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/agentfleet/agentfleet/internal/freeport"
)

// The wait's policy, over a scripted server: Shutdown's tests cover the
// real one, whose request floods cannot be held steady under load.

func TestSettleGivesUpAndWarnsWhileRequestsKeepComing(t *testing.T) {
	var warned []string
	polls := 0
	start := time.Now()
	settleAPI(func() apiLoad { polls++; return apiLoad{inflight: 1} }, 50*time.Millisecond,
		func(f string, v ...any) { warned = append(warned, fmt.Sprintf(f, v...)) })
	if len(warned) != 1 || !strings.Contains(warned[0], "JetStream API requests keep coming") {
		t.Fatalf("warnings %q", warned)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond || polls < 1 {
		t.Fatalf("gave up after %v and %d polls", waited, polls)
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
// spell of settleQuiet, measured here from the first quiet poll (before
// the wait's own start of the spell) to the return (after its end).
func TestSettleNeedsAQuietSpellLongEnough(t *testing.T) {
	var firstQuiet time.Time
	quiet, polls := 0, 0
	settleAPI(func() apiLoad {
		polls++
		if polls <= 3 {
			quiet = 0
			return apiLoad{inflight: 1}
		}
		if quiet++; quiet == 1 {
			firstQuiet = time.Now()
		}
		return apiLoad{}
	}, time.Hour, noWarning(t))
	if spell := time.Since(firstQuiet); spell < settleQuiet || quiet < settlePolls {
		t.Fatalf("ended %v and %d quiet polls after the last request", spell, quiet)
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
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, JetStream: true,
		StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := listen(s, "127.0.0.1", port, time.Hour); !errors.Is(err, ErrPortBusy) {
		t.Fatalf("got %v, want ErrPortBusy", err)
	}
	held.Close()
	if err := notReady("127.0.0.1", port); errors.Is(err, ErrPortBusy) {
		t.Fatalf("a free port reads as busy: %v", err)
	}
}
