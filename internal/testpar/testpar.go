// Package testpar sets how many of a package's parallel tests run at once
// when go test was not told (-parallel): its default is GOMAXPROCS, 2 on a
// 2-core machine, which suits tests that compute, while most of this
// project's tests wait (on acks, redeliveries, heartbeats, processes) and
// leave the cores idle.
package testpar

import (
	"flag"
	"strconv"
)

// Default makes n the -parallel of a TestMain's package unless the command
// line gave -parallel. Call it first in TestMain, before m.Run; it parses
// the command line (m.Run then does not parse it again).
func Default(n int) {
	if !flag.Parsed() {
		flag.Parse()
	}
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if given {
		return
	}
	if err := flag.Set("test.parallel", strconv.Itoa(n)); err != nil {
		panic("testpar: " + err.Error()) // the flag is testing's: not under go test
	}
}
