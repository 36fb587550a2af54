package protocol

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/invopop/jsonschema"

	"github.com/agentfleet/agentfleet/agent"
	"github.com/agentfleet/agentfleet/bus"
)

// The schema files, each a self-contained JSON Schema (draft 2020-12).
const (
	RunRequestFile = "run-request.schema.json"
	EventFile      = "event.schema.json"
	ControlFile    = "control.schema.json"
	RecordFile     = "record.schema.json"
	PresenceFile   = "presence.schema.json"
	ScheduleFile   = "schedule.schema.json" // since 1.10
)

// Files lists the schema files.
func Files() []string {
	return []string{RunRequestFile, EventFile, ControlFile, RecordFile, PresenceFile, ScheduleFile}
}

// BaseID is the start of every schema's $id: BaseID, the protocol version,
// "/" and the file name.
const BaseID = "https://github.com/agentfleet/agentfleet/protocol/"

// SchemaID is the $id of a schema file for the protocol version this
// code speaks (bus.ProtocolVersion).
func SchemaID(file string) string { return BaseID + bus.ProtocolVersion + "/" + file }

// Patterns the protocol fixes (docs/protocol.md).
const (
	tokenPattern    = `^[A-Za-z0-9_-]{1,64}$` // run ids, queue names, providers (§1)
	versionPattern  = `^[0-9]+\.[0-9]+$`      // "1.<minor>"
	mimePattern     = `^image/[a-z0-9][a-z0-9.+-]{0,62}$`
	modelRefPattern = `^[A-Za-z0-9_-]{1,64}/[^\s]{1,256}$`
)

// Generate returns the schema files, by name, as the generator writes
// them: from the wire types of package bus (and agent's message types),
// with what their struct tags cannot say (enums, patterns, bounds, which
// fields each event type carries) added here, checked against the types
// so that a field added to a wire type either shows up in the schema or
// fails the generation.
func Generate() (map[string][]byte, error) {
	g := &gen{}
	docs := map[string]*jsonschema.Schema{
		RunRequestFile: g.runRequest(),
		EventFile:      g.events(),
		ControlFile:    g.control(),
		RecordFile:     g.record(),
		PresenceFile:   g.presence(),
		ScheduleFile:   g.schedule(),
	}
	if err := errors.Join(g.errs...); err != nil {
		return nil, fmt.Errorf("protocol schemas: %w", err)
	}
	out := make(map[string][]byte, len(docs))
	for name, s := range docs {
		s.Version = "https://json-schema.org/draft/2020-12/schema"
		s.ID = jsonschema.ID(SchemaID(name))
		s.Extras = map[string]any{"x-protocol-version": bus.ProtocolVersion}
		prune(s)
		if err := checkRefs(s); err != nil {
			return nil, fmt.Errorf("protocol schema %s: %w", name, err)
		}
		b, err := encode(s)
		if err != nil {
			return nil, fmt.Errorf("protocol schema %s: %w", name, err)
		}
		out[name] = b
	}
	return out, nil
}

// gen builds the schemas and collects what does not fit.
type gen struct{ errs []error }

func (g *gen) fail(format string, args ...any) { g.errs = append(g.errs, fmt.Errorf(format, args...)) }

// reflect reflects the fields of holder (a struct of the types wanted) into
// definitions named after the types (capitalised), with additional
// properties allowed (open: readers ignore unknown fields) or refused.
// mapped replaces a type's schema (enums, unions, hand-written JSON).
func (g *gen) reflect(holder any, open bool, mapped func(reflect.Type) *jsonschema.Schema, prefix string) jsonschema.Definitions {
	names := map[string]reflect.Type{}
	namer := func(t reflect.Type) string {
		name := t.Name()
		if name == "" {
			return ""
		}
		if t.PkgPath() == reflect.TypeFor[gen]().PkgPath() {
			// The wire forms of this package: their defs take the
			// prefix ("Input" for what clients send).
			name = prefix + strings.ToUpper(name[:1]) + name[1:]
		}
		if have, ok := names[name]; ok && have != t {
			g.fail("two wire types are named %s: %v and %v", name, have, t)
		}
		names[name] = t
		return name
	}
	r := &jsonschema.Reflector{Anonymous: true, AllowAdditionalProperties: open, Mapper: mapped, Namer: namer}
	defs := r.Reflect(holder).Definitions
	delete(defs, namer(reflect.TypeOf(holder)))
	return defs
}

// def returns a definition, recording an error when it is missing.
func (g *gen) def(defs jsonschema.Definitions, name string) *jsonschema.Schema {
	s, ok := defs[name]
	if !ok {
		g.fail("no definition %s", name)
		return &jsonschema.Schema{Properties: jsonschema.NewProperties()}
	}
	return s
}

// prop returns a property of an object schema, recording an error when
// the wire type has no such field (renamed, removed).
func (g *gen) prop(s *jsonschema.Schema, owner, name string) *jsonschema.Schema {
	if s.Properties != nil {
		if p, ok := s.Properties.Get(name); ok {
			return p
		}
	}
	g.fail("%s has no field %q", owner, name)
	return &jsonschema.Schema{}
}

// setProp replaces a property, which must exist.
func (g *gen) setProp(s *jsonschema.Schema, owner, name string, p *jsonschema.Schema) {
	old := g.prop(s, owner, name)
	if p.Description == "" {
		p.Description = old.Description
	}
	s.Properties.Set(name, p)
}

// variant is one event type of a wire struct that carries several (the
// fields it carries; required ones marked).
type variant struct {
	def, typ    string
	description string
	fields      []string // "name" optional, "name!" required
}

// split makes one definition per variant from a struct's schema: its type
// const and the variant's fields (the struct's property schemas). Every
// field of the struct but those in offWire must belong to a variant, so a
// field added to the struct fails here until a variant carries it.
func (g *gen) split(defs jsonschema.Definitions, base string, variants []variant, offWire ...string) []string {
	src := g.def(defs, base)
	used := map[string]bool{"type": true}
	var names []string
	for _, v := range variants {
		s := &jsonschema.Schema{Type: "object", Description: v.description, Properties: jsonschema.NewProperties(), AdditionalProperties: src.AdditionalProperties}
		s.Properties.Set("type", &jsonschema.Schema{Type: "string", Const: v.typ})
		s.Required = []string{"type"}
		for _, f := range v.fields {
			name, required := strings.CutSuffix(f, "!")
			s.Properties.Set(name, g.prop(src, base, name))
			if required {
				s.Required = append(s.Required, name)
			}
			used[name] = true
		}
		defs[v.def] = s
		names = append(names, v.def)
	}
	for _, name := range offWire {
		g.prop(src, base, name)
		used[name] = true
	}
	for name := range src.Properties.KeysFromOldest() {
		if !used[name] {
			g.fail("field %q of %s is carried by no event type: say which in protocol/generate.go", name, base)
		}
	}
	delete(defs, base)
	return names
}

