package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"unicode"

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

	once       sync.Once
	schemaDoc  any
	schema     *jsonschema.Schema
	subSchemas sync.Map // sub-schema map pointer -> *jsonschema.Schema (nil: does not compile)
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

// MaxArgumentDepth is how deeply tool-call arguments may nest (the
// arguments object is level 1). Deeper arguments are refused before
// validation, whose cost and error text grow with the depth.
const MaxArgumentDepth = 64

// ErrArgumentsTooDeep: tool-call arguments nest deeper than MaxArgumentDepth.
var ErrArgumentsTooDeep = fmt.Errorf("arguments are nested deeper than %d levels", MaxArgumentDepth)

// maxValidationText bounds a validation error's text: the model gets the
// problems and the start of what it sent, never a copy of a huge input.
const maxValidationText = 2 << 10

// ValidateArguments coerces the arguments the way pi-ai does (normalizing
// optional nulls, then coerceWithJsonSchema), then validates them against
// the tool's schema. It returns the coerced arguments, a copy: args is not
// changed.
func (t *Tool) ValidateArguments(args map[string]any) (map[string]any, error) {
	if deeperThan(args, MaxArgumentDepth) {
		return nil, fmt.Errorf("Validation failed for tool %q: %w", t.Name, ErrArgumentsTooDeep)
	}
	t.compile()
	if t.schema == nil {
		return args, nil
	}
	copied := deepCopy(args)
	t.dropOptionalNulls(copied, t.schemaDoc)
	coerced, _ := t.coerce(t.schemaDoc, copied).(map[string]any)
	if coerced == nil {
		coerced = map[string]any{}
	}
	err := t.schema.Validate(toSchemaValue(coerced))
	if err == nil {
		return coerced, nil
	}
	return nil, validationError(t.Name, args, err)
}

// deeperThan reports whether v nests more than limit levels of objects and
// arrays. It stops descending past the limit, so its cost is bounded by the
// size of v and its stack by the limit.
func deeperThan(v any, limit int) bool {
	switch x := v.(type) {
	case map[string]any:
		if limit == 0 {
			return true
		}
		for _, e := range x {
			if deeperThan(e, limit-1) {
				return true
			}
		}
	case []any:
		if limit == 0 {
			return true
		}
		for _, e := range x {
			if deeperThan(e, limit-1) {
				return true
			}
		}
	}
	return false
}

// validationError is pi's text, with the arguments compact rather than
// indented, the whole clipped to maxValidationText.
func validationError(name string, args map[string]any, err error) error {
	var b strings.Builder
	fmt.Fprintf(&b, "Validation failed for tool %q:\n", name)
	lines := 0
	if ve, ok := err.(*jsonschema.ValidationError); ok {
		for _, u := range ve.BasicOutput().Errors {
			if u.Error == nil {
				continue
			}
			if b.Len() > maxValidationText {
				break
			}
			path := strings.TrimPrefix(u.InstanceLocation, "/")
			if path == "" {
				path = "root"
			}
			fmt.Fprintf(&b, "  - %s: %s\n", strings.ReplaceAll(path, "/", "."), u.Error.String())
			lines++
		}
	}
	if lines == 0 {
		b.WriteString("  - root: Unknown validation error\n")
	}
	b.WriteString("\nReceived arguments:\n")
	if b.Len() < maxValidationText {
		received, _ := MarshalJSON(args)
		b.Write(received[:min(len(received), maxValidationText-b.Len()+1)])
	}
	return errors.New(clipText(b.String(), maxValidationText))
}

// clipText cuts s to at most n bytes on a UTF-8 boundary, marking the cut.
func clipText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	const mark = "…"
	n -= len(mark)
	for n > 0 && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + mark
}

