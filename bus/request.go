package bus

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/agentfleet/agentfleet/agent"
)

// Defaults of a run's limits.
const (
	DefaultMaxTurns       = 50
	DefaultTimeoutSeconds = 1800
)

// Size limits of a run request. A request over one of them is a bad request
// with a message naming the limit. They keep every event of the run well
// under the NATS max payload (1 MiB by default).
const (
	MaxRequestBytes      = 1 << 20   // the whole request body
	MaxPromptBytes       = 256 << 10 // prompt text
	MaxSystemPromptBytes = 128 << 10
	MaxMessages          = 1000
	MaxMessageBytes      = 256 << 10 // one message of messages[], as JSON
	MaxImages            = 16
	MaxTools             = 64
	MaxMetadata          = 32
	MaxMetadataKey       = 64
	MaxMetadataValue     = 1024
	MaxFauxResponses     = 1000
	MaxTurnsLimit        = 1000
	MaxTimeoutSeconds    = 7 * 24 * 3600
	MaxTokensLimit       = 1 << 24   // maxTokens: more than a model answers in one call; sums of it cannot wrap
	MaxControlBytes      = 256 << 10 // a control message body
	MaxJSONDepth         = 128       // nesting of the request's JSON
	MaxModelIDBytes      = 256
	MaxProviderBytes     = 64
	MaxFauxTokenSize     = 1 << 20
	MaxFauxTokensPerSec  = 1e6
	MaxFauxErrorBytes    = 4 << 10
	// MaxErrorBytes bounds every error text a request can cause, in events,
	// records and logs.
	MaxErrorBytes = 4 << 10
	// maxProblems is how many problems an error lists before "and N more".
	maxProblems     = 20
	maxProblemBytes = 512
)

// ModelRef names a model: a provider and the provider's model id. On the wire
// it is {"provider":"openai","id":"gpt-4o-mini"} or "openai/gpt-4o-mini"
// (split at the first '/', so ids may contain '/').
type ModelRef struct {
	Provider string `json:"provider"`
	ID       string `json:"id"`
}

// ParseModelRef parses "provider/id".
func ParseModelRef(s string) (ModelRef, error) {
	p, id, ok := strings.Cut(s, "/")
	if !ok || p == "" || id == "" {
		return ModelRef{}, fmt.Errorf("model %q must be \"provider/id\" (e.g. \"openai/gpt-4o-mini\")", truncate(s, 80))
	}
	return ModelRef{Provider: p, ID: id}, nil
}

func (m ModelRef) String() string { return m.Provider + "/" + m.ID }

// IsZero reports whether no model is named.
func (m ModelRef) IsZero() bool { return m.Provider == "" && m.ID == "" }

// UnmarshalJSON accepts the object and the string form.
func (m *ModelRef) UnmarshalJSON(b []byte) error {
	r, err := decodeModelRef(b, true)
	if err != nil || r == nil { // null: left as it is, as encoding/json does
		return err
	}
	*m = *r
	return nil
}

// decodeModelRef decodes a model in either form (nil for none);
// strict refuses unknown fields in the object form.
func decodeModelRef(b []byte, strict bool) (*ModelRef, error) {
	b = bytes.TrimSpace(b)
	if len(b) == 0 || bytes.Equal(b, []byte("null")) {
		return nil, nil
	}
	if b[0] == '"' {
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return nil, err
		}
		r, err := ParseModelRef(s)
		if err != nil {
			return nil, err
		}
		return &r, nil
	}
	if b[0] != '{' {
		return nil, errors.New(`model must be "provider/id" or {"provider":"…","id":"…"}`)
	}
	var o struct {
		Provider string `json:"provider"`
		ID       string `json:"id"`
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	if strict {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(&o); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) { // not the Go type it wanted
			return nil, fmt.Errorf("model.%s must be a string, not JSON %s", truncate(te.Field, 64), truncate(te.Value, 64))
		}
		return nil, fmt.Errorf("model: %w", err)
	}
	if o.Provider == "" || o.ID == "" {
		return nil, errors.New(`model needs both "provider" and "id"`)
	}
	r := ModelRef(o)
	return &r, nil
}

// Limits bound a run. Zero fields take the defaults.
type Limits struct {
	MaxTurns       int `json:"maxTurns,omitempty"`
	TimeoutSeconds int `json:"timeoutSeconds,omitempty"`
	MaxTotalTokens int `json:"maxTotalTokens,omitempty"`
	// MaxCostUsd bounds what the run's model calls may cost, in dollars
	// from the model table's prices; 0 means no bound.
	MaxCostUsd float64 `json:"maxCostUsd,omitempty"`
}

