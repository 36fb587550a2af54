package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"

	reflectschema "github.com/invopop/jsonschema"
	"github.com/santhosh-tekuri/jsonschema/v6"
)

// ExecutionMode says whether a tool may run beside others of the same batch.
type ExecutionMode string

const (
	ExecutionParallel   ExecutionMode = "parallel"
	ExecutionSequential ExecutionMode = "sequential"
)

// ToolResult is what a tool returns. A tool reports failure by returning an
// error, not by returning error text.
type ToolResult struct {
	Content        []Content `json:"content"`
	Details        any       `json:"details,omitempty"`
	AddedToolNames []string  `json:"addedToolNames,omitempty"`
	// Terminate asks the loop to end the run after this batch; it takes effect
	// only when every result of the batch asks for it.
	Terminate bool `json:"terminate,omitempty"`
}

// TextResult returns a result with one text block.
func TextResult(text string) ToolResult {
	return ToolResult{Content: []Content{Text(text)}}
}

// UpdateFunc reports a partial result while a tool runs. Calls after the
// tool returned are dropped.
type UpdateFunc func(partial ToolResult)

// ExecuteFunc runs a tool call with validated arguments. ctx is cancelled
// when the run is aborted, and when a listener fails while the call runs in
// a parallel batch (its result is then not used).
type ExecuteFunc func(ctx context.Context, toolCallID string, args map[string]any, update UpdateFunc) (ToolResult, error)

// Tool is a function the model may call. Parameters is a JSON Schema; the
// arguments are coerced and validated against it before Execute.
type Tool struct {
	Name          string
	Label         string
	Description   string
	Parameters    json.RawMessage
	ExecutionMode ExecutionMode
	// PrepareArguments, when set, reshapes the raw arguments before validation.
	PrepareArguments func(args map[string]any) (map[string]any, error)
	Execute          ExecuteFunc

	once      sync.Once
	schemaDoc any
	schema    *jsonschema.Schema
}

var emptyObjectSchema = json.RawMessage(`{"type":"object","properties":{}}`)

// ParametersOrDefault returns the tool's schema, or an empty object schema.
func (t *Tool) ParametersOrDefault() json.RawMessage {
	if len(t.Parameters) == 0 {
		return emptyObjectSchema
	}
	return t.Parameters
}

// compile parses and compiles the schema once. A schema that does not
// compile disables validation, as in pi.
func (t *Tool) compile() {
	t.once.Do(func() {
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(t.ParametersOrDefault()))
		if err != nil {
			return
		}
		c := jsonschema.NewCompiler()
		if err := c.AddResource("tool.json", doc); err != nil {
			return
		}
		sch, err := c.Compile("tool.json")
		if err != nil {
			return
		}
		t.schemaDoc, t.schema = doc, sch
	})
}

// ValidateArguments coerces scalars the way pi (AJV coerceTypes) does, then
// validates against the tool's schema. It returns the coerced arguments, a
// copy: args is not changed.
func (t *Tool) ValidateArguments(args map[string]any) (map[string]any, error) {
	t.compile()
	if t.schema == nil {
		return args, nil
	}
	coerced, _ := coerce(t.schemaDoc, deepCopy(args)).(map[string]any)
	if coerced == nil {
		coerced = map[string]any{}
	}
	err := t.schema.Validate(toSchemaValue(coerced))
	if err == nil {
		return coerced, nil
	}
	return nil, validationError(t.Name, args, err)
}

func validationError(name string, args map[string]any, err error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Validation failed for tool %q:\n", name)
	lines := 0
	if ve, ok := err.(*jsonschema.ValidationError); ok {
		for _, u := range ve.BasicOutput().Errors {
			if u.Error == nil {
				continue
			}
			path := strings.TrimPrefix(u.InstanceLocation, "/")
			if path == "" {
				path = "root"
			}
			fmt.Fprintf(&b, "  - %s: %s\n", path, u.Error.String())
			lines++
		}
	}
	if lines == 0 {
		b.WriteString("  - root: Unknown validation error\n")
	}
	received, _ := json.MarshalIndent(args, "", "  ")
	fmt.Fprintf(&b, "\nReceived arguments:\n%s", received)
	return fmt.Errorf("%s", b.String())
}

// coerce converts scalars to the type the schema asks for, recursing through
// properties and items, following AJV's coerceTypes rules.
func coerce(schema any, v any) any {
	s, ok := schema.(map[string]any)
	if !ok {
		return v
	}
	if types := schemaTypes(s["type"]); len(types) > 0 && !matchesAny(types, v) {
		for _, typ := range types {
			if c, ok := coerceTo(typ, v); ok {
				v = c
				break
			}
		}
	}
	switch val := v.(type) {
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		for k, child := range val {
			if ps, ok := props[k]; ok {
				val[k] = coerce(ps, child)
			} else if ap, ok := s["additionalProperties"].(map[string]any); ok {
				val[k] = coerce(ap, child)
			}
		}
	case []any:
		switch items := s["items"].(type) {
		case map[string]any:
			for i := range val {
				val[i] = coerce(items, val[i])
			}
		case []any:
			for i := range val {
				if i < len(items) {
					val[i] = coerce(items[i], val[i])
				}
			}
		}
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, sub := range all {
			v = coerce(sub, v)
		}
	}
	return v
}