// coerce is pi-ai's coerceWithJsonSchema: allOf in order, then anyOf and
// oneOf, then the schema's own types, then properties and items. It changes
// maps and slices of v in place.
func (t *Tool) coerce(schema any, v any) any {
	s, ok := schema.(map[string]any)
	if !ok {
		return v
	}
	if all, ok := s["allOf"].([]any); ok {
		for _, sub := range all {
			v = t.coerce(sub, v)
		}
	}
	if members, ok := s["anyOf"].([]any); ok {
		v = t.coerceUnion(v, members)
	}
	if members, ok := s["oneOf"].([]any); ok {
		v = t.coerceUnion(v, members)
	}
	types := schemaTypes(s["type"])
	if len(types) > 0 && !(len(types) > 1 && matchesAny(types, v)) {
		for _, typ := range types {
			if c, changed := coercePrimitive(typ, v); changed {
				v = c
				break
			}
		}
	}
	if m, ok := v.(map[string]any); ok && slices.Contains(types, "object") {
		props, _ := s["properties"].(map[string]any)
		for k, ps := range props {
			if child, ok := m[k]; ok {
				m[k] = t.coerce(ps, child)
			}
		}
		if ap, ok := s["additionalProperties"].(map[string]any); ok {
			for k, child := range m {
				if _, defined := props[k]; !defined {
					m[k] = t.coerce(ap, child)
				}
			}
		}
	}
	if a, ok := v.([]any); ok && slices.Contains(types, "array") {
		switch items := s["items"].(type) {
		case map[string]any:
			for i := range a {
				a[i] = t.coerce(items, a[i])
			}
		case []any:
			for i := range a {
				if i < len(items) {
					a[i] = t.coerce(items[i], a[i])
				}
			}
		}
	}
	return v
}

// coerceUnion keeps v when a member accepts it, else takes the first
// member's coercion that it accepts, else keeps v.
func (t *Tool) coerceUnion(v any, members []any) any {
	for _, m := range members {
		if ok, known := t.accepts(m, v); known && ok {
			return v
		}
	}
	for _, m := range members {
		c := t.coerce(m, deepCopy(v))
		if ok, known := t.accepts(m, c); known && ok {
			return c
		}
	}
	return v
}

// dropOptionalNulls is pi-ai's normalizeOptionalNulls: a null for a
// property that is not required and whose schema refuses null is removed.
func (t *Tool) dropOptionalNulls(v any, schema any) {
	s, ok := schema.(map[string]any)
	if !ok {
		return
	}
	switch x := v.(type) {
	case []any:
		switch items := s["items"].(type) {
		case map[string]any:
			for _, e := range x {
				t.dropOptionalNulls(e, items)
			}
		case []any:
			for i := range x {
				if i < len(items) {
					t.dropOptionalNulls(x[i], items[i])
				}
			}
		}
	case map[string]any:
		props, _ := s["properties"].(map[string]any)
		required, _ := s["required"].([]any)
		for k, ps := range props {
			e, ok := x[k]
			if !ok {
				continue
			}
			if e == nil && !slices.Contains(required, any(k)) && !hasRef(ps) {
				if accepted, known := t.accepts(ps, nil); known && !accepted {
					delete(x, k)
					continue
				}
			}
			t.dropOptionalNulls(e, ps)
		}
	}
}

func hasRef(schema any) bool {
	s, _ := schema.(map[string]any)
	_, ok := s["$ref"].(string)
	return ok
}