// FauxScript scripts a whole run for the faux provider.
type FauxScript struct {
	Responses       []agent.ScriptedResponse `json:"responses"`
	TokenSize       int                      `json:"tokenSize,omitempty"`
	TokensPerSecond float64                  `json:"tokensPerSecond,omitempty"`
	// FixedPace (since 1.5) puts the chunks at fixed times from the
	// reply's start, as a provider streaming at its own pace: lateness is
	// made up, not carried (load tests: the offered rate stays the asked
	// one on a busy machine).
	FixedPace bool `json:"fixedPace,omitempty"`
}

// RunRequest is the body of a run request (see docs/protocol.md).
type RunRequest struct {
	// ID, when set, must equal the run token of the subject.
	ID            string              `json:"id,omitempty"`
	Model         *ModelRef           `json:"model,omitempty"`
	SystemPrompt  string              `json:"systemPrompt,omitempty"`
	Prompt        string              `json:"prompt,omitempty"`
	Images        []agent.Content     `json:"images,omitempty"`
	Messages      []agent.Message     `json:"messages,omitempty"`
	Tools         []string            `json:"tools,omitempty"`
	ThinkingLevel agent.ThinkingLevel `json:"thinkingLevel,omitempty"`
	ToolExecution agent.ExecutionMode `json:"toolExecution,omitempty"`
	SteeringMode  agent.QueueMode     `json:"steeringMode,omitempty"`
	FollowUpMode  agent.QueueMode     `json:"followUpMode,omitempty"`
	Limits        *Limits             `json:"limits,omitempty"`
	Temperature   *float64            `json:"temperature,omitempty"`
	MaxTokens     int                 `json:"maxTokens,omitempty"`
	ContinueFrom  string              `json:"continueFrom,omitempty"`
	Metadata      map[string]string   `json:"metadata,omitempty"`
	Faux          *FauxScript         `json:"faux,omitempty"`
	// Approval gates tool calls on a person's answer (since 1.3).
	Approval *Approval `json:"approval,omitempty"`
	// Compaction shrinks a long run's context (since 1.10, bus/compaction.go).
	Compaction *Compaction `json:"compaction,omitempty"`
	// Priority is high, normal (the default) or low (since 1.10); the
	// subject's lane must carry it (Names.CheckLane).
	Priority string `json:"priority,omitempty"`
	// Concurrency limits the runs of one key running at once, fleet-wide
	// (since 1.10).
	Concurrency *Concurrency `json:"concurrency,omitempty"`
	// Children bounds the run's child runs (since 1.10, bus/children.go).
	Children *Children `json:"children,omitempty"`
	// Child links a child run to its parent (since 1.10): set by the
	// worker that submits it.
	Child *ChildOf `json:"child,omitempty"`
}

// Concurrency is a request's concurrency key (since 1.10): at most Limit
// runs with Key run at once across the fleet. Limit 0 takes the workers'
// default for the key (--concurrency-key-limit); with both, the lower.
type Concurrency struct {
	Key   string `json:"key"`
	Limit int    `json:"limit,omitempty"`
}

// Bounds of a concurrency key.
const (
	MaxConcurrencyKeyBytes = 256
	MaxConcurrencyLimit    = 10000
)

// EffectiveLimits returns the limits with defaults filled in.
func (r *RunRequest) EffectiveLimits() Limits {
	var l Limits
	if r.Limits != nil {
		l = *r.Limits
	}
	if l.MaxTurns == 0 {
		l.MaxTurns = DefaultMaxTurns
	}
	if l.TimeoutSeconds == 0 {
		l.TimeoutSeconds = DefaultTimeoutSeconds
	}
	return l
}

// RequestError is a bad request: why the request cannot run. Its text is
// meant for the person who sent it: it lists every problem, the first
// twenty in full and then how many more, within MaxErrorBytes.
type RequestError struct {
	Problems []string
	// Request is, from DecodeRunRequest, what the body's known fields hold
	// when it decodes leniently (unknown fields ignored, also inside
	// model; its id the subject's), so that a worker can add its own
	// checks to the decoder's problems; nil when it does not (malformed
	// JSON, a wrong type, a model that does not decode).
	Request *RunRequest
}

