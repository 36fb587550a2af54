// Package eventpub publishes the events of a run's attempt to its
// subject on the events stream: in seq order, each stored once,
// acknowledged, re-sent when an ack is lost, and in fast batches where
// the stream takes them. It is the worker's (worker/run.go makes one
// Publisher per attempt); it meets the worker through Env.
//
// Files: publisher.go (a Publisher and its events), answers.go (acks and
// batch answers applied to its queue), resend.go (the re-send), send.go
// (the two ways an event goes out: singly or in a batch), acks.go (every
// publisher's acks), batch.go and batch_answers.go (event batches),
// env.go (what the worker gives, errors, options).
//
// # Seams
//
// Production code carries no test hooks. The tests stop, see or fail a
// publisher through what it is given: the wire (Env.Out, and the Out
// given to StartBatch), which carries every send, batch message and
// re-send; the stored-read slots (Env.StoredReads, Slots), which a
// re-send acquires before it reads the stream. Where a race has no such
// dependency the tests wait on the state itself: an event past its
// publisher's checks is stamped in its queue, and the batch's sendMu,
// taken before the batch's own checks (on, held, epoch), keeps it short
// of them; an event waiting for its run's earlier batch has made that
// batch's changed channel.
//
// # Publisher
//
// A Publisher publishes one attempt's events asynchronously with a bounded
// window of outstanding acks. Every event takes a window slot before it is
// published and gives it back when its ack arrives; a full window blocks
// the caller (the agent's listener): back-pressure. Acks come through the
// worker's Acks (acks.go), which applies them here.
//
// Invariants:
//   - queue holds the unacknowledged events and those acked after an
//     earlier one still unacked, in seq order; its head is popped only
//     once acked, so events are counted stored in seq order.
//   - The window holds at least len(queue) slots: a queued event's slot is
//     given back when it is popped or dropped, never before.
//   - Acks must come with increasing stream sequences in seq order; if not
//     (a lost event stored after a later one), the attempt fails and is
//     handed back.
//   - Events go on the wire in seq order: sendMu is held from taking a
//     seq to the end of its publish; while a re-send runs every new event
//     is held and the re-send sends it in its turn. The re-send picks an
//     event under sendMu too, so an event is never picked while its first
//     send is under way. mu guards the state
//     and is never held over a publish, so the ack callback never waits
//     on the connection.
//   - Only a publisher's first event and the lifecycle events carry a
//     Nats-Msg-Id (carriesMsgID): the stream's dedupe of every event cost
//     it about a fifth of its ingest (nats bench js pub async with and
//     without --dedup, docs/benchmarks/).
//   - While the stream takes batches, an event sent singly (no
//     expectation) goes out alone: once every earlier event of its run is
//     answered, and the run's next event only after its answer
//     (turnLocked). Batches keep order within a batch; nothing kept it
//     between two single sends in flight, and an overloaded stream drops
//     one and stores the next.
//   - A new event is sent at once only if it cannot overtake an earlier
//     one: nothing is held, the connection is up, no disconnect is
//     pending in Acks, and the oldest unacknowledged event was sent
//     on this connection (its epoch). Otherwise it is held: one re-send
//     goroutine waits for the connection and re-sends the unacknowledged
//     events one at a time in seq order until every event it sent is
//     stored (the held ones then go out as new events do, releaseHeld),
//     each stored only right after
//     the subject's last message as the goroutine knows it
//     (Nats-Expected-Last-Subject-Sequence; an event with a message id is
//     dropped by the stream if stored already). Refused because more is
//     stored than it knew (acks lost or late), it reads what the run's
//     subject holds since (reconcile): this attempt's events found there
//     in seq order count as acked, copies and older attempts' events are
//     skipped, and an event found after a later one (lost, the later one
//     stored) fails the attempt. So a re-send never stores an event twice
//     unless its original lands after the read (a copy after it, same
//     seq and body: readers take the first of a seq). So does an ack that
//     fails for a reason a reconnect cures (timeout, no responders, 503),
//     after a pause. (A loss between the check and the publish can still
//     let an event overtake; its ack then comes out of order, below.) The
//     retry budget is AckWait from the first failure, counted again from
//     each ack that comes meanwhile, and cleared once nothing waits: past
//     it the request is redelivered anyway.
//   - Once failed or fenced (stopped), nothing more goes on the wire,
//     also from a publish in progress outside mu.
//   - done is closed once the publisher is closed, its queue is empty and
//     no re-send runs, just after it leaves Acks.
//
// # Acks
//
// The JetStream acks of every event publisher of a worker come to one
// subscription, and each is applied to its publisher right there: no
// future, timer or goroutine per event, and none per run.
//
// Invariants:
//   - An event is sent with reply subject <prefix><publisher id>.<seq>; an
//     ack is applied under its publisher's lock to the queued event with
//     that seq, and ignored when there is none (a late ack of an event
//     already popped, or of a closed publisher).
//   - The callback never blocks: it takes a publisher's state lock (never
//     held over I/O) and gives back window slots the queue holds; a
//     re-send or a failure's handling runs on its own goroutine.
//   - The epoch counts the connection's losses. nats.go puts a status
//     change into our channel before the status changes, and every
//     reader of the epoch first counts what the channel holds, under
//     statusMu: so a publisher that sees the connection up again sees the
//     epoch of the loss, an event sent before it never has the current
//     epoch, and a new event is held behind it (publish.go; a loss during
//     the publish itself is caught by the acks' order). A status
//     change the full channel dropped needs no count: nothing was sent
//     while the channel was not empty.
//   - Each epoch has a context that ends (errConnectionLost) when the
//     next loss is counted: a re-send's request and its reads of the
//     stream (reconcile) are bound to the epoch they went out in, so one
//     the lost connection swallowed is sent again on the new one instead
//     of waiting out its timeout (it could spend the whole budget).
//     Closing ends it with another cause, which no re-send retries on.
//   - An event sent in an older epoch, or unacknowledged for
//     PublishAckTimeout, is re-sent (with the others after it, in order,
//     by its publisher); the sweep finds it within sweepEvery, and a
//     publisher with a new event at once. A re-send too many costs a
//     request the stream refuses (publish.go: the expected last subject
//     sequence), or a message id it drops.
//
// # Batches
//
// Events travel to the stream in JetStream fast batches (nats-server
// 2.14+, a stream with AllowBatchPublish): the server answers a batch with
// a flow ack every few messages and one ack at its commit, where a plain
// publish is answered once per message; those answers were a quarter of
// the server's ingest cost. A batch holds the events of any of the
// worker's runs; only events without headers go in one (a refused message
// ends its batch for every run, so nothing that may be refused by design,
// a message id or an expectation, goes in).
//
// Invariants:
//   - sendMu is held from taking a batch seq to the end of its publish, and
//     over a commit: a batch's messages go on the wire in seq order, its
//     commit after them. mu guards the state and is never held over a
//     publish, so the answers' callback never waits on the connection.
//   - Batches are gap-fail: the server stores a batch's messages in seq
//     order and ends the batch at the first it refuses or misses, then
//     answers with a commit ack counting what it stored. So a flow ack for
//     seq N says 1..N are stored; a commit ack for count C says 1..C are
//     stored and C+1.. are not; an error answer for seq K says K.. are
//     not (the batch ends at K; its commit ack settles what is before K).
//   - Stored events are applied to their publishers in batch seq order.
//     The answers give no stream sequence but the commit's (the last
//     stored one's): every other event gets the batch's floor, the highest
//     stream sequence the worker had seen acked before the batch's first
//     message went out. Every message sent after that ack is stored above
//     it, so a floor is a lower bound (publish.go: approx).
//   - An event not stored is re-sent by its publisher as after a lost ack;
//     if a later event of its run is stored already (in a later batch),
//     the attempt fails as stored out of order and is handed back.
//   - A batch is committed flushEvery after its first message, at maxBatch
//     messages, or when a publisher waits for its acks (sync); the next
//     event opens a new one, while the commit's answer may still be on its
//     way (the stream then has two open, and starts the new one with a flow
//     ack every message, doubling). A batch the stream ended (a gap or an
//     error answer), or one opened before the connection's latest loss
//     (Acks' epoch), takes no more messages: what it did not store is
//     re-sent by the publishers (acks.go's sweep for a lost connection).
//   - A batch committed and not answered within answerWait (its commit
//     lost, as in a leader change) is forgotten and its unsettled events
//     are re-sent: each is stored only right after its predecessor, so one
//     stored already is found, not stored again (publish.go). Lost, not
//     late: the stream (its leader) answers one connection's commits in
//     the order it got them, so a batch is taken for lost only once a
//     batch committed after it was answered, or after stuckWait with no
//     such answer. (A leader change, or a batch the stream ended and
//     committed itself, can put two answers out of order: a batch then
//     taken for lost is found stored by its re-send.) An
//     overloaded server answers every batch late; re-sending them at
//     answerWait, each event checked against the store, was more load
//     than the batches themselves and the fleet did not recover.
//   - From the moment the worker knows a batch ended (an error or gap
//     answer, a commit ack storing less than sent, or no answer) until
//     the answers of its unsettled events reach their publishers, those
//     publishers are held (held, under mu): their new events, batched or
//     not, are not sent but left to the publisher's re-send, which sends
//     them in seq order after the lost ones. Without it a run's next
//     event could open a new batch and be stored before its predecessor
//     learned it was not (the attempt then fails as stored out of order).
//     The answers set the publisher's holding before the hold ends (it
//     stays set until nothing sent is unacknowledged), and publish checks it
//     after the hold, so an event that passed the publisher's own check
//     before the answers came is held too. An event
//     sent before the worker knew is not covered: the stream may take it
//     in a later batch, and the attempt fails as above.
//   - A run's events go in one batch at a time: an event does not open or
//     join a batch while an earlier event of its run waits for an answer
//     in another (it waits for that answer, for the batch to end or be
//     forgotten, or for its publisher to fail or be fenced, when it sends
//     nothing). Gap-fail orders a batch's messages, not two batches: an
//     overloaded server drops messages (429, its ingest queue full), and
//     a later batch's could be stored after an earlier one's were dropped,
//     the run's events then stored out of order. A run waits whenever its
//     events come closer together than a batch's answer takes (commit
//     every 2 ms, answer a round trip later): a few ms on a healthy
//     server, and as long as the server is behind when it is overloaded,
//     where the run failed before. Its publisher checks before the wait
//     (the acks' epoch, publish.go), so an event stamped before a loss of
//     the connection is held, not sent, and the sweep forgets batches
//     sent before a loss, so no waiter waits for their answer.
//   - An event goes in a batch only once no event of its run sent singly
//     waits for its ack (it waits for it, publish.go's turnLocked): a
//     single event lost to a reconnect is re-sent with its message id and
//     no expectation, and would be stored after a later batched one
//     unnoticed; one the stream dropped (429) would be stored after it.
//   - Refused for too many open batches (the stream's or the server's
//     limit), events go singly for batchPause.
package eventpub
