// Package protocol is agentfleet's wire protocol as JSON Schema: the
// schema files next to this package (run-request, event, control, record
// and presence), generated from the wire types of package bus by Generate
// and checked in, and a Validator over them. README.md says what each file
// describes; docs/protocol.md is the normative description.
//
// After a change to a wire type or to bus.ProtocolVersion, regenerate the
// files (TestSchemasAreUpToDate fails until then):
//
//	go generate ./protocol
package protocol

//go:generate go run ./gen -dir .