func (e *RequestError) Error() string {
	var b strings.Builder
	b.WriteString("bad request: ")
	for i, p := range e.Problems {
		if i == maxProblems {
			fmt.Fprintf(&b, "; and %d more", len(e.Problems)-i)
			break
		}
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(truncate(p, maxProblemBytes))
	}
	return truncate(b.String(), MaxErrorBytes)
}

// joinProblems merges the problems of several errors into one RequestError (nil
// when there are none); errors that are not bad requests are returned
// first, unchanged.
func joinProblems(errs ...error) error {
	var all []string
	for _, err := range errs {
		if err == nil {
			continue
		}
		var re *RequestError
		if !errors.As(err, &re) {
			return err
		}
		all = append(all, re.Problems...)
	}
	if len(all) == 0 {
		return nil
	}
	return &RequestError{Problems: all}
}

// IsBadRequest reports whether err is (or wraps) a *RequestError.
func IsBadRequest(err error) bool {
	var re *RequestError
	return errors.As(err, &re)
}

// BadRequest makes a *RequestError from a formatted problem.
func BadRequest(format string, args ...any) *RequestError {
	return &RequestError{Problems: []string{fmt.Sprintf(format, args...)}}
}

// DecodeRunRequest decodes and validates a request body. subjectRun is the
// run token of the subject (authoritative); the returned request's ID is
// set to it. Every error is a *RequestError with a readable text. Whether
// the model, provider and tools exist is for the worker to check.
func DecodeRunRequest(data []byte, subjectRun string) (*RunRequest, error) {
	if !ValidID(subjectRun) {
		// The subject is checked before, but the id goes into subjects: never trust it here.
		return nil, BadRequest("run id %q must match [A-Za-z0-9_-]{1,64}", truncate(subjectRun, 80))
	}
	if len(data) > MaxRequestBytes {
		return nil, BadRequest("request is %d bytes, the limit is %d", len(data), MaxRequestBytes)
	}
	if len(bytes.TrimSpace(data)) == 0 {
		return nil, BadRequest("empty request body: send a JSON object such as {\"prompt\":\"hello\"}")
	}
	if err := checkJSONShape(data); err != nil {
		return nil, withLenient(err, data, subjectRun)
	}
	if b := bytes.TrimSpace(data); b[0] != '{' && json.Valid(b) {
		// Valid JSON but no object: the strict decode would name the Go
		// type it wanted.
		return nil, BadRequest("the request must be a JSON object, such as {\"prompt\":\"hello\"}")
	}
	var req RunRequest
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, BadRequest("malformed JSON: %s", jsonErrorText(err))
		}
		// An unknown field (or a wrong type): decoded again leniently,
		// so that the error lists every problem, not the first one.
		return nil, lenientProblems(data, subjectRun)
	}
	// More is false before a stray '}' or ']' too: only the end will do.
	if _, err := dec.Token(); err != io.EOF {
		return nil, BadRequest("malformed JSON: extra data after the request object")
	}
	if err := req.Validate(subjectRun); err != nil {
		req.ID = subjectRun
		return nil, withRequest(err, &req)
	}
	req.ID = subjectRun
	return &req, nil
}

// lenientRequest is a request body decoded leniently: unknown fields
// ignored, inside model too, the id the subject's. ok is false when it
// does not decode that way (malformed JSON, a wrong type, extra data, a
// model that is neither "provider/id" nor an object with both).
func lenientRequest(data []byte, subjectRun string) (req *RunRequest, ok bool) {
	var w struct {
		RunRequest
		// model decoded apart: ModelRef refuses unknown fields itself.
		Model json.RawMessage `json:"model,omitempty"`
	}
	if json.Unmarshal(data, &w) != nil {
		return nil, false
	}
	m, err := decodeModelRef(w.Model, false)
	if err != nil {
		return nil, false
	}
	w.RunRequest.Model = m
	w.RunRequest.ID = subjectRun
	return &w.RunRequest, true
}

// withLenient is withRequest with the body decoded leniently.
func withLenient(err error, data []byte, subjectRun string) error {
	if req, ok := lenientRequest(data, subjectRun); ok {
		return withRequest(err, req)
	}
	return err
}

// withRequest sets a bad request's Request.
func withRequest(err error, req *RunRequest) error {
	var re *RequestError
	if errors.As(err, &re) && re.Request == nil {
		re.Request = req
	}
	return err
}