func ref(def string) *jsonschema.Schema { return &jsonschema.Schema{Ref: "#/$defs/" + def} }

func oneOfRefs(defs ...string) *jsonschema.Schema {
	s := &jsonschema.Schema{}
	for _, d := range defs {
		s.OneOf = append(s.OneOf, ref(d))
	}
	return s
}

func enum[T ~string](description string, values ...T) *jsonschema.Schema {
	s := &jsonschema.Schema{Type: "string", Description: description}
	for _, v := range values {
		s.Enum = append(s.Enum, string(v))
	}
	return s
}

func minimum(n int) json.Number { return json.Number(fmt.Sprint(n)) }

func ptr[T any](v T) *T { return &v }

// rename moves a definition; the caller fixes the references to it.
func rename(defs jsonschema.Definitions, from, to string) {
	defs[to] = defs[from]
	delete(defs, from)
}

// The enums of the protocol, by def name.

func stopReasonDef() *jsonschema.Schema {
	return enum("Why an assistant message ended (errorMessage says more for error).",
		agent.StopReasonStop, agent.StopReasonLength, agent.StopReasonToolUse, agent.StopReasonError, agent.StopReasonAborted)
}

func statusDef() *jsonschema.Schema {
	return enum("How a run ended.", bus.StatusSucceeded, bus.StatusFailed, bus.StatusAborted)
}

func reasonDef() *jsonschema.Schema {
	return enum("Why a run failed or was aborted (docs/protocol.md §4, run_finished).",
		bus.ReasonModelError, bus.ReasonBadRequest, bus.ReasonMaxTurns, bus.ReasonTimeout, bus.ReasonTokenBudget,
		bus.ReasonAbortedByUser, bus.ReasonEventTooLarge, bus.ReasonEventBudget, bus.ReasonControlBudget,
		bus.ReasonTranscriptTooLarge, bus.ReasonInternal, bus.ReasonGaveUp, bus.ReasonBudgetExceeded, bus.ReasonApprovalTimeout,
		bus.ReasonCompactionFailed)
}

// reasonRequired: a failed or aborted run says why.
func reasonRequired(field string) (ifs, then *jsonschema.Schema) {
	return oneProp(field, enum("", bus.StatusFailed, bus.StatusAborted), field), &jsonschema.Schema{Required: []string{"reason"}}
}

// messageDefs fills in the wire forms of messages and blocks reflected
// from wireMessages (named with prefix): the role and type constants, the
// blocks each role holds, and the unions Message and Content.
func (g *gen) messageDefs(defs jsonschema.Definitions, prefix string) {
	for _, c := range []struct{ def, typ string }{
		{"TextContent", agent.ContentText}, {"ThinkingContent", agent.ContentThinking},
		{"ImageContent", agent.ContentImage}, {"ToolCallContent", agent.ContentToolCall},
	} {
		s := g.def(defs, prefix+c.def)
		g.setProp(s, c.def, "type", &jsonschema.Schema{Type: "string", Const: c.typ})
	}
	roles := []struct {
		def   string
		roles []string
	}{
		{"UserMessage", []string{agent.RoleUser}}, {"AssistantMessage", []string{agent.RoleAssistant}},
		{"ToolResultMessage", []string{agent.RoleToolResult}}, {"SystemMessage", []string{agent.RoleSystem, agent.RoleDeveloper}},
	}
	for _, r := range roles {
		s := g.def(defs, prefix+r.def)
		if len(r.roles) == 1 {
			g.setProp(s, r.def, "role", &jsonschema.Schema{Type: "string", Const: r.roles[0]})
		} else {
			g.setProp(s, r.def, "role", enum("", r.roles...))
		}
		g.prop(s, r.def, "timestamp").Description = "Unix milliseconds."
	}
	a := g.def(defs, prefix+"AssistantMessage")
	g.setProp(a, "AssistantMessage", "stopReason", &jsonschema.Schema{
		AnyOf:       []*jsonschema.Schema{ref("StopReason"), {Type: "string", Const: ""}},
		Description: `Empty ("") only in the header of a streamed assistant message (message_start).`,
	})
	defs["StopReason"] = stopReasonDef()
	defs[prefix+"Message"] = oneOfRefs(prefix+"UserMessage", prefix+"AssistantMessage", prefix+"ToolResultMessage", prefix+"SystemMessage")
	defs[prefix+"Message"].Description = "A pi message (docs/protocol.md §5), by role."
	defs[prefix+"Content"] = oneOfRefs(prefix+"TextContent", prefix+"ThinkingContent", prefix+"ImageContent", prefix+"ToolCallContent")
	defs[prefix+"Content"].Description = "A content block, by type."
}

// blockMapper maps the stand-ins of a role's blocks to the block defs.
func blockMapper(prefix string) func(reflect.Type) *jsonschema.Schema {
	return func(t reflect.Type) *jsonschema.Schema {
		switch t {
		case reflect.TypeFor[userBlock]():
			return oneOfRefs(prefix+"TextContent", prefix+"ImageContent")
		case reflect.TypeFor[assistantBlock]():
			return oneOfRefs(prefix+"TextContent", prefix+"ThinkingContent", prefix+"ToolCallContent", prefix+"ImageContent")
		case reflect.TypeFor[agent.StopReason]():
			return ref("StopReason")
		case reflect.TypeFor[agent.Message]():
			return ref(prefix + "Message")
		case reflect.TypeFor[agent.Content]():
			return ref(prefix + "Content")
		}
		return nil
	}
}

