package worker

import (
	"context"
	"fmt"
	"iter"
	"runtime/debug"
	"time"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/worker/internal/metering"
)

// A model call's charge is worked out by internal/metering (its rules are
// there); this file carries it: the call's meter, and meteredProvider,
// which fills it.

// callMeter carries one model call's charge from the provider's
// wrapper to the run's other wrappers. A call's events and its wrappers'
// defers all run on the goroutine that iterates the call: no lock.
type callMeter struct {
	r       *run
	settled bool
	s       metering.Charge
}

type callMeterKey struct{}

// withCallMeter gives a call a meter.
func (r *run) withCallMeter(ctx context.Context) (context.Context, *callMeter) {
	m := &callMeter{r: r}
	return context.WithValue(ctx, callMeterKey{}, m), m
}

func callMeterOf(ctx context.Context) *callMeter {
	m, _ := ctx.Value(callMeterKey{}).(*callMeter)
	return m
}

// chargeOf is the charge of the call whose context is ctx: its meter's
// charge, or, for a call no provider metered (a faux model, or a call
// a wrapper refused before the provider), the usage of its final message
// as it is, with no source.
func chargeOf(ctx context.Context, final *agent.Message) metering.Charge {
	if m := callMeterOf(ctx); m != nil && m.settled {
		return m.s
	}
	if final == nil {
		return metering.Charge{}
	}
	u := metering.NonNegative(final.Usage)
	return metering.Charge{Usage: u, Reported: u}
}

// meteredProvider settles each call of its provider in the call's meter,
// and puts the charge into the final message's usage. Faux models (no
// prices, their usage an estimate already) are not metered. A provider
// that breaks the stream's contract, returning without a final event or
// panicking, has its call ended here with an error event whose message
// (what streamed) carries the charge: the agent would otherwise build that
// message itself, without it.
type meteredProvider struct{ Provider }

// Notice passes on the notice of a provider that has one.
func (p meteredProvider) Notice() string {
	if n, ok := p.Provider.(Noticer); ok {
		return n.Notice()
	}
	return ""
}

func (p meteredProvider) Stream(ctx context.Context, model agent.Model, llm agent.Context, opts agent.StreamOptions) iter.Seq[agent.StreamEvent] {
	m := callMeterOf(ctx)
	if m == nil || m.settled || model.API == "faux" {
		return p.Provider.Stream(ctx, model, llm, opts)
	}
	if opts.MaxTokens <= 0 {
		// The call asks for its output reserve, which its bounds count
		// (the run's agent passes it already).
		opts.MaxTokens = OutputReserve(0, model.MaxTokens)
	}
	return func(yield func(agent.StreamEvent) bool) {
		unsent := ctx.Err() != nil // a stopped run's call is not sent
		b := metering.BoundsOf(model, llm, opts)
		var seen metering.OutputSeen
		var partial agent.MessageBuilder // what streamed, as the agent builds it
		partial.Reset(agent.Message{Role: agent.RoleAssistant, API: model.API, Provider: model.Provider, Model: model.ID})
		started := false
		defer func() {
			if !m.settled { // no final event: the consumer stopped
				m.settle(metering.Settle(model, b, nil, seen, unsent, true))
			}
		}()
		// unfinished ends the call with what streamed, as an error.
		unfinished := func(reason agent.StopReason, text string) *agent.Message {
			msg := partial.Message().Clone()
			msg.StopReason, msg.ErrorMessage = reason, text
			if msg.Timestamp == 0 {
				msg.Timestamp = time.Now().UnixMilli()
			}
			return &msg
		}
		inYield, stopped := false, false
		var panicked any
		var stack []byte
		func() {
			defer func() {
				if inYield {
					return // a panic of the consumer's is not the provider's
				}
				if panicked = recover(); panicked != nil {
					stack = debug.Stack()
				}
			}()
			for ev := range p.Provider.Stream(ctx, model, llm, opts) {
				switch {
				case (ev.Type == agent.StreamDone || ev.Type == agent.StreamError) && !m.settled:
					if ev.Message == nil {
						ev.Message = unfinished(agent.StopReasonError, "stream ended without a message")
					}
					seen.Final(ev.Message)
					s := metering.Settle(model, b, ev.Message, seen, unsent, ctx.Err() != nil)
					m.settle(s)
					if s.Usage != ev.Message.Usage {
						msg := *ev.Message
						msg.Usage = s.Usage
						ev.Message = &msg
					}
				case ev.Type == agent.StreamStart:
					if !started && ev.Message != nil {
						partial.Reset(*ev.Message)
					}
					started = true
				default:
					seen.Add(ev)
					if started {
						partial.Apply(&ev)
					}
				}
				inYield = true
				ok := yield(ev)
				inYield = false
				if !ok {
					stopped = true
					return
				}
			}
		}()
		switch {
		case panicked != nil && (stopped || m.settled):
			panic(panicked) // after the call ended: as it came
		case stopped || m.settled:
			return
		}
		// The provider returned, or panicked, without a final event while
		// the consumer still reads: the call ends here.
		reason, text := agent.StopReasonError, "Stream ended without a final event"
		switch {
		case panicked != nil:
			text = fmt.Sprintf("panic: %v", panicked)
			if m.r != nil {
				m.r.log.Error("model provider panicked; its call ends in an error", "model", m.r.modelRef.String(),
					"panic", panicked, "stack", string(stack))
			}
		case ctx.Err() != nil:
			reason, text = agent.StopReasonAborted, "Request was aborted"
		}
		msg := unfinished(reason, text)
		s := metering.Settle(model, b, msg, seen, unsent, ctx.Err() != nil)
		m.settle(s)
		msg.Usage = s.Usage
		yield(agent.StreamEvent{Type: agent.StreamError, Reason: reason, Message: msg})
	}
}

