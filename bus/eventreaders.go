package bus

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Every reader of a run's events (a follow, a resume, a transcript) is an
// ordered consumer on the events stream. nats.go leaves such a consumer on
// the server when its reader stops, until it has been idle for its
// InactiveThreshold (5 minutes by default), and nats-server allows 1,000
// consumers on a stream unless told otherwise: 1,000 reads within five
// minutes would lock every later reader out ("maximum consumers limit
// reached"), resumes of runs included. So a reader deletes its consumer
// when it is done, and one left behind by a reader that died goes after
// eventReaderIdle.

// eventReaderIdle is how long the server keeps an events consumer nobody
// pulls from. Longer than the ordered consumer's pull expiry (30 s), so a
// live reader waiting in a quiet run keeps its consumer.
const eventReaderIdle = 45 * time.Second

// dropTimeout bounds the deletion of a reader's consumer.
const dropTimeout = 2 * time.Second

// OrderedEvents opens an ordered consumer on the events stream with cfg;
// release deletes it from the server (call it once the reader is done).
func (c *Client) OrderedEvents(ctx context.Context, cfg jetstream.OrderedConsumerConfig) (cons jetstream.Consumer, release func(), err error) {
	cfg.InactiveThreshold = eventReaderIdle
	cons, err = c.js.OrderedConsumer(ctx, c.names.EventsStream(), cfg)
	if err != nil {
		return nil, nil, err
	}
	return cons, func() { c.dropConsumer(cons) }, nil
}

// dropConsumer deletes an ordered consumer's current server consumer (an
// earlier one was deleted by nats.go when it made this one). Best effort:
// a deletion that fails (NATS away) leaves it to eventReaderIdle.
func (c *Client) dropConsumer(cons jetstream.Consumer) {
	info := cons.CachedInfo()
	if info == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), dropTimeout)
	defer cancel()
	_ = c.js.DeleteConsumer(ctx, c.names.EventsStream(), info.Name)
}