// events is event.schema.json: the envelope of §4 with every event type.
func (g *gen) events() *jsonschema.Schema {
	type holder struct {
		Envelope     bus.Envelope
		RunStarted   bus.RunStarted
		RunFinished  bus.RunFinished
		RunResumed   bus.RunResumed
		Restored     bus.TranscriptRestored
		RunParked    bus.RunParked
		ModelWait    bus.ModelWait
		ToolApproval bus.ToolApproval
		Control      bus.ControlRejected
		CompStart    bus.CompactionStart
		CompEnd      bus.CompactionEnd
		AgentEvent   bus.AgentEvent
		Messages     wireMessages
	}
	defs := g.reflect(holder{}, true, blockMapper(""), "")
	delete(defs, "WireMessages")
	g.messageDefs(defs, "")

	env := g.def(defs, "Envelope")
	delete(defs, "Envelope")
	env.Title = "agentfleet run event envelope"
	env.Description = "One message on agents.run.{run}.events (docs/protocol.md §4). Readers must ignore fields they do not know, " +
		"and envelopes whose event type they do not know: this schema describes one protocol version (x-protocol-version), " +
		"and later versions add fields and event types."
	g.prop(env, "Envelope", "run").Pattern = tokenPattern
	g.prop(env, "Envelope", "seq").Minimum = minimum(1)
	g.prop(env, "Envelope", "seq").Description = "1, 2, 3, ... within each attempt, without gaps."
	g.prop(env, "Envelope", "attempt").Minimum = minimum(1)
	g.prop(env, "Envelope", "ts").Description = "Unix milliseconds."
	g.prop(env, "Envelope", "controlSeq").Minimum = minimum(1)
	g.prop(env, "Envelope", "controlSeq").Description = "On the message_start and message_end of a user message that came from a control message: its AGENTS_CONTROL sequence."
	g.prop(env, "Envelope", "interrupted").Const = true
	g.prop(env, "Envelope", "interrupted").Description = "Only true, only on a message_end or tool_execution_end cut off because its worker was stopping."
	g.setProp(env, "Envelope", "event", ref("Event"))

	// Fleet events.
	rs := g.def(defs, "RunStarted")
	rs.Description = "The first event of every attempt, bad requests included."
	g.setProp(rs, "RunStarted", "type", &jsonschema.Schema{Type: "string", Const: bus.EventRunStarted})
	g.prop(rs, "RunStarted", "protocol").Pattern = versionPattern
	g.prop(rs, "RunStarted", "protocol").Description = "The protocol version the worker speaks (absent before 1.1)."
	g.prop(rs, "RunStarted", "queue").Pattern = tokenPattern
	g.prop(rs, "RunStarted", "attempt").Minimum = minimum(1)
	g.prop(rs, "RunStarted", "continueFrom").Pattern = tokenPattern
	g.prop(rs, "RunStarted", "submittedAt").Description = "When AGENTS_RUNS stored the request, Unix milliseconds."
	rename(defs, "RunStarted", "RunStartedEvent")

	rf := g.def(defs, "RunFinished")
	rf.Description = "The last event of a run; exactly one per run."
	g.setProp(rf, "RunFinished", "type", &jsonschema.Schema{Type: "string", Const: bus.EventRunFinished})
	g.setProp(rf, "RunFinished", "status", ref("Status"))
	g.setProp(rf, "RunFinished", "reason", ref("Reason"))
	g.prop(rf, "RunFinished", "lastControlSeq").Minimum = minimum(1)
	rf.If, rf.Then = reasonRequired("status")
	rename(defs, "RunFinished", "RunFinishedEvent")
	defs["Status"] = statusDef()
	defs["Reason"] = reasonDef()

	rr := g.def(defs, "RunResumed")
	rr.Description = "Right after run_started of an attempt that continues the transcript of earlier ones."
	g.setProp(rr, "RunResumed", "type", &jsonschema.Schema{Type: "string", Const: bus.EventRunResumed})
	g.prop(rr, "RunResumed", "attempt").Minimum = minimum(2)
	rename(defs, "RunResumed", "RunResumedEvent")

	tr := g.def(defs, "TranscriptRestored")
	tr.Description = "Right after run_started (or run_resumed) of every attempt of a continuation (since 1.9, §4): the transcript begins with the first messages messages of run from's, which are not published again (its snapshot holds them, §2)."
	g.setProp(tr, "TranscriptRestored", "type", &jsonschema.Schema{Type: "string", Const: bus.EventTranscriptRestored})
	g.prop(tr, "TranscriptRestored", "from").Pattern = tokenPattern
	g.prop(tr, "TranscriptRestored", "messages").Minimum = minimum(0)
	g.prop(tr, "TranscriptRestored", "bytes").Minimum = minimum(0)
	g.prop(tr, "TranscriptRestored", "bytes").Description = "The size of those messages as a JSON array."
	rename(defs, "TranscriptRestored", "TranscriptRestoredEvent")

	rp := g.def(defs, "RunParked")
	rp.Description = "The attempt parked the run (since 1.9, §13): its request was acknowledged and nothing of it is on a worker; an answer or an abort wakes it (a new attempt, run_started). Readers that do not know it skip it."
	g.setProp(rp, "RunParked", "type", &jsonschema.Schema{Type: "string", Const: bus.EventRunParked})
	g.prop(rp, "RunParked", "attempt").Minimum = minimum(1)
	rename(defs, "RunParked", "RunParkedEvent")

	mw := g.def(defs, "ModelWait")
	mw.Description = "A model call waited (shared rate limits, or the tenant's next budget period), published once it proceeds (since 1.2)."
	g.setProp(mw, "ModelWait", "type", &jsonschema.Schema{Type: "string", Const: bus.EventModelWait})
	g.setProp(mw, "ModelWait", "reason", enum("", bus.WaitRateLimit, bus.WaitBudget))
	rename(defs, "ModelWait", "ModelWaitEvent")

	ta := g.def(defs, "ToolApproval")
	g.prop(ta, "ToolApproval", "expiresAt").Description = "Unix milliseconds."
	g.prop(ta, "ToolApproval", "controlSeq").Minimum = minimum(1)
	g.setProp(ta, "ToolApproval", "parameters", &jsonschema.Schema{Type: "object",
		Description: "The tool's JSON Schema, which an edit must pass (since 1.8); absent when larger than 16 KiB."})
	g.prop(ta, "ToolApproval", "controlSeq").Description = "The answer's AGENTS_CONTROL sequence."
	g.setProp(ta, "ToolApproval", "decision", enum("timeout: no answer by expiresAt.", bus.DecisionApprove, bus.DecisionDeny, bus.DecisionTimeout))
	approvals := g.split(defs, "ToolApproval", []variant{
		{"ToolApprovalRequestedEvent", bus.EventToolApprovalRequested, "A gated tool call waits for a person's answer (since 1.3, §13).",
			[]string{"toolCallId!", "toolName!", "args", "expiresAt!", "answersAfter", "parameters"}},
		{"ToolApprovalResolvedEvent", bus.EventToolApprovalResolved, "A gated call got its answer, or timed out (since 1.3).",
			[]string{"toolCallId!", "decision!", "by", "reason", "controlSeq", "arguments"}},
		{"ToolApprovalRejectedEvent", bus.EventToolApprovalRejected, "An answer that could not be applied (an invalid body or edit); the call goes on waiting (since 1.3).",
			[]string{"toolCallId!", "reason!", "controlSeq!"}},
	})

	cr := g.def(defs, "ControlRejected")
	cr.Description = "A steer or follow-up the run did not take (an invalid body), so that its sender learns why (since 1.8, §6)."
	g.setProp(cr, "ControlRejected", "type", &jsonschema.Schema{Type: "string", Const: bus.EventControlRejected})
	g.setProp(cr, "ControlRejected", "kind", enum("", bus.KindSteer, bus.KindFollowUp, bus.KindCompact))
	g.prop(cr, "ControlRejected", "controlSeq").Minimum = minimum(1)
	rename(defs, "ControlRejected", "ControlRejectedEvent")

	cs := g.def(defs, "CompactionStart")
	cs.Description = "A compaction of the run's context began (since 1.10, §4 Compaction): its summary call is under way."
	g.setProp(cs, "CompactionStart", "type", &jsonschema.Schema{Type: "string", Const: bus.EventCompactionStart})
	g.setProp(cs, "CompactionStart", "reason", enum("", bus.CompactionThreshold, bus.CompactionOverflow, bus.CompactionManual))
	g.prop(cs, "CompactionStart", "controlSeq").Minimum = minimum(1)
	rename(defs, "CompactionStart", "CompactionStartEvent")

	ce := g.def(defs, "CompactionEnd")
	ce.Description = "A compaction ended (since 1.10): without error, the model is sent the summary and the transcript from message firstKeptIndex on; with error, no summary was made: the run failed when run_finished says so (compaction_failed, or budget_exceeded when a budget refused the call); a cancelled one is done again by the next attempt."
	g.setProp(ce, "CompactionEnd", "type", &jsonschema.Schema{Type: "string", Const: bus.EventCompactionEnd})
	g.setProp(ce, "CompactionEnd", "reason", enum("", bus.CompactionThreshold, bus.CompactionOverflow, bus.CompactionManual))
	g.prop(ce, "CompactionEnd", "firstKeptIndex").Minimum = minimum(1)
	g.prop(ce, "CompactionEnd", "firstKeptIndex").Description = "Index of the first kept message in the run's whole transcript (a continuation's prior messages included)."
	g.prop(ce, "CompactionEnd", "controlSeq").Minimum = minimum(1)
	rename(defs, "CompactionEnd", "CompactionEndEvent")

	// message_update carries one step of the assistant stream.
	se := g.def(defs, "StreamEvent")
	g.prop(se, "StreamEvent", "contentIndex").Minimum = minimum(0)
	g.setProp(se, "StreamEvent", "toolCall", ref("ToolCallContent"))
	steps := g.split(defs, "StreamEvent", []variant{
		{"TextStart", string(agent.StreamTextStart), "", []string{"contentIndex!", "signature"}},
		{"TextDelta", string(agent.StreamTextDelta), "Append delta to the block's text (absent when empty).", []string{"contentIndex!", "delta"}},
		{"TextEnd", string(agent.StreamTextEnd), "content is the block's full text (absent when empty).", []string{"contentIndex!", "content", "signature"}},
		{"ThinkingStart", string(agent.StreamThinkingStart), "", []string{"contentIndex!", "signature"}},
		{"ThinkingDelta", string(agent.StreamThinkingDelta), "", []string{"contentIndex!", "delta"}},
		{"ThinkingEnd", string(agent.StreamThinkingEnd), "", []string{"contentIndex!", "content", "signature"}},
		{"ToolCallStart", string(agent.StreamToolCallStart), "", []string{"contentIndex!", "id!", "name!"}},
		{"ToolCallDelta", string(agent.StreamToolCallDelta), "delta is a fragment of the arguments' JSON.", []string{"contentIndex!", "delta"}},
		{"ToolCallEnd", string(agent.StreamToolCallEnd), "", []string{"contentIndex!", "toolCall!"}},
	}, "reason", "arguments") // only on done/error and deltas the worker does not send
	defs["AssistantMessageEvent"] = oneOfRefs(steps...)
	defs["AssistantMessageEvent"].Description = "One step of the assistant stream (docs/protocol.md §4, Agent events)."

	ae := g.def(defs, "AgentEvent")
	g.setProp(ae, "AgentEvent", "assistantMessageEvent", ref("AssistantMessageEvent"))
	g.prop(ae, "AgentEvent", "messageSeq").Description = "The seq of the turn's assistant message_end (absent when it was not published)."
	g.prop(ae, "AgentEvent", "toolResultSeqs").Description = "The seqs of the turn's tool results' message_end (absent when none)."
	g.prop(ae, "AgentEvent", "messageSeqs").Description = "The seqs of the message_end events of the messages this agent run added."
	g.prop(ae, "AgentEvent", "messageCount").Minimum = minimum(0)
	agentEvents := g.split(defs, "AgentEvent", []variant{
		{"AgentStartEvent", string(agent.EventAgentStart), "", nil},
		{"AgentEndEvent", string(agent.EventAgentEnd), "", []string{"messageCount!", "messageSeqs"}},
		{"TurnStartEvent", string(agent.EventTurnStart), "", nil},
		{"TurnEndEvent", string(agent.EventTurnEnd), "", []string{"messageSeq", "toolResultSeqs"}},
		{"MessageStartEvent", string(agent.EventMessageStart), "For a streamed assistant message: its header, no content yet.", []string{"message!"}},
		{"MessageUpdateEvent", string(agent.EventMessageUpdate), "", []string{"assistantMessageEvent!"}},
		{"MessageEndEvent", string(agent.EventMessageEnd), "", []string{"message!"}},
		{"ToolExecutionStartEvent", string(agent.EventToolExecutionStart), "args is absent when the call has none.", []string{"toolCallId!", "toolName!", "args"}},
		{"ToolExecutionUpdateEvent", string(agent.EventToolExecutionUpdate), "", []string{"toolCallId!", "toolName!", "args", "partialResult!"}},
		{"ToolExecutionEndEvent", string(agent.EventToolExecutionEnd), "", []string{"toolCallId!", "toolName!", "result!", "isError!"}},
	})

	all := append([]string{"RunStartedEvent", "RunResumedEvent", "TranscriptRestoredEvent", "RunParkedEvent", "RunFinishedEvent", "ModelWaitEvent", "ControlRejectedEvent",
		"CompactionStartEvent", "CompactionEndEvent"}, approvals...)
	defs["Event"] = oneOfRefs(append(all, agentEvents...)...)
	defs["Event"].Description = "The event, by its type."
	env.Definitions = defs
	return env
}

