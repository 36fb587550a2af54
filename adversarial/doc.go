// Package adversarial is agentfleet's attack suite: each test attacks the
// fleet through its public surfaces only, as the role of
// deploy/nats/accounts.conf that would send the attack (a submitter, an
// approver, an observer, a tool service, a web page, a model endpoint, an
// MCP server), on a real nats-server loaded with that file, and asserts
// what must hold, not that a code path ran. docs/security.md's table of
// roles names the test that proves each line.
//
// The tests are behind the build tag "adversarial"; .ci/run runs them with
//
//	go test -tags adversarial -count=1 -timeout 15m ./adversarial/
package adversarial