// maxUnknownListed is how many unknown fields a bad request's error names
// one by one; the rest are counted in one problem, so that many of them
// leave room in the first twenty for the problems of the known fields.
const maxUnknownListed = 5

// lenientProblems lists the problems of a request the strict decode
// refused for something other than its syntax: the unknown fields (up to
// maxUnknownListed, each named as such, then their count), then a wrong
// type, or else every problem Validate finds in what the known fields hold
// (a wrong type leaves a field empty, which Validate would misreport).
func lenientProblems(data []byte, subjectRun string) error {
	var req struct {
		RunRequest
		// model decoded apart: ModelRef refuses unknown fields itself,
		// which here are listed with the others.
		Model json.RawMessage `json:"model,omitempty"`
	}
	decErr := json.Unmarshal(data, &req)
	var p []string
	var raw any
	if json.Unmarshal(data, &raw) == nil {
		p = unknownFields(reflect.TypeFor[RunRequest](), raw, "", p)
		if n := len(p); n > maxUnknownListed {
			p = append(p[:maxUnknownListed], fmt.Sprintf("%d more unknown fields", n-maxUnknownListed))
		}
	}
	var se *json.SyntaxError
	var lenient *RunRequest
	switch {
	case errors.As(decErr, &se): // not expected: the strict decode got past the syntax
		return BadRequest("malformed JSON: %s", jsonErrorText(decErr))
	case decErr != nil:
		var te *json.UnmarshalTypeError
		if errors.As(decErr, &te) { // named as in the request, not through the wrapper
			te.Field = strings.TrimPrefix(te.Field, "RunRequest.")
		}
		p = append(p, "malformed JSON: "+jsonErrorText(decErr))
	default:
		if m, err := decodeModelRef(req.Model, false); err != nil {
			p = append(p, err.Error())
		} else {
			req.RunRequest.Model = m
			lenient = &req.RunRequest
		}
		if err := req.RunRequest.Validate(subjectRun); err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				return err
			}
			p = append(p, re.Problems...)
		}
	}
	if len(p) == 0 { // not expected: the strict decode found a problem
		return BadRequest("malformed JSON: the request does not decode")
	}
	if lenient != nil {
		lenient.ID = subjectRun
	}
	return &RequestError{Problems: p, Request: lenient}
}

// unknownFields appends a problem for each key of v (decoded JSON) that
// no field of t takes, matched as encoding/json matches them (exactly,
// else regardless of case); path is v's place in the request. Types that
// decode themselves take what they like, except ModelRef, whose object
// form has two fields.
func unknownFields(t reflect.Type, v any, path string, p []string) []string {
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if t != modelRefType && reflect.PointerTo(t).Implements(unmarshalerType) {
		return p
	}
	switch v := v.(type) {
	case map[string]any:
		switch t.Kind() {
		case reflect.Map:
			for _, k := range slices.Sorted(maps.Keys(v)) {
				p = unknownFields(t.Elem(), v[k], fmt.Sprintf("%s[%q]", path, k), p)
			}
		case reflect.Struct:
			for _, k := range slices.Sorted(maps.Keys(v)) {
				name := k
				if path != "" {
					name = path + "." + k
				}
				f, ok := jsonField(t, k)
				if !ok {
					p = append(p, fmt.Sprintf("unknown field %q", truncate(name, 128)))
					continue
				}
				p = unknownFields(f.Type, v[k], name, p)
			}
		}
	case []any:
		if t.Kind() == reflect.Slice || t.Kind() == reflect.Array {
			for i, e := range v {
				p = unknownFields(t.Elem(), e, fmt.Sprintf("%s[%d]", path, i), p)
			}
		}
	}
	return p
}

var (
	modelRefType    = reflect.TypeFor[ModelRef]()
	unmarshalerType = reflect.TypeFor[json.Unmarshaler]()
)

// jsonField is the field of struct t that encoding/json sets from key.
func jsonField(t reflect.Type, key string) (reflect.StructField, bool) {
	var folded reflect.StructField
	found := false
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		switch name {
		case "-":
			continue
		case "":
			name = f.Name
		}
		if name == key {
			return f, true
		}
		if !found && sameField([]byte(name), []byte(key)) {
			folded, found = f, true
		}
	}
	return folded, found
}