// accepts validates v against a sub-schema compiled on its own (as pi-ai
// does); known is false when the sub-schema does not compile.
func (t *Tool) accepts(schema any, v any) (ok, known bool) {
	m, isMap := schema.(map[string]any)
	if !isMap {
		return false, false
	}
	key := reflect.ValueOf(m).UnsafePointer()
	cached, found := t.subSchemas.Load(key)
	if !found {
		var sch *jsonschema.Schema
		c := jsonschema.NewCompiler()
		if c.AddResource("sub.json", m) == nil {
			sch, _ = c.Compile("sub.json")
		}
		cached, _ = t.subSchemas.LoadOrStore(key, sch)
	}
	sch := cached.(*jsonschema.Schema)
	if sch == nil {
		return false, false
	}
	return sch.Validate(toSchemaValue(deepCopy(v))) == nil, true
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

// coercePrimitive is pi-ai's coercePrimitiveByType; changed is false when
// it leaves v as it is.
func coercePrimitive(typ string, v any) (c any, changed bool) {
	switch typ {
	case "number", "integer":
		switch x := v.(type) {
		case nil:
			return 0.0, true
		case bool:
			if x {
				return 1.0, true
			}
			return 0.0, true
		case string:
			if strings.TrimFunc(x, isJSSpace) == "" {
				break
			}
			f, ok := jsNumber(x)
			if ok && !math.IsInf(f, 0) && (typ == "number" || f == math.Trunc(f)) {
				return f, true
			}
		}
	case "boolean":
		switch x := v.(type) {
		case nil:
			return false, true
		case string:
			if x == "true" || x == "false" {
				return x == "true", true
			}
		default:
			if f, ok := toFloat(v); ok && (f == 0 || f == 1) {
				return f == 1, true
			}
		}
	case "string":
		switch x := v.(type) {
		case nil:
			return "", true
		case bool:
			return strconv.FormatBool(x), true
		default:
			if f, ok := toFloat(v); ok {
				return jsNumberString(f), true
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
	return v, false
}

// isJSSpace is JavaScript's white space and line terminators, which
// String.prototype.trim and Number() strip.
func isJSSpace(r rune) bool {
	return r == '\ufeff' || (r != '\u0085' && unicode.IsSpace(r))
}

// jsNumber is JavaScript's Number(s) for a string; false where it is NaN.
// Infinity comes back as an infinity.
func jsNumber(s string) (float64, bool) {
	s = strings.TrimFunc(s, isJSSpace)
	if s == "" {
		return 0, true
	}
	if len(s) > 2 && s[0] == '0' {
		base := 0
		switch s[1] {
		case 'x', 'X':
			base = 16
		case 'o', 'O':
			base = 8
		case 'b', 'B':
			base = 2
		}
		if base != 0 {
			for _, c := range s[2:] {
				if d := digitValue(c); d >= base {
					return 0, false
				}
			}
			n, ok := new(big.Int).SetString(s[2:], base)
			if !ok {
				return 0, false
			}
			f, _ := new(big.Float).SetInt(n).Float64()
			return f, true
		}
	}
	body := strings.TrimLeft(s, "+-")
	if len(s)-len(body) > 1 {
		return 0, false
	}
	if body == "Infinity" {
		if s[0] == '-' {
			return math.Inf(-1), true
		}
		return math.Inf(1), true
	}
	if !isDecimalLiteral(body) {
		return 0, false
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, false
	}
	return f, true
}

func digitValue(c rune) int {
	switch {
	case '0' <= c && c <= '9':
		return int(c - '0')
	case 'a' <= c && c <= 'f':
		return int(c-'a') + 10
	case 'A' <= c && c <= 'F':
		return int(c-'A') + 10
	}
	return 99
}

// isDecimalLiteral matches JavaScript's unsigned StrDecimalLiteral without
// Infinity: digits, an optional fraction, an optional exponent, and at least
// one digit before the exponent.
func isDecimalLiteral(s string) bool {
	i, digits := 0, 0
	for i < len(s) && '0' <= s[i] && s[i] <= '9' {
		i, digits = i+1, digits+1
	}
	if i < len(s) && s[i] == '.' {
		i++
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i, digits = i+1, digits+1
		}
	}
	if digits == 0 {
		return false
	}
	if i < len(s) && (s[i] == 'e' || s[i] == 'E') {
		i++
		if i < len(s) && (s[i] == '+' || s[i] == '-') {
			i++
		}
		exp := 0
		for i < len(s) && '0' <= s[i] && s[i] <= '9' {
			i, exp = i+1, exp+1
		}
		if exp == 0 {
			return false
		}
	}
	return i == len(s)
}

// jsNumberString is JavaScript's String(f) for a finite number (the format
// encoding/json also uses for float64).
func jsNumberString(f float64) string {
	if f == 0 {
		return "0"
	}
	format := byte('f')
	if abs := math.Abs(f); abs < 1e-6 || abs >= 1e21 {
		format = 'e'
	}
	s := strconv.FormatFloat(f, format, -1, 64)
	if format == 'e' {
		// e-07 -> e-7
		if n := len(s); n >= 4 && s[n-4] == 'e' && s[n-3] == '-' && s[n-2] == '0' {
			s = s[:n-2] + s[n-1:]
		}
	}
	return s
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
