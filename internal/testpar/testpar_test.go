package testpar_test

import (
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/agentfleet/agentfleet/internal/testpar"
)

func TestMain(m *testing.M) {
	testpar.Default(7)
	if os.Getenv("TESTPAR_PRINT") == "1" {
		// Run again by TestDefault: say which -parallel the tests got.
		fmt.Printf("parallel=%s\n", flag.Lookup("test.parallel").Value)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// Without -parallel the package runs Default's number of tests at once;
// with it, the command line's.
func TestDefault(t *testing.T) {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "parallel=7"},
		{[]string{"-test.parallel=3"}, "parallel=3"},
	} {
		cmd := exec.Command(exe, append([]string{"-test.run=^$"}, c.args...)...)
		cmd.Env = append(os.Environ(), "TESTPAR_PRINT=1", "GORACE=atexit_sleep_ms=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("%v: %v\n%s", c.args, err, out)
		}
		if !strings.Contains(string(out), c.want+"\n") {
			t.Errorf("with %v: want %s in\n%s", c.args, c.want, out)
		}
	}
}