func jsonErrorText(err error) string {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	switch {
	case errors.As(err, &se):
		return fmt.Sprintf("%s (at byte %d)", se.Error(), se.Offset)
	case errors.As(err, &te):
		if te.Field != "" {
			return fmt.Sprintf("field %q: expected %s, got JSON %s", truncate(te.Field, 128), te.Type, truncate(te.Value, 64))
		}
		return fmt.Sprintf("expected %s, got JSON %s", te.Type, truncate(te.Value, 64))
	}
	return truncate(err.Error(), 256)
}

// checkJSONShape refuses what encoding/json accepts silently: duplicate
// keys (which one wins is up to the reader), in a struct's object also
// keys that differ only in case (encoding/json matches field names
// regardless of case, so "prompt" and "PROMPT" set one field), and deep
// nesting (costly to walk and to print). It scans the bytes itself, as
// encoding/json's Token cost more than the decode after it; malformed
// JSON is left to that decode, which says what is wrong.
func checkJSONShape(data []byte) error {
	var frames [16]shapeFrame
	var seen [64][]byte
	stack, keys := frames[:0], seen[:0] // keys: the open objects', in order
	var dups []string
	for i := 0; i < len(data); i++ {
		switch data[i] {
		case '"':
			end := stringEnd(data, i)
			if end < 0 {
				return dupsError(dups)
			}
			if n := len(stack); n > 0 && stack[n-1].wantKey {
				top := &stack[n-1]
				top.wantKey = false
				k, ok := jsonKey(data[i : end+1])
				if !ok {
					return dupsError(dups)
				}
				top.lastKey = k
				var have []byte
				if have, keys = top.seen(keys, k); have != nil {
					dups = append(dups, dupProblem(have, k, len(dups)))
				}
			}
			i = end
		case ',':
			if n := len(stack); n > 0 && stack[n-1].object {
				stack[n-1].wantKey = true
			}
		case '{', '[':
			f := shapeFrame{object: data[i] == '{', wantKey: data[i] == '{', start: len(keys)}
			if n := len(stack); n > 0 {
				parent := &stack[n-1]
				f.exact = parent.exact || (parent.object && mapField(parent.lastKey))
			}
			stack = append(stack, f)
		case '}', ']':
			if len(stack) == 0 {
				return dupsError(dups)
			}
			keys = keys[:stack[len(stack)-1].start]
			stack = stack[:len(stack)-1]
		}
		if len(stack) > MaxJSONDepth {
			return BadRequest("the request's JSON is nested deeper than %d levels", MaxJSONDepth)
		}
	}
	return dupsError(dups)
}

// dupProblem is the text of the n-th duplicate; past the listed ones
// only the count is shown, so none is written out.
func dupProblem(have, k []byte, n int) string {
	switch {
	case n >= maxProblems:
		return ""
	case bytes.Equal(have, k):
		return fmt.Sprintf("key %q appears twice in one object", truncate(string(k), 64))
	}
	return fmt.Sprintf("keys %q and %q name one field (field names match regardless of case)", truncate(string(have), 64), truncate(string(k), 64))
}

// mapField tells the request fields whose values are maps or raw JSON,
// not structs: their keys, and all keys below them, are compared as
// they are. The request's structs have no other maps.
func mapField(key []byte) bool {
	return bytes.EqualFold(key, []byte("metadata")) || bytes.EqualFold(key, []byte("arguments")) ||
		bytes.EqualFold(key, []byte("details"))
}

func dupsError(dups []string) error {
	if len(dups) == 0 {
		return nil
	}
	return &RequestError{Problems: dups}
}

// shapeFrame is one open object or array of checkJSONShape.
type shapeFrame struct {
	object  bool
	wantKey bool   // the next string of an object is a key
	exact   bool   // a map's object (or inside one): keys compared as they are
	lastKey []byte // the key whose value comes next
	start   int    // where its keys begin in the scan's keys
	many    map[string][]byte
}

// seenKeysScan is how many keys an object keeps in the scan's slice,
// compared with each new key, before it moves them to a map.
const seenKeysScan = 16

// seen records k in the object (keys are the scan's, with the object's
// last) and returns the key it had already that names the same field,
// if any.
func (f *shapeFrame) seen(keys [][]byte, k []byte) ([]byte, [][]byte) {
	if f.many != nil {
		name := f.name(k)
		if have, ok := f.many[name]; ok {
			return have, keys
		}
		f.many[name] = k
		return nil, keys
	}
	for _, have := range keys[f.start:] {
		if bytes.Equal(have, k) || (!f.exact && sameField(have, k)) {
			return have, keys
		}
	}
	keys = append(keys, k)
	if len(keys)-f.start > seenKeysScan {
		f.many = make(map[string][]byte, 2*seenKeysScan)
		for _, have := range keys[f.start:] {
			f.many[f.name(have)] = have
		}
		keys = keys[:f.start]
	}
	return nil, keys
}

