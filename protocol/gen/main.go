// Command gen writes the protocol's JSON Schema files (package protocol,
// protocol.Generate) into a directory: go generate ./protocol runs it
// there.
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentfleet/agentfleet/protocol"
)

func main() {
	dir := flag.String("dir", ".", "the directory to write the schema files into (protocol/)")
	flag.Parse()
	files, err := protocol.Generate()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for _, name := range protocol.Files() {
		if err := os.WriteFile(filepath.Join(*dir, name), files[name], 0o644); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
