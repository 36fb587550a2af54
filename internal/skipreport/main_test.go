package main

import (
	"os"
	"strings"
	"testing"
)

// A stream as go test -json writes it: a package with skips (one a
// subtest, one with a reason on two lines) and a failure, a package that
// passes, one without tests and one that does not build.
const stream = `{"Action":"start","Package":"m/a"}
{"Action":"run","Package":"m/a","Test":"TestX"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"=== RUN   TestX\n"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"    a_test.go:3: no chromium binary found (apt-get install chromium)\n"}
{"Action":"output","Package":"m/a","Test":"TestX","Output":"--- SKIP: TestX (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestX","Elapsed":0}
{"Action":"output","Package":"m/a","Test":"TestZ/sub","Output":"=== RUN   TestZ/sub\n"}
{"Action":"output","Package":"m/a","Test":"TestZ/sub","Output":"    a_test.go:4: AGENTFLEET_MCP_EVERYTHING is not set\n"}
{"Action":"output","Package":"m/a","Test":"TestZ/sub","Output":"        (npm install it)\n"}
{"Action":"output","Package":"m/a","Test":"TestZ/sub","Output":"--- SKIP: TestZ/sub (0.00s)\n"}
{"Action":"skip","Package":"m/a","Test":"TestZ/sub","Elapsed":0}
{"Action":"output","Package":"m/a","Test":"TestW","Output":"    a_test.go:9: no chromium binary found (apt-get install chromium)\n"}
{"Action":"skip","Package":"m/a","Test":"TestW","Elapsed":0}
{"Action":"output","Package":"m/a","Test":"TestFail","Output":"    a_test.go:5: boom\n"}
{"Action":"output","Package":"m/a","Test":"TestFail","Output":"--- FAIL: TestFail (0.00s)\n"}
{"Action":"fail","Package":"m/a","Test":"TestFail","Elapsed":0}
{"Action":"output","Package":"m/a","Output":"FAIL\tm/a\t0.014s\n"}
{"Action":"fail","Package":"m/a","Elapsed":0.015}
{"Action":"start","Package":"m/b"}
{"Action":"output","Package":"m/b","Test":"TestY","Output":"=== RUN   TestY\n"}
{"Action":"output","Package":"m/b","Test":"TestY","Output":"--- PASS: TestY (0.00s)\n"}
{"Action":"pass","Package":"m/b","Test":"TestY","Elapsed":0}
{"Action":"output","Package":"m/b","Output":"PASS\n"}
{"Action":"output","Package":"m/b","Output":"ok  \tm/b\t0.003s\n"}
{"Action":"pass","Package":"m/b","Elapsed":0.003}
{"Action":"start","Package":"m/c"}
{"Action":"output","Package":"m/c","Output":"?   \tm/c\t[no test files]\n"}
{"Action":"skip","Package":"m/c","Elapsed":0}
{"ImportPath":"m/d [m/d.test]","Action":"build-output","Output":"d_test.go:3:28: declared and not used: x\n"}
{"ImportPath":"m/d [m/d.test]","Action":"build-fail"}
`

func TestReport(t *testing.T) {
	var out strings.Builder
	if code := report(strings.NewReader(stream), &out); code != 1 {
		t.Errorf("exit %d with a failure", code)
	}
	want := "    a_test.go:5: boom\n--- FAIL: TestFail (0.00s)\nFAIL\tm/a\t0.014s\n" +
		"ok  \tm/b\t0.003s\n?   \tm/c\t[no test files]\n" +
		"d_test.go:3:28: declared and not used: x\n"
	got := out.String()
	if !strings.Contains(got, want) {
		t.Errorf("output:\n%s\nwant it to contain:\n%s", got, want)
	}
	lines := strings.Split(strings.TrimSpace(got), "\n")
	if last := lines[len(lines)-1]; last != "SKIPPED 3 tests: m/a TestX, TestW (no chromium binary found (apt-get install chromium)); m/a TestZ/sub (AGENTFLEET_MCP_EVERYTHING is not set (npm install it))" {
		t.Errorf("summary: %q", last)
	}
	if strings.Contains(got, "=== RUN") || strings.Contains(got, "--- SKIP") || strings.Contains(got, "--- PASS") {
		t.Errorf("more than go test without -v prints:\n%s", got)
	}
}

func TestReportAllPassed(t *testing.T) {
	var out strings.Builder
	ok := `{"Action":"output","Package":"m/b","Output":"ok  \tm/b\t0.003s\n"}
{"Action":"pass","Package":"m/b","Elapsed":0.003}
`
	if code := report(strings.NewReader(ok), &out); code != 0 || out.String() != "ok  \tm/b\t0.003s\nskipped: none\n" {
		t.Errorf("exit %d:\n%s", code, out.String())
	}
	// go test failing before any package (no JSON) is a failure.
	out.Reset()
	if code := report(strings.NewReader("go: cannot find main module\n"), &out); code != 1 {
		t.Errorf("exit %d without results", code)
	}
}

// Real go test -json streams (testdata/, made by go test on two small
// packages): a test that ran past -timeout, and a test whose goroutine
// panicked. Neither gets a fail event of its own, only the dump under its
// name: the report must show it, not a bare FAIL.
func TestReportShowsTimeoutsAndPanics(t *testing.T) {
	for file, want := range map[string][]string{
		"testdata/timeout.json": {"panic: test timed out after 2s", "TestHangs", "waiting for something that never comes"},
		"testdata/panic.json":   {"panic: assignment to entry in nil map", "TestGoroutinePanics", "starting the worker", "q_test.go:"},
	} {
		in, err := os.Open(file)
		if err != nil {
			t.Fatal(err)
		}
		var out strings.Builder
		code := report(in, &out)
		in.Close()
		if code != 1 {
			t.Errorf("%s: exit %d, want 1", file, code)
		}
		for _, w := range want {
			if !strings.Contains(out.String(), w) {
				t.Errorf("%s: the report lacks %q:\n%s", file, w, out.String())
			}
		}
		if strings.Contains(out.String(), "fine") {
			t.Errorf("%s: a passing test's output is shown:\n%s", file, out.String())
		}
	}
}