// runRequest is run-request.schema.json: §3's request, as clients send it.
func (g *gen) runRequest() *jsonschema.Schema {
	type holder struct{ RunRequest bus.RunRequest }
	mapped := func(t reflect.Type) *jsonschema.Schema {
		switch t {
		case reflect.TypeFor[bus.ModelRef]():
			return ref("ModelRef")
		case reflect.TypeFor[agent.ThinkingLevel]():
			return ref("ThinkingLevel")
		case reflect.TypeFor[agent.ExecutionMode]():
			return ref("ToolExecution")
		case reflect.TypeFor[agent.QueueMode]():
			return ref("QueueMode")
		}
		return blockMapper("Input")(t)
	}
	defs := g.reflect(holder{}, false, mapped, "Input")
	g.inputMessages(defs)
	// A request's messages take no system text (since 1.8: systemPrompt
	// sets it).
	defs["InputMessage"] = oneOfRefs("InputUserMessage", "InputAssistantMessage", "InputToolResultMessage")
	defs["InputMessage"].Description = "A pi message (docs/protocol.md §5), by role: user, assistant or toolResult."
	delete(defs, "InputSystemMessage")
	// The worker requires only what it checks; the Go client leaves out
	// what is empty. Requirements are added back one by one below.
	for _, name := range []string{"RunRequest", "Limits", "FauxScript", "ScriptedResponse", "Approval"} {
		g.def(defs, name).Required = nil
	}
	req := g.def(defs, "RunRequest")
	delete(defs, "RunRequest")
	req.Title = "agentfleet run request"
	req.Description = "The body published to agents.submit.{queue}.{run} (docs/protocol.md §3), and of a dead letter on agents.dead.{queue}.{run} (§9). " +
		"Unknown fields are refused, except inside messages and content blocks. Sizes in bytes are those of the UTF-8 text; " +
		"maxLength counts characters, so it bounds ASCII text exactly and other text loosely."
	p := func(name string) *jsonschema.Schema { return g.prop(req, "RunRequest", name) }
	p("id").Pattern = tokenPattern
	p("id").Description = "Optional; must equal the run token of the subject."
	p("systemPrompt").MaxLength = ptr[uint64](bus.MaxSystemPromptBytes)
	p("prompt").MaxLength = ptr[uint64](bus.MaxPromptBytes)
	p("prompt").Description = "The user's message."
	g.setProp(req, "RunRequest", "images", &jsonschema.Schema{Type: "array", Items: ref("PromptImage"), MaxItems: ptr[uint64](bus.MaxImages),
		Description: "Image blocks added to the prompt message (needs a prompt)."})
	p("messages").MaxItems = ptr[uint64](bus.MaxMessages)
	p("messages").Description = "pi messages placed before prompt; without a prompt they must not end with an assistant message."
	p("tools").MaxItems = ptr[uint64](bus.MaxTools)
	p("tools").UniqueItems = true
	p("tools").Items = &jsonschema.Schema{Type: "string", MinLength: ptr[uint64](1), Not: &jsonschema.Schema{Const: "*"},
		Description: `A tool name, or a whole source "<source>__*"; "*" alone is refused.`}
	p("temperature").Minimum, p("temperature").Maximum = minimum(0), minimum(2)
	p("maxTokens").Minimum, p("maxTokens").Maximum = minimum(0), minimum(bus.MaxTokensLimit)
	p("maxTokens").Description = "The output tokens each model call asks for (max_tokens); 0: the model table's maxTokens, at most 32000, else 4096 (§14)."
	p("continueFrom").Pattern = tokenPattern
	p("continueFrom").Description = "A finished run's id on the same queue."
	cc := g.def(defs, "Concurrency")
	cc.Description = "Since 1.10: at most limit runs with key run at once across the fleet (§3, Concurrency keys)."
	g.prop(cc, "Concurrency", "key").MinLength, g.prop(cc, "Concurrency", "key").MaxLength = ptr[uint64](1), ptr[uint64](bus.MaxConcurrencyKeyBytes)
	g.prop(cc, "Concurrency", "limit").Minimum, g.prop(cc, "Concurrency", "limit").Maximum = minimum(0), minimum(bus.MaxConcurrencyLimit)
	g.prop(cc, "Concurrency", "limit").Description = "0 or absent: the workers' default for the key (--concurrency-key-limit); with both, the lower."
	g.setProp(req, "RunRequest", "priority", enum("Since 1.10: the run's lane; default normal. A high or low request is published to agents.lane.{queue}.{priority}._.{run} (§3, Priority lanes).",
		bus.PriorityHigh, bus.PriorityNormal, bus.PriorityLow))
	md := p("metadata")
	md.MaxProperties = ptr[uint64](bus.MaxMetadata)
	md.PropertyNames = &jsonschema.Schema{MinLength: ptr[uint64](1), MaxLength: ptr[uint64](bus.MaxMetadataKey)}
	md.AdditionalProperties = &jsonschema.Schema{Type: "string", MaxLength: ptr[uint64](bus.MaxMetadataValue)}
	md.Description = "Copied to run_started and the record."
	req.AnyOf = []*jsonschema.Schema{
		oneProp("prompt", &jsonschema.Schema{MinLength: ptr[uint64](1)}, "prompt"),
		oneProp("messages", &jsonschema.Schema{MinItems: ptr[uint64](1)}, "messages"),
	}
	req.DependentRequired = map[string][]string{"images": {"prompt"}}

	mr := &jsonschema.Schema{Type: "object", Properties: jsonschema.NewProperties(), Required: []string{"provider", "id"}, AdditionalProperties: jsonschema.FalseSchema}
	mr.Properties.Set("provider", &jsonschema.Schema{Type: "string", Pattern: tokenPattern})
	mr.Properties.Set("id", &jsonschema.Schema{Type: "string", Pattern: `^[^\s]{1,256}$`})
	g.checkFields(reflect.TypeFor[bus.ModelRef](), mr)
	defs["ModelRef"] = &jsonschema.Schema{
		Description: `{"provider":"openai","id":"gpt-4o-mini"} or "openai/gpt-4o-mini" (split at the first "/"); absent: the worker's default model.`,
		OneOf:       []*jsonschema.Schema{{Type: "string", Pattern: modelRefPattern}, mr},
	}
	defs["ThinkingLevel"] = enum("", agent.ThinkingOff, agent.ThinkingMinimal, agent.ThinkingLow, agent.ThinkingMedium,
		agent.ThinkingHigh, agent.ThinkingXHigh, agent.ThinkingMax)
	defs["ToolExecution"] = enum("Default parallel.", agent.ExecutionParallel, agent.ExecutionSequential)
	defs["QueueMode"] = enum("How many queued messages one drain point takes; default one-at-a-time.", agent.QueueOneAtATime, agent.QueueAll)

	img := cloneSchema(g.def(defs, "InputImageContent"))
	img.Required = []string{"type", "data", "mimeType"}
	img.Properties.Set("data", &jsonschema.Schema{Type: "string", MinLength: ptr[uint64](1), ContentEncoding: "base64"})
	defs["PromptImage"] = img

	l := g.def(defs, "Limits")
	g.prop(l, "Limits", "maxTurns").Minimum, g.prop(l, "Limits", "maxTurns").Maximum = minimum(0), minimum(bus.MaxTurnsLimit)
	g.prop(l, "Limits", "maxTurns").Description = fmt.Sprintf("Default %d; 0 takes the default.", bus.DefaultMaxTurns)
	g.prop(l, "Limits", "timeoutSeconds").Minimum, g.prop(l, "Limits", "timeoutSeconds").Maximum = minimum(0), minimum(bus.MaxTimeoutSeconds)
	g.prop(l, "Limits", "timeoutSeconds").Description = fmt.Sprintf("Default %d; 0 takes the default.", bus.DefaultTimeoutSeconds)
	g.prop(l, "Limits", "maxTotalTokens").Minimum = minimum(0)
	g.prop(l, "Limits", "maxCostUsd").Minimum = minimum(0)
	g.prop(l, "Limits", "maxCostUsd").Description = "Dollars at the model table's prices (since 1.2); 0: no bound."

	f := g.def(defs, "FauxScript")
	f.Description = "Only with provider faux: a scripted model."
	g.prop(f, "FauxScript", "responses").MaxItems = ptr[uint64](bus.MaxFauxResponses)
	g.prop(f, "FauxScript", "tokenSize").Minimum, g.prop(f, "FauxScript", "tokenSize").Maximum = minimum(0), minimum(bus.MaxFauxTokenSize)
	g.prop(f, "FauxScript", "tokensPerSecond").Minimum, g.prop(f, "FauxScript", "tokensPerSecond").Maximum = minimum(0), minimum(int(bus.MaxFauxTokensPerSec))
	g.prop(f, "FauxScript", "fixedPace").Description = "Since 1.5; ignored without tokensPerSecond."
	sr := g.def(defs, "ScriptedResponse")
	g.prop(sr, "ScriptedResponse", "errorMessage").MaxLength = ptr[uint64](bus.MaxFauxErrorBytes)

	a := g.def(defs, "Approval")
	a.Description = "Since 1.3: gated tools wait for a person's answer before they run (§13)."
	a.Required = []string{"tools"}
	at := g.prop(a, "Approval", "tools")
	at.MinItems, at.MaxItems = ptr[uint64](1), ptr[uint64](bus.MaxApprovalTools)
	at.Items = &jsonschema.Schema{Type: "string", MinLength: ptr[uint64](1), MaxLength: ptr[uint64](bus.MaxApprovalPatternBytes),
		Description: `A tool name or pattern ("*" matches any run of characters; "*" alone gates every call).`}
	g.prop(a, "Approval", "timeoutSeconds").Minimum = minimum(0)
	g.prop(a, "Approval", "timeoutSeconds").Maximum = minimum(bus.MaxApprovalTimeoutSeconds)
	g.prop(a, "Approval", "timeoutSeconds").Description = fmt.Sprintf("Default %d; 0 takes the default.", bus.DefaultApprovalTimeoutSeconds)
	g.setProp(a, "Approval", "onTimeout", enum("Default deny.", bus.OnTimeoutDeny, bus.OnTimeoutAbort))

	req.Definitions = defs
	return req
}