// name is the map key of k in the object.
func (f *shapeFrame) name(k []byte) string {
	if f.exact {
		return string(k)
	}
	return string(foldName(k))
}

// foldName folds a field name as encoding/json does to match it
// regardless of case: two names fold alike when it matches them.
func foldName(in []byte) []byte {
	out := make([]byte, 0, len(in))
	for i := 0; i < len(in); {
		if c := in[i]; c < utf8.RuneSelf {
			if 'a' <= c && c <= 'z' {
				c -= 'a' - 'A'
			}
			out = append(out, c)
			i++
			continue
		}
		r, n := utf8.DecodeRune(in[i:])
		out = utf8.AppendRune(out, unicode.ToUpper(unicode.ToLower(r)))
		i += n
	}
	return out
}

// sameField tells whether encoding/json would match a and b to one
// field, without allocating for ASCII names.
func sameField(a, b []byte) bool {
	if isASCII(a) && isASCII(b) {
		return len(a) == len(b) && bytes.EqualFold(a, b)
	}
	return bytes.Equal(foldName(a), foldName(b))
}

func isASCII(b []byte) bool {
	for _, c := range b {
		if c >= utf8.RuneSelf {
			return false
		}
	}
	return true
}

// stringEnd is the index of the quote closing the string opening at i,
// or -1.
func stringEnd(data []byte, i int) int {
	for j := i + 1; j < len(data); j++ {
		switch data[j] {
		case '\\':
			j++
		case '"':
			return j
		}
	}
	return -1
}

// jsonKey is a quoted key as the decoder reads it: escapes undone, and
// invalid UTF-8 replaced.
func jsonKey(quoted []byte) ([]byte, bool) {
	raw := quoted[1 : len(quoted)-1]
	if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
		return raw, true
	}
	var k string
	if err := json.Unmarshal(quoted, &k); err != nil {
		return nil, false
	}
	return []byte(k), true
}

// checkText refuses control characters in a short field that is shown on
// terminals and pages (model ids, metadata keys).
func checkText(s string) bool {
	for _, r := range s {
		if r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) || r == utf8.RuneError {
			return false
		}
	}
	return true
}

// imageMimeRE bounds an image block's mimeType: it is copied into data:
// URLs and HTTP bodies.
var imageMimeRE = regexp.MustCompile(`^image/[a-z0-9][a-z0-9.+-]{0,62}$`)