func schemaTypes(t any) []string {
	switch t := t.(type) {
	case string:
		return []string{t}
	case []any:
		out := make([]string, 0, len(t))
		for _, x := range t {
			if s, ok := x.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

func matchesAny(types []string, v any) bool {
	for _, t := range types {
		if matchesType(t, v) {
			return true
		}
	}
	return false
}

func matchesType(t string, v any) bool {
	switch t {
	case "string":
		_, ok := v.(string)
		return ok
	case "number":
		_, ok := toFloat(v)
		return ok
	case "integer":
		f, ok := toFloat(v)
		return ok && f == math.Trunc(f)
	case "boolean":
		_, ok := v.(bool)
		return ok
	case "null":
		return v == nil
	case "object":
		_, ok := v.(map[string]any)
		return ok
	case "array":
		_, ok := v.([]any)
		return ok
	}
	return false
}

func toFloat(v any) (float64, bool) {
	switch n := v.(type) {
	case float64:
		return n, true
	case int:
		return float64(n), true
	case int64:
		return float64(n), true
	case json.Number:
		f, err := n.Float64()
		return f, err == nil
	}
	return 0, false
}

func coerceTo(typ string, v any) (any, bool) {
	switch typ {
	case "string":
		switch x := v.(type) {
		case bool:
			return strconv.FormatBool(x), true
		case nil:
			return "", true
		default:
			if f, ok := toFloat(v); ok {
				return strconv.FormatFloat(f, 'f', -1, 64), true
			}
		}
	case "number", "integer":
		var f float64
		switch x := v.(type) {
		case string:
			s := strings.TrimSpace(x)
			if x == "" || s == "" {
				return nil, false
			}
			p, err := strconv.ParseFloat(s, 64)
			if err != nil || math.IsInf(p, 0) || math.IsNaN(p) {
				return nil, false
			}
			f = p
		case bool:
			if x {
				f = 1
			}
		case nil:
		default:
			return nil, false
		}
		if typ == "integer" && f != math.Trunc(f) {
			return nil, false
		}
		return f, true
	case "boolean":
		switch x := v.(type) {
		case string:
			if x == "true" || x == "false" {
				return x == "true", true
			}
		case nil:
			return false, true
		default:
			if f, ok := toFloat(v); ok && (f == 0 || f == 1) {
				return f == 1, true
			}
		}
	case "null":
		switch x := v.(type) {
		case string:
			if x == "" {
				return nil, true
			}
		case bool:
			if !x {
				return nil, true
			}
		default:
			if f, ok := toFloat(v); ok && f == 0 {
				return nil, true
			}
		}
	}
	return nil, false
}

func deepCopy(v any) any {
	switch x := v.(type) {
	case map[string]any:
		m := make(map[string]any, len(x))
		for k, e := range x {
			m[k] = deepCopy(e)
		}
		return m
	case []any:
		s := make([]any, len(x))
		for i, e := range x {
			s[i] = deepCopy(e)
		}
		return s
	}
	return v
}

// toSchemaValue turns Go numbers into what the validator expects (it treats
// float64 and json.Number alike, but not int).
func toSchemaValue(v any) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = toSchemaValue(e)
		}
	case []any:
		for i, e := range x {
			x[i] = toSchemaValue(e)
		}
	case int:
		return float64(x)
	case int64:
		return float64(x)
	}
	return v
}

// CanonicalJSON writes v with sorted object keys and no spaces, as
// AppendJSON does (encoding/json already sorts map keys).
func CanonicalJSON(v any) string {
	b, err := MarshalJSON(v)
	if err != nil {
		return "null"
	}
	return string(b)
}

// NewTool defines a tool from a Go function taking a typed argument struct.
// The JSON Schema is derived from T (json tags, `jsonschema` tags for
// descriptions and constraints); the validated arguments are decoded into T.
func NewTool[T any](name, description string, fn func(ctx context.Context, args T, update UpdateFunc) (ToolResult, error)) *Tool {
	r := reflectschema.Reflector{ExpandedStruct: true, DoNotReference: true, Anonymous: true}
	s := r.Reflect(new(T))
	s.Version = ""
	schema, err := MarshalJSON(s)
	if err != nil {
		panic(fmt.Sprintf("agent.NewTool(%s): schema: %v", name, err))
	}
	return &Tool{
		Name:        name,
		Description: description,
		Parameters:  schema,
		Execute: func(ctx context.Context, _ string, args map[string]any, update UpdateFunc) (ToolResult, error) {
			var typed T
			raw, err := json.Marshal(args)
			if err == nil {
				err = json.Unmarshal(raw, &typed)
			}
			if err != nil {
				return ToolResult{}, fmt.Errorf("invalid arguments for %s: %w", name, err)
			}
			return fn(ctx, typed, update)
		},
	}
}