// inputMessages adds the messages and blocks as clients send them (in a
// request's messages, images and faux script, and in a steer or
// follow-up): named Input…, open (unknown fields inside a message or a
// block are ignored), with only what the worker requires required, a
// timestamp that may be any number, and a user, system or developer
// message's content that may be a plain string.
func (g *gen) inputMessages(defs jsonschema.Definitions) {
	in := g.reflect(wireMessages{}, true, blockMapper("Input"), "Input")
	delete(in, "InputWireMessages")
	g.messageDefs(in, "Input")
	for _, d := range []string{"InputTextContent", "InputThinkingContent", "InputImageContent", "InputToolCallContent"} {
		g.def(in, d).Required = []string{"type"}
	}
	tc := g.def(in, "InputToolCallContent")
	tc.Required = []string{"type", "id", "name"}
	g.prop(tc, "ToolCallContent", "id").MinLength = ptr[uint64](1)
	g.prop(tc, "ToolCallContent", "name").MinLength = ptr[uint64](1)
	im := g.def(in, "InputImageContent")
	im.Required = []string{"type", "mimeType"}
	g.prop(im, "ImageContent", "mimeType").Pattern = mimePattern
	for _, d := range []string{"InputUserMessage", "InputAssistantMessage", "InputToolResultMessage", "InputSystemMessage"} {
		s := g.def(in, d)
		s.Required = []string{"role"}
		g.setProp(s, d, "timestamp", &jsonschema.Schema{Type: "number", Description: "Unix milliseconds."})
	}
	for _, d := range []string{"InputUserMessage", "InputSystemMessage"} {
		s := g.def(in, d)
		blocks := g.prop(s, d, "content")
		g.setProp(s, d, "content", &jsonschema.Schema{AnyOf: []*jsonschema.Schema{{Type: "string"}, blocks}, Description: "Blocks, or a plain string (one text block)."})
	}
	for name, s := range in {
		if _, ok := defs[name]; ok && name != "StopReason" && name != "Usage" && name != "Cost" {
			g.fail("input definition %s is defined twice", name)
		}
		defs[name] = s
	}
}