// Validate checks a decoded request. subjectRun may be "" when the id is not
// known yet (a client validating before Submit).
func (r *RunRequest) Validate(subjectRun string) error {
	var p []string
	add := func(format string, args ...any) { p = append(p, fmt.Sprintf(format, args...)) }

	if r.ID != "" {
		if !ValidID(r.ID) {
			add("id %q must match [A-Za-z0-9_-]{1,64}", truncate(r.ID, 80))
		} else if subjectRun != "" && r.ID != subjectRun {
			add("id %q differs from the subject's run id %q", r.ID, subjectRun)
		}
	}
	if c := r.Concurrency; c != nil {
		if c.Key == "" || len(c.Key) > MaxConcurrencyKeyBytes || !checkText(c.Key) {
			add("concurrency.key must be 1..%d bytes of text", MaxConcurrencyKeyBytes)
		}
		if c.Limit < 0 || c.Limit > MaxConcurrencyLimit {
			add("concurrency.limit is %d; it must be 1..%d (0 or absent: the workers' default for the key)", c.Limit, MaxConcurrencyLimit)
		}
	}
	if r.Priority != "" && !ValidPriority(r.Priority) {
		add("priority %q: use high, normal or low", truncate(r.Priority, 40))
	}
	if r.Prompt == "" && len(r.Messages) == 0 {
		add(`no "prompt" and no "messages": give at least one`)
	}
	if len(r.Prompt) > MaxPromptBytes {
		add("prompt is %d bytes, the limit is %d", len(r.Prompt), MaxPromptBytes)
	}
	if len(r.SystemPrompt) > MaxSystemPromptBytes {
		add("systemPrompt is %d bytes, the limit is %d", len(r.SystemPrompt), MaxSystemPromptBytes)
	}
	if len(r.Images) > 0 {
		if r.Prompt == "" {
			add(`"images" need a "prompt"`)
		}
		if len(r.Images) > MaxImages {
			add("%d images, the limit is %d", len(r.Images), MaxImages)
		}
		for i, im := range r.Images {
			if im.Type != agent.ContentImage || im.Data == "" || im.MimeType == "" {
				add("images[%d] must be {\"type\":\"image\",\"data\":<base64>,\"mimeType\":...}", i)
			} else if !imageMimeRE.MatchString(im.MimeType) {
				add("images[%d] has mimeType %q; use image/<type> (e.g. image/png)", i, truncate(im.MimeType, 40))
			}
		}
	}
	if len(r.Messages) > MaxMessages {
		add("%d messages, the limit is %d", len(r.Messages), MaxMessages)
	}
	for i := range r.Messages {
		m := &r.Messages[i]
		switch m.Role {
		case agent.RoleUser, agent.RoleAssistant, agent.RoleToolResult:
		case agent.RoleSystem, agent.RoleDeveloper:
			// Sent to the model as system text: only "systemPrompt" sets it.
			add(`messages[%d] has role %q: system text goes in "systemPrompt"; messages take user, assistant or toolResult`, i, m.Role)
		default:
			add("messages[%d] has role %q; use user, assistant or toolResult", i, truncate(m.Role, 40))
		}
		for j, c := range m.Content {
			if bad := blockProblem(m.Role, c); bad != "" {
				add("messages[%d].content[%d]: %s", i, j, bad)
			}
		}
		if b, err := json.Marshal(m); err != nil {
			add("messages[%d]: %v", i, err)
		} else if len(b) > MaxMessageBytes {
			add("messages[%d] is %d bytes, the limit is %d", i, len(b), MaxMessageBytes)
		}
	}
	if r.Prompt == "" && len(r.Messages) > 0 && r.Messages[len(r.Messages)-1].Role == agent.RoleAssistant {
		add(`"messages" end with an assistant message and there is no "prompt": nothing to answer`)
	}
	if len(r.Tools) > MaxTools {
		add("%d tools, the limit is %d", len(r.Tools), MaxTools)
	}
	seen := map[string]int{}
	for _, t := range r.Tools {
		if seen[t]++; seen[t] == 2 {
			add("tool %q listed more than once", truncate(t, 64))
		}
	}
	switch r.ThinkingLevel {
	case "", agent.ThinkingOff, agent.ThinkingMinimal, agent.ThinkingLow, agent.ThinkingMedium,
		agent.ThinkingHigh, agent.ThinkingXHigh, agent.ThinkingMax:
	default:
		add("thinkingLevel %q is not one of off, minimal, low, medium, high, xhigh, max", truncate(string(r.ThinkingLevel), 40))
	}
	switch r.ToolExecution {
	case "", agent.ExecutionParallel, agent.ExecutionSequential:
	default:
		add("toolExecution %q is not parallel or sequential", truncate(string(r.ToolExecution), 40))
	}
	for _, q := range [...]struct {
		name string
		mode agent.QueueMode
	}{{"steeringMode", r.SteeringMode}, {"followUpMode", r.FollowUpMode}} {
		switch q.mode {
		case "", agent.QueueOneAtATime, agent.QueueAll:
		default:
			add("%s %q is not one-at-a-time or all", q.name, truncate(string(q.mode), 40))
		}
	}
	if l := r.Limits; l != nil {
		if l.MaxTurns < 0 || l.MaxTurns > MaxTurnsLimit {
			add("limits.maxTurns %d is not in 1..%d", l.MaxTurns, MaxTurnsLimit)
		}
		if l.TimeoutSeconds < 0 || l.TimeoutSeconds > MaxTimeoutSeconds {
			add("limits.timeoutSeconds %d is not in 1..%d", l.TimeoutSeconds, MaxTimeoutSeconds)
		}
		if l.MaxTotalTokens < 0 {
			add("limits.maxTotalTokens must not be negative")
		}
		if l.MaxCostUsd < 0 {
			add("limits.maxCostUsd must not be negative")
		}
	}
	if t := r.Temperature; t != nil && (*t < 0 || *t > 2) {
		add("temperature %g is not in 0..2", *t)
	}
	if r.MaxTokens < 0 || r.MaxTokens > MaxTokensLimit {
		add("maxTokens %d is not in 0..%d", r.MaxTokens, MaxTokensLimit)
	}
	if r.ContinueFrom != "" {
		if !ValidID(r.ContinueFrom) {
			add("continueFrom %q is not a valid run id", truncate(r.ContinueFrom, 80))
		} else if r.ContinueFrom == subjectRun {
			add("continueFrom names the run itself")
		}
	}
	if len(r.Metadata) > MaxMetadata {
		add("%d metadata entries, the limit is %d", len(r.Metadata), MaxMetadata)
	}
	for k, v := range r.Metadata {
		if k == "" || len(k) > MaxMetadataKey {
			add("metadata key %q must be 1..%d bytes", truncate(k, 80), MaxMetadataKey)
		}
		if len(v) > MaxMetadataValue {
			add("metadata %q value is %d bytes, the limit is %d", truncate(k, 64), len(v), MaxMetadataValue)
		}
	}
	if m := r.Model; m != nil {
		if len(m.Provider) > MaxProviderBytes || !ValidQueue(m.Provider) {
			add("model provider %q must match [A-Za-z0-9_-]{1,%d}", truncate(m.Provider, 64), MaxProviderBytes)
		}
		if len(m.ID) > MaxModelIDBytes || !checkText(m.ID) || strings.ContainsAny(m.ID, " \t") {
			add("model id %q must be 1..%d printable bytes without spaces", truncate(m.ID, 64), MaxModelIDBytes)
		}
	}
	for k := range r.Metadata {
		if !checkText(k) {
			add("metadata key %q holds control characters", truncate(k, 64))
		}
	}
	if r.Approval != nil {
		p = append(p, r.Approval.Problems("approval")...)
	}
	if r.Compaction != nil {
		p = append(p, r.Compaction.Problems("compaction")...)
	}
	if r.Children != nil {
		p = append(p, r.Children.Problems("children")...)
	}
	if r.Child != nil {
		p = append(p, r.Child.Problems("child", subjectRun)...)
	}
	if r.Faux != nil {
		if r.Model != nil && r.Model.Provider != "faux" {
			add(`"faux" is only for the faux provider, but model is %q`, r.Model.String())
		}
		if len(r.Faux.Responses) > MaxFauxResponses {
			add("%d faux responses, the limit is %d", len(r.Faux.Responses), MaxFauxResponses)
		}
		if r.Faux.TokenSize < 0 || r.Faux.TokenSize > MaxFauxTokenSize {
			add("faux tokenSize %d is not in 0..%d", r.Faux.TokenSize, MaxFauxTokenSize)
		}
		if tps := r.Faux.TokensPerSecond; !(tps >= 0 && tps <= MaxFauxTokensPerSec) {
			add("faux tokensPerSecond %g is not in 0..%g", tps, MaxFauxTokensPerSec)
		}
		for i, fr := range r.Faux.Responses {
			if len(fr.ErrorMessage) > MaxFauxErrorBytes {
				add("faux responses[%d].errorMessage is %d bytes, the limit is %d", i, len(fr.ErrorMessage), MaxFauxErrorBytes)
			}
			for j, c := range fr.Content {
				if bad := blockProblem(agent.RoleAssistant, c); bad != "" {
					add("faux responses[%d].content[%d]: %s", i, j, bad)
				}
			}
		}
	}
	if len(p) > 0 {
		return &RequestError{Problems: p}
	}
	return nil
}

// blockProblem says what is wrong with a content block in a message of
// role, or "". Users and tool results send text and images; only the
// assistant has thinking and tool calls.
func blockProblem(role string, c agent.Content) string {
	switch c.Type {
	case agent.ContentText:
		return ""
	case agent.ContentImage:
		if !imageMimeRE.MatchString(c.MimeType) {
			return fmt.Sprintf("image mimeType %q; use image/<type> (e.g. image/png)", truncate(c.MimeType, 40))
		}
		return ""
	case agent.ContentThinking, agent.ContentToolCall:
		if role == agent.RoleAssistant {
			if c.Type == agent.ContentToolCall && (c.ID == "" || c.Name == "") {
				return "a toolCall block needs an id and a name"
			}
			return ""
		}
	}
	if role == agent.RoleAssistant {
		return fmt.Sprintf("block type %q is not text, thinking, toolCall or image", truncate(c.Type, 40))
	}
	return fmt.Sprintf("block type %q is not allowed in a %s message (text or image only)", truncate(c.Type, 40), truncate(role, 20))
}
