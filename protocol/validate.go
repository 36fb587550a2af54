package protocol

import (
	"bytes"
	"embed"
	"fmt"
	"strings"

	"github.com/santhosh-tekuri/jsonschema/v6"

	"github.com/agentfleet/agentfleet/bus"
)

// schemaFiles are the checked-in schemas (read only).
//
//go:embed *.schema.json
var schemaFiles embed.FS

// Schema returns a checked-in schema file (one of Files).
func Schema(file string) ([]byte, error) { return schemaFiles.ReadFile(file) }

// Doc names a document of the protocol: what a Validator checks.
type Doc string

// The documents. The control bodies are named after their kinds (the last
// token of the control subject, bus.KindSteer ...).
const (
	RunRequest Doc = "run-request"
	Envelope   Doc = "envelope"
	Steer      Doc = bus.KindSteer
	FollowUp   Doc = bus.KindFollowUp
	Abort      Doc = bus.KindAbort
	Approve    Doc = bus.KindApprove
	Compact    Doc = bus.KindCompact
	Record     Doc = "record"
	Presence   Doc = "presence"
	Schedule   Doc = "schedule" // since 1.10
)

// Docs lists the documents.
func Docs() []Doc {
	return []Doc{RunRequest, Envelope, Steer, FollowUp, Abort, Approve, Compact, Record, Presence, Schedule}
}

// where is the schema file of a document and the definition in it ("" for
// the file's root).
func (d Doc) where() (file, def string, ok bool) {
	switch d {
	case RunRequest:
		return RunRequestFile, "", true
	case Envelope:
		return EventFile, "", true
	case Steer:
		return ControlFile, "SteerBody", true
	case FollowUp:
		return ControlFile, "FollowUpBody", true
	case Abort:
		return ControlFile, "AbortBody", true
	case Approve:
		return ControlFile, "ApprovalAnswer", true
	case Compact:
		return ControlFile, "CompactBody", true
	case Record:
		return RecordFile, "", true
	case Presence:
		return PresenceFile, "", true
	case Schedule:
		return ScheduleFile, "", true
	}
	return "", "", false
}

// Validator validates documents against the checked-in schemas. It is
// safe for concurrent use.
type Validator struct {
	schemas map[Doc]*jsonschema.Schema
	// events are the definitions of the event types, by type: an
	// envelope whose event does not fit is checked against its type's
	// alone, for an error that says what is wrong with it rather than
	// with every other type.
	events map[string]*jsonschema.Schema
}

// An Option changes how NewValidator compiles the schemas.
type Option func(*options)

type options struct{ strict bool }

// Strict refuses fields the schemas do not name: every object schema
// with properties and no additionalProperties gets
// "additionalProperties": false. This repository's tests validate what
// its code writes this way, so that a field the code writes and the
// schema lacks (a hand-written encoder's, say) is caught. A reader of the
// protocol must not: later versions add fields, which readers ignore.
func Strict() Option { return func(o *options) { o.strict = true } }

// NewValidator compiles the checked-in schemas. Formats (date-time) are
// asserted.
func NewValidator(opts ...Option) (*Validator, error) {
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	c.AssertFormat()
	ids := map[string]string{}
	var eventDefs map[string]string // type -> def
	for _, file := range Files() {
		b, err := Schema(file)
		if err != nil {
			return nil, err
		}
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(b))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		m, ok := doc.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("%s: not a JSON object", file)
		}
		id, _ := m["$id"].(string)
		if id == "" {
			return nil, fmt.Errorf("%s: no $id", file)
		}
		if file == EventFile {
			if eventDefs, err = unionDefs(m, "Event"); err != nil {
				return nil, fmt.Errorf("%s: %w", file, err)
			}
		}
		if o.strict {
			closeObjects(doc)
		}
		if err := c.AddResource(id, doc); err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
		ids[file] = id
	}
	v := &Validator{schemas: map[Doc]*jsonschema.Schema{}, events: map[string]*jsonschema.Schema{}}
	for typ, def := range eventDefs {
		s, err := c.Compile(ids[EventFile] + "#/$defs/" + def)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", def, err)
		}
		v.events[typ] = s
	}
	for _, d := range Docs() {
		file, def, _ := d.where()
		loc := ids[file]
		if def != "" {
			loc += "#/$defs/" + def
		}
		s, err := c.Compile(loc)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", d, err)
		}
		v.schemas[d] = s
	}
	return v, nil
}

// Validate checks one JSON document; the error says where it does not
// fit.
func (v *Validator) Validate(d Doc, data []byte) error {
	s, ok := v.schemas[d]
	if !ok {
		return fmt.Errorf("protocol: unknown document %q", d)
	}
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return fmt.Errorf("%s: not JSON: %w", d, err)
	}
	if err := s.Validate(inst); err != nil {
		if d == Envelope {
			if err := v.eventError(inst); err != nil {
				return err
			}
		}
		return fmt.Errorf("%s: %w", d, err)
	}
	return nil
}

// eventError checks an envelope's event against the definition of its
// type alone: nil when it fits (what is wrong is elsewhere).
func (v *Validator) eventError(inst any) error {
	env, _ := inst.(map[string]any)
	ev, _ := env["event"].(map[string]any)
	typ, ok := ev["type"].(string)
	if !ok {
		return nil
	}
	s, known := v.events[typ]
	if !known {
		return fmt.Errorf("%s: event type %q is not one of protocol %s's (readers skip event types they do not know)", Envelope, typ, bus.ProtocolVersion)
	}
	if err := s.Validate(ev); err != nil {
		return fmt.Errorf("%s: event %s: %w", Envelope, typ, err)
	}
	return nil
}

// unionDefs maps the type constants of a union's variants (a oneOf of
// $refs to object definitions with a "type" const) to the definitions.
func unionDefs(schema map[string]any, union string) (map[string]string, error) {
	defs, _ := schema["$defs"].(map[string]any)
	u, _ := defs[union].(map[string]any)
	refs, _ := u["oneOf"].([]any)
	if len(refs) == 0 {
		return nil, fmt.Errorf("%s is not a oneOf", union)
	}
	out := map[string]string{}
	for _, r := range refs {
		ref, _ := r.(map[string]any)["$ref"].(string)
		name := strings.TrimPrefix(ref, "#/$defs/")
		d, _ := defs[name].(map[string]any)
		props, _ := d["properties"].(map[string]any)
		typ, _ := props["type"].(map[string]any)
		c, ok := typ["const"].(string)
		if !ok {
			return nil, fmt.Errorf("%s: variant %q has no type const", union, ref)
		}
		out[c] = name
	}
	return out, nil
}

// closeObjects adds "additionalProperties": false to every object schema
// of a schema document that has properties and says nothing of
// additional ones.
func closeObjects(v any) {
	switch v := v.(type) {
	case map[string]any:
		if v["type"] == "object" && v["properties"] != nil && v["additionalProperties"] == nil {
			v["additionalProperties"] = false
		}
		for _, x := range v {
			closeObjects(x)
		}
	case []any:
		for _, x := range v {
			closeObjects(x)
		}
	}
}