// control is control.schema.json: the bodies of §6 and §13.
func (g *gen) control() *jsonschema.Schema {
	type holder struct {
		Control        bus.Control
		ApprovalAnswer bus.ApprovalAnswer
	}
	mapped := func(t reflect.Type) *jsonschema.Schema {
		if t == reflect.TypeFor[agent.Message]() {
			return ref("ControlMessage")
		}
		return nil
	}
	defs := g.reflect(holder{}, false, mapped, "Input")
	g.inputMessages(defs)
	cm := cloneSchema(g.def(defs, "InputUserMessage"))
	cm.Required = []string{"role", "content"}
	blocks := g.prop(cm, "ControlMessage", "content").AnyOf[1]
	blocks.MinItems = ptr[uint64](1)
	cm.Description = "A pi user message with content; a missing timestamp is the time the stream stored the control message."
	defs["ControlMessage"] = cm

	c := g.def(defs, "Control")
	steer := &jsonschema.Schema{Type: "object", Properties: jsonschema.NewProperties(), AdditionalProperties: jsonschema.FalseSchema,
		Description: `The body on agents.run.{run}.steer and .followup: {"text":"..."} or {"message":<pi user message>}, exactly one (at most 256 KiB).`,
		OneOf: []*jsonschema.Schema{
			{Required: []string{"text"}},
			{Required: []string{"message"}},
		}}
	text := g.prop(c, "Control", "text")
	text.MinLength = ptr[uint64](1)
	steer.Properties.Set("text", text)
	steer.Properties.Set("message", g.prop(c, "Control", "message"))
	abort := &jsonschema.Schema{Type: "object", Properties: jsonschema.NewProperties(), AdditionalProperties: jsonschema.FalseSchema,
		Description: "The body on agents.run.{run}.abort, as clients send it (a worker takes any body as an abort)."}
	abort.Properties.Set("reason", g.prop(c, "Control", "reason"))
	g.checkFields(reflect.TypeFor[bus.Control](), steer, abort)
	delete(defs, "Control")
	defs["SteerBody"] = steer
	defs["FollowUpBody"] = &jsonschema.Schema{Ref: "#/$defs/SteerBody", Description: "The body on agents.run.{run}.followup: as a steer's."}
	defs["AbortBody"] = abort
	compact := &jsonschema.Schema{Type: "object", Properties: jsonschema.NewProperties(), AdditionalProperties: jsonschema.FalseSchema,
		Description: "The body on agents.run.{run}.compact (since 1.10): compact the context now; text, if any, focuses the summary. An empty body is {}."}
	ct := cloneSchema(text)
	ct.MaxLength = ptr[uint64](bus.MaxCompactionInstructions)
	compact.Properties.Set("text", ct)
	defs["CompactBody"] = compact

	a := g.def(defs, "ApprovalAnswer")
	a.Description = "The body on agents.run.{run}.approve (since 1.3, §13): the answer to a gated tool call."
	g.prop(a, "ApprovalAnswer", "toolCallId").MinLength = ptr[uint64](1)
	g.prop(a, "ApprovalAnswer", "toolCallId").MaxLength = ptr[uint64](256)
	g.setProp(a, "ApprovalAnswer", "decision", enum("", bus.DecisionApprove, bus.DecisionDeny))
	g.prop(a, "ApprovalAnswer", "reason").MaxLength = ptr[uint64](bus.MaxApprovalReason)
	g.prop(a, "ApprovalAnswer", "by").MaxLength = ptr[uint64](bus.MaxApprovalBy)
	g.prop(a, "ApprovalAnswer", "by").Description = "Display text, unauthenticated."
	g.prop(a, "ApprovalAnswer", "arguments").Description = "Only with approve: the approver's edit of the call's arguments."
	a.If = oneProp("decision", &jsonschema.Schema{Const: bus.DecisionDeny}, "decision")
	a.Then = &jsonschema.Schema{Not: &jsonschema.Schema{Required: []string{"arguments"}}}

	root := &jsonschema.Schema{
		Title: "agentfleet control message body",
		Description: "The body of a control message on agents.run.{run}.{kind} (docs/protocol.md §6, §13): " +
			"SteerBody for steer, FollowUpBody for followup, AbortBody for abort, ApprovalAnswer for approve, CompactBody for compact. Validate a body against the definition of its kind.",
		AnyOf:       []*jsonschema.Schema{ref("SteerBody"), ref("FollowUpBody"), ref("AbortBody"), ref("ApprovalAnswer"), ref("CompactBody")},
		Definitions: defs,
	}
	return root
}

