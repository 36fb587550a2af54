package worker

import (
	"context"

	"github.com/agentfleet/agentfleet/worker/internal/eventpub"
)

// Test signals let a test stop a run at a step whose race it pins. Each
// component has its own, and calls it through a method that does nothing
// when the test set none: production sets none. The worker only carries
// them to the components (New leaves them zero; a test sets them before
// Run).
type signals struct {
	events   *eventpub.Signals // the event publishers' (worker/internal/eventpub)
	run      runSignals        // a run's steps (run.go)
	control  controlSignals    // a run's control owner (control.go)
	ending   endingSignals     // a run's endings (endings.go)
	approval approvalSignals   // gated calls (approval.go)
}

// runSignals are a run's steps.
type runSignals struct {
	afterRegister     func(r *run)       // once a run takes control messages, before its control owner starts
	afterControlStart func(r *run)       // once its control owner started, before the agent's first call
	beforeResume      func(runID string) // before a later attempt reads its run's events to resume
	beforeIdleCheck   func(runID string) // each time its agent went idle, before the late-control check
	beforeRecordRead  func(runID string) // before each read of a run's record
}

func (s *runSignals) registered(r *run) {
	if s.afterRegister != nil {
		s.afterRegister(r)
	}
}

func (s *runSignals) controlStarted(r *run) {
	if s.afterControlStart != nil {
		s.afterControlStart(r)
	}
}

func (s *runSignals) resuming(runID string) {
	if s.beforeResume != nil {
		s.beforeResume(runID)
	}
}

func (s *runSignals) idle(runID string) {
	if s.beforeIdleCheck != nil {
		s.beforeIdleCheck(runID)
	}
}

func (s *runSignals) readingRecord(runID string) {
	if s.beforeRecordRead != nil {
		s.beforeRecordRead(runID)
	}
}

// controlSignals are a control owner's steps.
type controlSignals struct {
	afterOwnerStarted func(r *run)       // by a run's first owner once it let the run go on
	beforeCatchUpRead func(runID string) // before each read of the control stream
}

func (s *controlSignals) ownerStarted(r *run) {
	if s.afterOwnerStarted != nil {
		s.afterOwnerStarted(r)
	}
}

func (s *controlSignals) catchingUp(runID string) {
	if s.beforeCatchUpRead != nil {
		s.beforeCatchUpRead(runID)
	}
}

// endingSignals are a finish's steps.
type endingSignals struct {
	beforeRequestAck  func(runID string) // before a finished run acknowledges its request
	beforeRunFinished func(runID string) // before a finish publishes run_finished
}

func (s *endingSignals) acking(runID string) {
	if s.beforeRequestAck != nil {
		s.beforeRequestAck(runID)
	}
}

func (s *endingSignals) finishing(runID string) {
	if s.beforeRunFinished != nil {
		s.beforeRunFinished(runID)
	}
}

// approvalSignals are a gated call's steps.
type approvalSignals struct {
	// fenceRead runs before each try to read a gated call's fence, with
	// the try's context: an error it returns is the try's.
	fenceRead func(ctx context.Context) error
}

func (s *approvalSignals) readingFence(ctx context.Context) error {
	if s.fenceRead != nil {
		return s.fenceRead(ctx)
	}
	return nil
}
