package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/agentfleet/agentfleet/internal/rolefleet"
)

// The tool caller's server URLs are the worker's without credentials, read
// as nats.go reads them: a URL without a scheme is host[:port] (url.Parse
// alone takes "worker:pw@host" for scheme "worker" and kept its
// credentials). A URL that does not parse stops the tool connection, and
// the error shows no password.
func TestToolsConnURLsWithoutCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"worker:pw@host:4222":                          "host:4222",
		"worker@host:4222":                             "host:4222",
		"host:4222":                                    "host:4222",
		"nats://worker:pw@host:4222":                   "nats://host:4222",
		"tls://worker:pw@host":                         "tls://host",
		"ws://worker:pw@host:8080/path":                "ws://host:8080/path",
		"nats://a:b@h1:4222, worker:pw@h2:4222":        "nats://h1:4222,h2:4222",
		"worker:pw@h1:4222,nats://x:pw@h2:4222,":       "h1:4222,nats://h2:4222,",
		"nats://worker:p%40ss@host:4222":               "nats://host:4222",
		"nats://token@127.0.0.1:4222,token@[::1]:4222": "nats://127.0.0.1:4222,[::1]:4222",
	} {
		got, err := withoutUserInfo(in)
		if err != nil || got != want {
			t.Errorf("withoutUserInfo(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"nats://worker:pw@host:4222,worker:pw@ho st:4222", "nats://worker:pw@[::1:4222", "worker:pw@host:port"} {
		got, err := withoutUserInfo(in)
		if err == nil {
			t.Errorf("withoutUserInfo(%q) = %q, want an error", in, got)
		} else if strings.Contains(err.Error(), "pw") {
			t.Errorf("withoutUserInfo(%q): the error shows the password: %v", in, err)
		}
	}
	o := &options{}
	o.conn.URL = "nats://a:b@h1:4222,worker:pw@ho st:4222"
	o.toolsAuth = toolsAuth{user: "toolcaller", password: "tc"}
	if _, err := connectTools(context.Background(), o); err == nil || !strings.Contains(err.Error(), "--nats: server URL 2 does not parse") {
		t.Errorf("connectTools with a URL that does not parse: %v", err)
	}
}

// A scheme-less --nats URL with the worker's credentials does not make the
// tool connection the worker's: on a server with deploy/nats/accounts.conf
// the tool connection's publish on a record is refused as user toolcaller.
func TestToolsConnSchemeLessURLIsNotTheWorker(t *testing.T) {
	srv := rolefleet.Start(t, "../../deploy/nats/accounts.conf")
	hostport := strings.TrimPrefix(srv.URL, "nats://")
	o := &options{}
	o.conn.URL = "worker:" + srv.Passwords["worker"] + "@" + hostport
	o.toolsAuth = toolsAuth{user: "toolcaller", password: srv.Passwords["toolcaller"]}
	c, err := connectTools(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Conn().Publish("$KV.agents_runs.forged", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	if !srv.Log.Violation("toolcaller", "$KV.agents_runs.forged") {
		t.Errorf("no violation by toolcaller for a record written by the tool connection (it is the worker): %v", srv.Log.Lines("Violation"))
	}
}

// The tool connection never shows the worker's client certificate: with
// verify_and_map the certificate is the user, and the worker's would make
// the tool caller the worker. Without --tools-tlscert the server, which
// asks for a certificate, refuses the tool connection; with it the
// connection is the tool caller, which may publish on agents.tools.> and
// not on a record.
func TestToolsConnDoesNotShowTheWorkersCertificate(t *testing.T) {
	p := newTestPKI(t, "worker", "toolcaller", "watcher")
	s := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		TLS: true, TLSVerify: true, TLSMap: true, TLSTimeout: 2,
		TLSConfig: &tls.Config{Certificates: []tls.Certificate{p.server}, ClientCAs: p.pool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12},
		Users: []*server.User{
			{Username: "CN=worker", Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{">"}}}},
			{Username: "CN=toolcaller", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"$SRV.INFO", "agents.tools.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}}}},
			{Username: "CN=watcher"},
		}}
	ns, err := server.NewServer(s)
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })

	watcher, err := nats.Connect(ns.ClientURL(), nats.RootCAs(p.ca), nats.ClientCert(p.cert["watcher"], p.key["watcher"]))
	if err != nil {
		t.Fatal(err)
	}
	defer watcher.Close()
	// One channel for both: the watcher's read loop keeps their order.
	seen := make(chan *nats.Msg, 16)
	for _, subject := range []string{"$KV.>", "agents.tools.>"} {
		if _, err := watcher.ChanSubscribe(subject, seen); err != nil {
			t.Fatal(err)
		}
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}

	o := &options{}
	o.conn.URL, o.conn.TLSCA, o.conn.TLSCert, o.conn.TLSKey = ns.ClientURL(), p.ca, p.cert["worker"], p.key["worker"]
	o.conn.Timeout = 2 * time.Second
	// --tools-user alone: under verify_and_map the server takes the user
	// from the certificate and only warns about the name.
	o.toolsAuth = toolsAuth{user: "toolcaller"}
	if c, err := connectTools(context.Background(), o); err == nil {
		c.Close()
		t.Error("without --tools-tlscert the tool connection was accepted: it showed the worker's certificate")
	}

	o.toolsAuth = toolsAuth{tlsCert: p.cert["toolcaller"], tlsKey: p.key["toolcaller"]}
	c, err := connectTools(context.Background(), o)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// In order on one connection: the record first, then the call.
	for _, subject := range []string{"$KV.agents_runs.forged", "agents.tools.calc.add"} {
		if err := c.Conn().Publish(subject, []byte(`{}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	select {
	case m := <-seen:
		if m.Subject != "agents.tools.calc.add" {
			t.Errorf("the tool caller's first message through: %q, want agents.tools.calc.add (the record refused)", m.Subject)
		}
	case <-time.After(10 * time.Second):
		t.Error("the tool caller's call did not get through")
	}
}

// testPKI is a CA, a server certificate for 127.0.0.1 and a client
// certificate per name (CN=<name>), as files.
type testPKI struct {
	ca        string
	pool      *x509.CertPool
	server    tls.Certificate
	cert, key map[string]string
}

func newTestPKI(t *testing.T, clients ...string) *testPKI {
	t.Helper()
	dir := t.TempDir()
	caKey, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	caTmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "agentfleet test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	write := func(name, typ string, der []byte) string {
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	p := &testPKI{ca: write("ca.pem", "CERTIFICATE", caDER), pool: x509.NewCertPool(), cert: map[string]string{}, key: map[string]string{}}
	p.pool.AddCert(ca)
	issue := func(cn string, serial int64, srv bool) (string, string) {
		key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
			ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		if srv {
			tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
			tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, _ := x509.MarshalECPrivateKey(key)
		return write(cn+".pem", "CERTIFICATE", der), write(cn+"-key.pem", "EC PRIVATE KEY", kder)
	}
	cert, key := issue("nats-server", 2, true)
	if p.server, err = tls.LoadX509KeyPair(cert, key); err != nil {
		t.Fatal(err)
	}
	for i, name := range clients {
		p.cert[name], p.key[name] = issue(name, int64(3+i), false)
	}
	return p
}