// record is record.schema.json: §7's run record.
func (g *gen) record() *jsonschema.Schema {
	type holder struct{ RunRecord bus.RunRecord }
	defs := g.reflect(holder{}, true, nil, "")
	r := g.def(defs, "RunRecord")
	delete(defs, "RunRecord")
	r.Title = "agentfleet run record"
	r.Description = "The value of key {run} in KV bucket agents_runs (docs/protocol.md §7). Readers must ignore fields they do not know."
	p := func(name string) *jsonschema.Schema { return g.prop(r, "RunRecord", name) }
	p("id").Pattern = tokenPattern
	p("queue").Pattern = tokenPattern
	g.setProp(r, "RunRecord", "state", ref("State"))
	g.setProp(r, "RunRecord", "reason", ref("Reason"))
	p("attempt").Minimum = minimum(1)
	p("attempt").Description = "The attempt that holds the run."
	p("requestSeq").Description = "The AGENTS_RUNS sequence of the request."
	p("model").Description = `"provider/id".`
	p("title").MaxLength = ptr[uint64](bus.MaxTitleBytes)
	p("title").Description = `Metadata "title", else the prompt's first line (since 1.8).`
	p("tenant").Description = "Who the run is charged to: metadata.tenant, or the worker's budgets' tenant (since 1.8)."
	g.setProp(r, "RunRecord", "priority", enum("The lane its request came from (since 1.10); absent: normal.", bus.PriorityHigh, bus.PriorityLow))
	p("stale").Description = "Set by clients (Status, List) on a running record whose heartbeat is too old; never stored."
	p("waitedMs").Description = "Time spent waiting for approvals over all attempts (since 1.3)."
	p("lastControlSeq").Minimum = minimum(1)
	g.setProp(r, "RunRecord", "waiting", &jsonschema.Schema{
		AnyOf:       []*jsonschema.Schema{ref("Waiting"), {Type: "string", Const: bus.WaitingModel, Description: `1.2 workers' form of {"for":"model"}.`}},
		Description: "What a running run waits for.",
	})
	r.If, r.Then = reasonRequired("state")
	defs["State"] = enum(`running, or how the run ended; queued only from clients, for a request without a record (never stored).`,
		bus.StateQueued, bus.StateRunning, bus.StatusSucceeded, bus.StatusFailed, bus.StatusAborted)
	defs["Reason"] = reasonDef()
	w := g.def(defs, "Waiting")
	g.setProp(w, "Waiting", "for", enum("", bus.WaitingModel, bus.WaitingApproval, bus.WaitingBudget, bus.WaitingKey, bus.WaitingChildren))
	g.prop(w, "Waiting", "key").Description = `The concurrency key of a wait "for":"key" (since 1.10).`
	pa := g.def(defs, "PendingApproval")
	g.prop(pa, "PendingApproval", "requestedAt").Description = "Unix milliseconds."
	g.prop(pa, "PendingApproval", "expiresAt").Description = "Unix milliseconds."
	r.Definitions = defs
	return r
}

// presence is presence.schema.json: §11's worker presence.
func (g *gen) presence() *jsonschema.Schema {
	type holder struct{ WorkerPresence bus.WorkerPresence }
	defs := g.reflect(holder{}, true, nil, "")
	p := g.def(defs, "WorkerPresence")
	delete(defs, "WorkerPresence")
	p.Title = "agentfleet worker presence"
	p.Description = "The value of key {worker} in KV bucket agents_workers (docs/protocol.md §11). Readers must ignore fields they do not know."
	g.prop(p, "WorkerPresence", "protocol").Pattern = versionPattern
	g.prop(p, "WorkerPresence", "queues").Items.Pattern = tokenPattern
	g.prop(p, "WorkerPresence", "slots").Minimum = minimum(0)
	g.prop(p, "WorkerPresence", "busy").Minimum = minimum(0)
	g.prop(p, "WorkerPresence", "waiting").Minimum = minimum(0)
	g.prop(p, "WorkerPresence", "models").Description = `The models of the worker's model tables, "provider/id" (since 1.8).`
	g.prop(p, "WorkerPresence", "defaultModel").Description = "The model of requests that name none (since 1.8)."
	t := g.def(defs, "PresenceTool")
	g.prop(t, "PresenceTool", "source").Pattern = `^(builtin|mcp:.+|service:.+)$`
	p.Definitions = defs
	return p
}

