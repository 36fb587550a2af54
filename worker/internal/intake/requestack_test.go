package intake

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/agentfleet/agentfleet/natsembed"
)

// A request's slim acknowledgements do to the consumer what the
// jetstream.Msg they replace does: the same sequence of acknowledgements
// on each gives the same answers and leaves the message in the same state.
func TestSlimAcksActAsTheMessage(t *testing.T) {
	srv, err := natsembed.Start(natsembed.Options{Port: -1, StoreDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	spyConn, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer spyConn.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "REQ", Subjects: []string{"req.>"}}); err != nil {
		t.Fatal(err)
	}

	type op func(RequestAcks) error
	ack := func(a RequestAcks) error { return a.Ack() }
	double := func(a RequestAcks) error { return a.DoubleAck(ctx) }
	nak := func(a RequestAcks) error { return a.Nak() }
	nakLater := func(a RequestAcks) error { return a.NakWithDelay(50 * time.Millisecond) }
	wpi := func(a RequestAcks) error { return a.InProgress() }
	term := func(a RequestAcks) error { return a.TermWithReason("bad_request: x") }
	cases := map[string][]op{
		"ack":              {wpi, ack, wpi, nak},
		"double ack":       {double, ack},
		"nak":              {wpi, nak, ack},
		"nak with a delay": {nakLater, term},
		"term":             {term, wpi},
	}
	// outcome runs the ops on the message (slim or not) picked up from
	// subject, and says what each returned and what became of it.
	outcome := func(t *testing.T, subject string, slim bool, ops []op) string {
		t.Helper()
		if _, err := js.Publish(ctx, subject, []byte("request")); err != nil {
			t.Fatal(err)
		}
		cons, err := js.CreateConsumer(ctx, "REQ", jetstream.ConsumerConfig{
			FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute})
		if err != nil {
			t.Fatal(err)
		}
		m, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
		if err != nil {
			t.Fatal(err)
		}
		var acks RequestAcks = m
		if slim {
			acks = SlimAcks(nc, m)
			if _, ok := acks.(*requestAck); !ok {
				t.Fatalf("SlimAcks kept the message: %T", acks)
			}
		}
		// A spy on the message's ack subject sees each acknowledgement's
		// body, and whether it was a request (a double ack waits for the
		// server's answer) or a plain publish.
		spy, err := spyConn.SubscribeSync(m.Reply())
		if err != nil {
			t.Fatal(err)
		}
		defer spy.Unsubscribe()
		if err := spyConn.Flush(); err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, o := range ops {
			switch err := o(acks); {
			case err == nil:
				sent, err := spy.NextMsg(5 * time.Second)
				if err != nil {
					t.Fatalf("an acknowledgement that returned nil was not sent: %v", err)
				}
				out = append(out, fmt.Sprintf("ok %q request=%v", sent.Data, sent.Reply != ""))
			case errors.Is(err, jetstream.ErrMsgAlreadyAckd):
				out = append(out, "already")
			default:
				out = append(out, err.Error())
			}
		}
		// Wait for the state that matters: nothing pending (an ack is
		// applied a moment after it is sent), or delivered again.
		for ctx.Err() == nil {
			info, err := cons.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.NumAckPending == 0 && info.NumPending == 0 {
				return strings.Join(out, ",") + " settled"
			}
			again, err := cons.Next(jetstream.FetchMaxWait(time.Second))
			if errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			md, _ := again.Metadata()
			_ = again.Ack()
			return strings.Join(out, ",") + fmt.Sprintf(" redelivered(%d)", md.NumDelivered)
		}
		t.Fatalf("%s: neither settled nor redelivered", subject)
		return ""
	}
	i := 0
	for name, ops := range cases {
		t.Run(name, func(t *testing.T) {
			i++
			want := outcome(t, fmt.Sprintf("req.msg.%d", i), false, ops)
			got := outcome(t, fmt.Sprintf("req.slim.%d", i), true, ops)
			if got != want {
				t.Fatalf("slim acks: %s; the message: %s", got, want)
			}
			t.Log(got)
		})
	}
}