// settle records the call's charge and logs a clamped usage, once.
func (m *callMeter) settle(s metering.Charge) {
	m.settled, m.s = true, s
	if s.Source != metering.SourceClamped || m.r == nil {
		return
	}
	m.r.log.Warn("model usage: the provider reported more than the call could use; charging the bound",
		"model", m.r.modelRef.String(),
		"reportedInput", s.Reported.Input+s.Reported.CacheRead+s.Reported.CacheWrite, "reportedOutput", s.Reported.Output,
		"excessInput", s.ExcessInput, "excessOutput", s.ExcessOutput,
		"chargedInput", s.Usage.Input+s.Usage.CacheRead+s.Usage.CacheWrite, "chargedOutput", s.Usage.Output,
		"chargedUsd", s.Usage.Cost.Total)
}

// The estimates and bounds of a call's charge (internal/metering), as the
// worker's API gives them.
const (
	// InputClampFactor and InputClampFloor bound the input a provider may
	// report: InputClampFactor times the input estimate plus
	// InputClampFloor, within the model's context window.
	InputClampFactor = metering.InputClampFactor
	InputClampFloor  = metering.InputClampFloor
	// OutputClampMargin: a reported output may pass the call's output
	// bound by 1/OutputClampMargin of it plus 64 tokens.
	OutputClampMargin = metering.OutputClampMargin
	// OutputBytesPerToken counts a call's streamed output when no usage
	// says: its bytes / OutputBytesPerToken, rounded up.
	OutputBytesPerToken = metering.OutputBytesPerToken
	// RequestOverheadTokens is what a call's input estimate adds to its
	// bytes / 4 for the provider's framing.
	RequestOverheadTokens = metering.RequestOverheadTokens
	// MaxTableOutputReserve caps the output reserve a call takes from the
	// model table.
	MaxTableOutputReserve = metering.MaxTableOutputReserve
	// DefaultOutputReserve is a call's output reserve when neither the
	// request nor the model table bounds the output.
	DefaultOutputReserve = metering.DefaultOutputReserve
)

// OutputReserve is a call's output reserve: the request's maxTokens, else
// the model table's (at most MaxTableOutputReserve), else
// DefaultOutputReserve.
func OutputReserve(requestMax, modelMax int) int { return metering.OutputReserve(requestMax, modelMax) }
