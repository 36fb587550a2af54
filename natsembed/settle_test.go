package natsembed

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"
)

// The wait's policy, over a scripted server: Shutdown's tests cover the
// real one, whose request floods cannot be held steady under load.

func TestSettleGivesUpAndWarnsWhileRequestsKeepComing(t *testing.T) {
	var warned []string
	polls := 0
	start := time.Now()
	settleAPI(func() apiLoad { polls++; return apiLoad{clients: 1, inflight: 1} }, 50*time.Millisecond,
		func(f string, v ...any) { warned = append(warned, fmt.Sprintf(f, v...)) })
	if len(warned) != 1 || !strings.Contains(warned[0], "still send JetStream API requests") {
		t.Fatalf("warnings %q", warned)
	}
	if waited := time.Since(start); waited < 50*time.Millisecond || polls < 2 {
		t.Fatalf("gave up after %v and %d polls", waited, polls)
	}
}

func TestSettleEndsAtOnceWithNoClientAndNothingInFlight(t *testing.T) {
	polls := 0
	settleAPI(func() apiLoad { polls++; return apiLoad{} }, time.Hour, noWarning(t))
	if polls != 1 {
		t.Fatalf("%d polls", polls)
	}
}

// A closing client's last requests are still counted once it is gone.
func TestSettleWaitsForRequestsLeftByAClientThatLeft(t *testing.T) {
	polls := 0
	settleAPI(func() apiLoad {
		polls++
		if polls < 5 {
			return apiLoad{inflight: 3}
		}
		return apiLoad{}
	}, time.Hour, noWarning(t))
	if polls != 5 {
		t.Fatalf("%d polls", polls)
	}
}

// With a client connected the wait needs a quiet spell both long and
// polled often enough; a request seen inside it starts the spell again.
func TestSettleNeedsAQuietSpellWhileClientsAreConnected(t *testing.T) {
	var quietPolls []time.Time
	polls := 0
	settleAPI(func() apiLoad {
		polls++
		if polls == 3 {
			quietPolls = nil
			return apiLoad{clients: 1, inflight: 1}
		}
		quietPolls = append(quietPolls, time.Now())
		return apiLoad{clients: 1}
	}, time.Hour, noWarning(t))
	if n := len(quietPolls); n < settlePolls {
		t.Fatalf("ended after %d quiet polls", n)
	}
	if spell := quietPolls[len(quietPolls)-1].Sub(quietPolls[0]); spell < settleQuiet {
		t.Fatalf("ended after a quiet spell of %v", spell)
	}
}

func noWarning(t *testing.T) func(string, ...any) {
	return func(f string, v ...any) { t.Errorf("warned: "+f, v...) }
}

// A port bound by another process between Start's check and the server's
// own bind still reads as busy.
func TestNotReadyOnATakenPortIsPortBusy(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	if err := notReady("127.0.0.1", port); !errors.Is(err, ErrPortBusy) {
		t.Fatalf("got %v, want ErrPortBusy", err)
	}
	ln.Close()
	if err := notReady("127.0.0.1", port); errors.Is(err, ErrPortBusy) {
		t.Fatalf("a free port reads as busy: %v", err)
	}
}