// schedule is schedule.schema.json: §2's schedules (since 1.10), the body
// of a schedule's def message and of each of its fires, and of its last
// run.
func (g *gen) schedule() *jsonschema.Schema {
	type holder struct {
		Schedule     bus.Schedule
		ScheduleLast bus.ScheduleLast
	}
	defs := g.reflect(holder{}, true, nil, "")
	s := g.def(defs, "Schedule")
	delete(defs, "Schedule")
	s.Title = "agentfleet schedule"
	s.Description = "The body of agents.schedule.{queue}.{name}.def in AGENTS_SCHEDULES, and of each fire on .fire (docs/protocol.md §2, Schedules). " +
		"Exactly one of cron, every, at. Readers must ignore fields they do not know."
	p := func(name string) *jsonschema.Schema { return g.prop(s, "Schedule", name) }
	p("name").Pattern = tokenPattern
	p("queue").Pattern = tokenPattern
	p("cron").Description = "Six fields, seconds first (second minute hour day-of-month month day-of-week), or @daily, @hourly ..."
	p("timeZone").Description = "An IANA time zone of cron; refused with every and at."
	p("every").Pattern = `^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$`
	p("every").Description = "A Go duration of whole seconds, at least 1s."
	p("at").Description = "RFC 3339: the schedule fires once, then the server removes it."
	g.setProp(s, "Schedule", "overlap", enum("While the previous run still goes: skip the fire (default), allow it, or abort the previous run.", bus.OverlapSkip, bus.OverlapAllow, bus.OverlapAbort))
	g.setProp(s, "Schedule", "catchUp", enum("Late fires after an outage: once (the newest runs, default) or none.", bus.CatchUpOnce, bus.CatchUpNone))
	p("paused").Description = "A paused schedule's def message carries no Nats-Schedule header: nothing fires."
	p("request").Description = "The run request each fire submits (run-request.schema.json), without id; each fire adds metadata schedule and scheduledFor."
	s.Required = []string{"name", "queue", "request"}
	l := g.def(defs, "ScheduleLast")
	l.Description = "The body of agents.schedule.{queue}.{name}.last: the newest run a fire submitted (workers write it)."
	g.prop(l, "ScheduleLast", "run").Pattern = tokenPattern
	s.Definitions = defs
	return s
}

// checkFields fails when a struct's JSON fields are not exactly the
// properties of the schemas made from it by hand.
func (g *gen) checkFields(t reflect.Type, schemas ...*jsonschema.Schema) {
	have := map[string]bool{}
	for _, s := range schemas {
		for name := range s.Properties.KeysFromOldest() {
			have[name] = true
		}
	}
	for i := range t.NumField() {
		name, _, _ := strings.Cut(t.Field(i).Tag.Get("json"), ",")
		if name == "-" || !t.Field(i).IsExported() {
			continue
		}
		if !have[name] {
			g.fail("field %q of %v is in no schema made from it: add it in protocol/generate.go", name, t)
		}
		delete(have, name)
	}
	for name := range have {
		g.fail("%v has no field %q", t, name)
	}
}

// oneProp is a schema with one property (and the given required list).
func oneProp(name string, p *jsonschema.Schema, required ...string) *jsonschema.Schema {
	s := &jsonschema.Schema{Properties: jsonschema.NewProperties(), Required: required}
	s.Properties.Set(name, p)
	return s
}

func cloneSchema(s *jsonschema.Schema) *jsonschema.Schema {
	b, err := json.Marshal(s)
	if err != nil {
		panic(err) // a schema always marshals
	}
	var c jsonschema.Schema
	if err := json.Unmarshal(b, &c); err != nil {
		panic(err)
	}
	return &c
}

// prune drops the definitions nothing refers to (reflection brings the
// types of fields that were replaced).
func prune(root *jsonschema.Schema) {
	for {
		used := map[string]bool{}
		walkRefs(root, func(r string) { used[strings.TrimPrefix(r, "#/$defs/")] = true })
		n := len(root.Definitions)
		for name := range root.Definitions {
			if !used[name] {
				delete(root.Definitions, name)
			}
		}
		if len(root.Definitions) == n {
			return
		}
	}
}

// checkRefs fails on a reference to a definition that is not there.
func checkRefs(root *jsonschema.Schema) error {
	var missing []string
	walkRefs(root, func(r string) {
		name, ok := strings.CutPrefix(r, "#/$defs/")
		if _, there := root.Definitions[name]; !ok || !there {
			missing = append(missing, r)
		}
	})
	slices.Sort(missing)
	if len(missing) > 0 {
		return fmt.Errorf("dangling references: %s", strings.Join(slices.Compact(missing), ", "))
	}
	return nil
}

// walkRefs calls fn with every $ref in the schema (its JSON, definitions
// included).
func walkRefs(root *jsonschema.Schema, fn func(string)) {
	b, err := json.Marshal(root)
	if err != nil {
		panic(err)
	}
	var doc any
	if err := json.Unmarshal(b, &doc); err != nil {
		panic(err)
	}
	var walk func(v any)
	walk = func(v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				if s, ok := x.(string); ok && k == "$ref" {
					fn(s)
				}
				walk(x)
			}
		case []any:
			for _, x := range v {
				walk(x)
			}
		}
	}
	walk(doc)
}

// encode writes a schema as the checked-in files are: indented by two
// spaces, properties in the wire types' field order, a final newline, and
// <, > and & as they are (encoding/json would write \u003c...).
func encode(s *jsonschema.Schema) ([]byte, error) {
	raw, err := json.Marshal(s)
	if err != nil {
		return nil, err
	}
	var out bytes.Buffer
	if err := json.Indent(&out, unescapeHTML(raw), "", "  "); err != nil {
		return nil, err
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

// unescapeHTML turns encoding/json's \u003c, \u003e and \u0026 back into
// the characters (an escaped backslash before them is left alone).
func unescapeHTML(b []byte) []byte {
	out := make([]byte, 0, len(b))
	for i := 0; i < len(b); i++ {
		if b[i] != '\\' {
			out = append(out, b[i])
			continue
		}
		if i+5 < len(b) && b[i+1] == 'u' && b[i+2] == '0' && b[i+3] == '0' {
			switch string(b[i+4 : i+6]) {
			case "3c":
				out, i = append(out, '<'), i+5
				continue
			case "3e":
				out, i = append(out, '>'), i+5
				continue
			case "26":
				out, i = append(out, '&'), i+5
				continue
			}
		}
		out = append(out, b[i], b[i+1]) // an escape: keep it whole
		i++
	}
	return out
}
