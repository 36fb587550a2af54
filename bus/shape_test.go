package bus

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// shapeByTokens is checkJSONShape on encoding/json's tokens, as it was
// before the byte scanner, with the same rules (case folded outside maps):
// the reference the scanner must agree with on valid JSON.
func shapeByTokens(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object, exact bool
		keys          map[string]string // field name -> the key first seen
		key           bool
		lastKey       string
	}
	var stack []frame
	var dups []string
	for {
		tok, err := dec.Token()
		if err != nil {
			break
		}
		if n := len(stack); n > 0 && stack[n-1].object {
			top := &stack[n-1]
			if top.key {
				if k, ok := tok.(string); ok {
					name := k
					if !top.exact {
						name = string(foldName([]byte(k)))
					}
					if have, ok := top.keys[name]; ok {
						dups = append(dups, dupProblem([]byte(have), []byte(k), len(dups)))
					} else {
						top.keys[name] = k
					}
					top.key, top.lastKey = false, k
					continue
				}
			} else {
				top.key = true
			}
		}
		switch tok {
		case json.Delim('{'), json.Delim('['):
			f := frame{object: tok == json.Delim('{'), key: tok == json.Delim('{'), keys: map[string]string{}}
			if n := len(stack); n > 0 {
				p := stack[n-1]
				f.exact = p.exact || (p.object && mapField([]byte(p.lastKey)))
			}
			stack = append(stack, f)
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > MaxJSONDepth {
			return BadRequest("the request's JSON is nested deeper than %d levels", MaxJSONDepth)
		}
	}
	if len(dups) > 0 {
		return &RequestError{Problems: dups}
	}
	return nil
}

func errText(err error) string {
	if err == nil {
		return "<nil>"
	}
	return err.Error()
}

var shapeSeeds = []string{
	`{"prompt":"x","prompt":"y"}`,
	`{"a":{"b":1,"b":2},"c":[{"d":1},{"d":1}],"a":3}`,
	`{"a\u0062":1,"ab":2}`,
	`{"k\"":1,"k\\":2,"k\"":3}`,
	`{"x":"{\"x\":1}","x":[]}`,
	"{\"\xff\":1,\"\xfe\":2}",
	`[` + strings.Repeat(`{"a":[`, 70) + strings.Repeat(`]}`, 70) + `]`,
	`{"m":{` + strings.Repeat(`"k":1,`, 40) + `"z":0}}`,
	`{"prompt":"p","metadata":{"a":"1","b":"2","c":"3","d":"4","e":"5","f":"6","g":"7","h":"8","i":"9","j":"10","k":"11","l":"12","m":"13","n":"14","o":"15","p":"16","q":"17","a":"dup after the map"}}`,
	`[]`, `"s"`, `1`, `{}`,
}

func TestShapeScannerAgreesWithTokens(t *testing.T) {
	t.Parallel()
	for _, s := range shapeSeeds {
		if got, want := errText(checkJSONShape([]byte(s))), errText(shapeByTokens([]byte(s))); got != want {
			t.Errorf("%.80q:\n got %s\nwant %s", s, got, want)
		}
	}
	// The test compares something: the seeds hold duplicates and depth.
	if checkJSONShape([]byte(shapeSeeds[1])) == nil || checkJSONShape([]byte(shapeSeeds[6])) == nil {
		t.Fatal("the seeds' duplicates or depth went unseen")
	}
}

// encoding/json sets one field from keys that differ only in case, so
// such keys are duplicates in a struct's object; in a map's (metadata,
// a tool call's arguments) they are distinct keys.
func TestShapeFoldsFieldNames(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		body string
		want []string // problems; none when empty
	}{
		{`{"prompt":"benign","PROMPT":"evil"}`, []string{`keys "prompt" and "PROMPT" name one field`}},
		{"{\"tools\":[],\"tool\u017f\":[]}", []string{`name one field`}}, // ſ folds to s
		{`{"prompt":"x","limits":{"maxTurns":1,"MaxTurns":2}}`, []string{`keys "maxTurns" and "MaxTurns"`}},
		{`{"prompt":"x","metadata":{"id":"1","ID":"2"}}`, nil},
		{`{"prompt":"x","Metadata":{"id":"1","ID":"2"}}`, nil},
		{`{"prompt":"x","metadata":{"id":"1","id":"2"}}`, []string{`key "id" appears twice`}},
	} {
		err := checkJSONShape([]byte(tc.body))
		if len(tc.want) == 0 {
			if err != nil {
				t.Errorf("%s: %v", tc.body, err)
			}
			continue
		}
		for _, w := range tc.want {
			if err == nil || !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v, want %q", tc.body, err, w)
			}
		}
	}
	// What the check stops: encoding/json would take the second prompt.
	var req RunRequest
	if err := json.Unmarshal([]byte(`{"prompt":"benign","PROMPT":"evil"}`), &req); err != nil || req.Prompt != "evil" {
		t.Fatalf("encoding/json no longer folds field names (%q, %v): the check may be relaxed", req.Prompt, err)
	}
	if _, err := DecodeRunRequest([]byte(`{"prompt":"benign","PROMPT":"evil"}`), "r1"); !IsBadRequest(err) {
		t.Fatalf("DecodeRunRequest took keys that differ only in case: %v", err)
	}
}

// A flood of duplicates costs a count, not a text each.
func TestShapeDuplicateFloodIsCounted(t *testing.T) {
	t.Parallel()
	body := `{"metadata":{` + strings.Repeat(`"a":"1",`, 50000) + `"b":"2"}}`
	err := checkJSONShape([]byte(body))
	var re *RequestError
	if !errors.As(err, &re) || len(re.Problems) != 49999 || !strings.Contains(err.Error(), "and 49979 more") {
		t.Fatalf("%.200v", err)
	}
}

func TestStrayClosingAfterTheRequest(t *testing.T) {
	t.Parallel()
	for _, body := range []string{`{"prompt":"x"}}`, `{"prompt":"x"}]`, `{"prompt":"x"} {}`} {
		if _, err := DecodeRunRequest([]byte(body), "r1"); err == nil || !strings.Contains(err.Error(), "extra data") {
			t.Errorf("%s: %v", body, err)
		}
	}
	if _, err := DecodeRunRequest([]byte("{\"prompt\":\"x\"}\n\t "), "r1"); err != nil {
		t.Errorf("trailing white space: %v", err)
	}
}

// On valid JSON the scanner says what the token walk said; on any input
// it ends without a panic.
func FuzzShapeScanner(f *testing.F) {
	for _, s := range shapeSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		got := checkJSONShape(data)
		if !json.Valid(data) {
			return
		}
		if want := shapeByTokens(data); errText(got) != errText(want) {
			t.Fatalf("%q:\n got %s\nwant %s", data, errText(got), errText(want))
		}
	})
}
