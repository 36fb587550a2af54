package natserr

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestTransient(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nats.ErrDisconnected, true},
		{fmt.Errorf("publish: %w", nats.ErrNoResponders), true},
		{jetstream.ErrNoStreamResponse, true},
		{jetstream.ErrJetStreamNotEnabled, true},
		{&jetstream.APIError{Code: 503, Description: "JetStream system temporarily unavailable"}, true},
		{fmt.Errorf("publish: %w", &jetstream.APIError{Code: 429, ErrorCode: 10167, Description: "too many requests"}), true},
		{&jetstream.APIError{Code: 400, ErrorCode: 10054}, false},
		{jetstream.ErrStreamNotFound, false},
		{context.DeadlineExceeded, false},
		{errors.New("wrong last sequence"), false},
		{nil, false},
	} {
		if got := Transient(tc.err); got != tc.want {
			t.Errorf("Transient(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
