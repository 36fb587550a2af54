package bus

import (
	"github.com/agentfleet/agentfleet/agent"
)

// Transcript is the receiver-side reducer: fed a run's envelopes in stream
// order, it rebuilds the transcript, the partial assistant message being
// streamed, and the run's fleet events. Envelopes of an attempt older than
// the newest attempt seen are ignored (events an old attempt stored after a
// newer attempt's run_started), so are duplicates (a seq already applied in
// the same attempt) and everything after the run's run_finished (a run has
// exactly one; a rejected request that reused the id may add events after
// it).
type Transcript struct {
	Run      string
	Attempt  int
	Messages []agent.Message
	Started  *RunStarted
	Resumed  *RunResumed
	Finished *RunFinished
	// Restored (since 1.9) names the run whose transcript this one
	// continues: Messages are what follows its first Restored.Messages
	// messages (LoadSnapshot has them).
	Restored *TranscriptRestored
	// Compactions (since 1.10) are the run's successful compaction_end
	// events, in order, over every attempt; the model was sent
	// CompactedContext(transcript, last) from the last on.
	Compactions []*CompactionEnd
	// LastSeq is the seq of the last envelope applied.
	LastSeq uint64

	streaming bool
	builder   agent.MessageBuilder
	meta      []msgMeta // parallel to Messages
	prev      []agent.Message
	prevMeta  []msgMeta
	// cutOff is the cutOffUsage of the run_resumed the view rests on;
	// prevCutOff that of prev.
	cutOff, prevCutOff agent.Usage
}

type msgMeta struct {
	controlSeq  uint64
	interrupted bool
}

// Apply folds one envelope into the transcript. It returns an error only for
// an event that does not decode; the envelope is then skipped.
func (t *Transcript) Apply(env *Envelope) error {
	if env.Attempt < t.Attempt || t.Finished != nil {
		return nil
	}
	if env.Attempt == t.Attempt && t.Attempt != 0 && env.Seq != 0 && env.Seq <= t.LastSeq {
		return nil // a duplicate
	}
	ev, err := env.Decode()
	if err != nil {
		return err
	}
	if t.Run == "" {
		t.Run = env.Run
	}
	if env.Attempt > t.Attempt {
		// A new attempt starts over unless run_resumed says otherwise. An
		// attempt > 1 that never published run_resumed died before it
		// decided anything: what it would have restored stays the base.
		if t.Attempt <= 1 || t.Resumed != nil {
			t.prev, t.prevMeta, t.prevCutOff = t.Messages, t.meta, t.cutOff
		}
		t.Messages, t.meta, t.cutOff = nil, nil, agent.Usage{}
		t.Attempt = env.Attempt
		t.streaming = false
		t.Resumed = nil
	}
	t.LastSeq = env.Seq
	switch ev.Type {
	case EventRunStarted:
		t.Started = ev.RunStarted
	case EventRunResumed:
		t.Resumed = ev.RunResumed
		n := min(max(ev.RunResumed.MessagesRestored, 0), len(t.prev))
		t.Messages = append(append([]agent.Message(nil), t.prev[:n]...), t.Messages...)
		t.meta = append(append([]msgMeta(nil), t.prevMeta[:n]...), t.meta...)
		if u := ev.RunResumed.CutOffUsage; u != nil {
			t.cutOff = *u
		}
	case EventTranscriptRestored:
		t.Restored = ev.Restored
	case EventCompactionEnd:
		if ev.CompactionEnd.Error == "" {
			t.Compactions = append(t.Compactions, ev.CompactionEnd)
		}
	case EventRunFinished:
		t.Finished = ev.RunFinished
		t.streaming = false
	case string(agent.EventMessageStart):
		if m := ev.Agent.Message; m != nil && m.Role == agent.RoleAssistant {
			t.builder.Reset(*m)
			t.streaming = true
		}
	case string(agent.EventMessageUpdate):
		if t.streaming && ev.Agent.AssistantMessageEvent != nil {
			t.builder.Apply(ev.Agent.AssistantMessageEvent)
		}
	case string(agent.EventMessageEnd):
		if m := ev.Agent.Message; m != nil {
			t.Messages = append(t.Messages, *m)
			t.meta = append(t.meta, msgMeta{controlSeq: env.ControlSeq, interrupted: env.Interrupted})
		}
		t.streaming = false
	}
	return nil
}

// Partial returns a copy of the assistant message being streamed, or nil.
func (t *Transcript) Partial() *agent.Message {
	if !t.streaming {
		return nil
	}
	m := t.builder.Message().Clone()
	return &m
}

// Done reports whether run_finished was applied.
func (t *Transcript) Done() bool { return t.Finished != nil }

// FinalText returns the text of the last assistant message.
func (t *Transcript) FinalText() string {
	for i := len(t.Messages) - 1; i >= 0; i-- {
		if t.Messages[i].Role == agent.RoleAssistant {
			return t.Messages[i].TextOf()
		}
	}
	return ""
}

// ControlSeqs returns the controlSeq of the messages of the transcript that
// came from control messages, in transcript order: what was delivered.
func (t *Transcript) ControlSeqs() []uint64 {
	var out []uint64
	for _, m := range t.meta {
		if m.controlSeq > 0 {
			out = append(out, m.controlSeq)
		}
	}
	return out
}

// Interrupted reports whether message i ended because its worker was
// stopping (the envelope's interrupted flag).
func (t *Transcript) Interrupted(i int) bool {
	return i >= 0 && i < len(t.meta) && t.meta[i].interrupted
}

// ControlSeq returns the controlSeq of message i: the control message it
// came from, or 0.
func (t *Transcript) ControlSeq(i int) uint64 {
	if i < 0 || i >= len(t.meta) {
		return 0
	}
	return t.meta[i].controlSeq
}

// FallBackToEarlierAttempts makes the view that of the attempts before the
// newest one when the newest (> 1) stored no run_resumed and no message: it
// died before it decided anything. A new attempt's recovery restores that
// view; readers keep what was published.
func (t *Transcript) FallBackToEarlierAttempts() {
	if t.Attempt > 1 && t.Resumed == nil && len(t.Messages) == 0 {
		t.Messages = append([]agent.Message(nil), t.prev...)
		t.meta = append([]msgMeta(nil), t.prevMeta...)
		t.cutOff = t.prevCutOff
	}
}

// CutOffUsage is the usage of the model calls of earlier attempts that the
// view does not have (run_resumed's cutOffUsage, since 1.8): what the run
// was charged beyond its messages' usage.
func (t *Transcript) CutOffUsage() agent.Usage { return t.cutOff }

// LastCompaction is the run's last successful compaction_end, or nil.
func (t *Transcript) LastCompaction() *CompactionEnd {
	if len(t.Compactions) == 0 {
		return nil
	}
	return t.Compactions[len(t.Compactions)-1]
}
