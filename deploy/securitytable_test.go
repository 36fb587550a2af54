package deploy

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestSecurityTableNamesRealTests: every test docs/security.md's table of
// roles names as proof exists, so the table cannot name a test that was
// renamed or removed.
func TestSecurityTableNamesRealTests(t *testing.T) {
	doc, err := os.ReadFile("../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(doc), "## 0. Who can do what")
	end := strings.Index(string(doc), "## 1. ")
	if start < 0 || end < start {
		t.Fatal(`docs/security.md has no "## 0. Who can do what" before "## 1."`)
	}
	named := map[string]bool{}
	for _, m := range regexp.MustCompile("`((?:Test|Fuzz)[A-Za-z0-9_]+)(?:/[^`]*)?`").FindAllStringSubmatch(string(doc[start:end]), -1) {
		named[m[1]] = true
	}
	if len(named) < 20 {
		t.Fatalf("the table names %d tests; want the proofs of every role", len(named))
	}
	defined := map[string]bool{}
	def := regexp.MustCompile(`(?m)^func ((?:Test|Fuzz)[A-Za-z0-9_]+)\(`)
	err = filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range def.FindAllStringSubmatch(string(b), -1) {
			defined[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for name := range named {
		if !defined[name] {
			t.Errorf("docs/security.md names %s, which no test file defines", name)
		}
	}
}
