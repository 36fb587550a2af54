package deploy

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOperationsGuideStaysAGuide: docs/operations.md is an operator's
// guide (issue 53): under 1,200 lines, with no commit hashes; dated
// measurements belong in docs/benchmarks/.
func TestOperationsGuideStaysAGuide(t *testing.T) {
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n >= 1200 {
		t.Errorf("docs/operations.md has %d lines; keep it under 1,200 (dated figures go to docs/benchmarks/)", n)
	}
	if m := regexp.MustCompile("`[0-9a-f]{7,12}`").FindString(string(b)); m != "" {
		t.Errorf("docs/operations.md holds %s, a commit hash: move dated measurements to docs/benchmarks/", m)
	}
}
