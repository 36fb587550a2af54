package bus

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
)

// shapeByTokens is checkJSONShape as it was, on encoding/json's tokens:
// the reference the byte scanner must agree with on valid JSON.
func shapeByTokens(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		object bool
		keys   map[string]bool
		key    bool
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
					if top.keys[k] {
						dups = append(dups, fmt.Sprintf("key %q appears twice in one object", truncate(k, 64)))
					}
					top.keys[k] = true
					top.key = false
					continue
				}
			} else {
				top.key = true
			}
		}
		switch tok {
		case json.Delim('{'):
			stack = append(stack, frame{object: true, keys: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, frame{})
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
