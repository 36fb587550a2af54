package bus

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

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nkeys"
)

// authServer starts a plain nats-server (no JetStream: Connect needs none)
// on a free loopback port, configured by edit.
func authServer(t *testing.T, edit func(*server.Options)) *server.Server {
	t.Helper()
	opts := &server.Options{Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true}
	edit(opts)
	s, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		s.Shutdown()
		t.Fatal("server not ready")
	}
	t.Cleanup(func() { s.Shutdown(); s.WaitForShutdown() })
	return s
}

// mustConnect connects, round-trips once and closes.
func mustConnect(t *testing.T, what string, o ConnectOptions) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Connect(ctx, o)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	defer c.Close()
	if _, err := c.Conn().RTT(); err != nil {
		t.Fatalf("%s: round trip: %v", what, err)
	}
}

// mustFail connects with options that must be refused; the error must
// say why (contain want) and must not contain a secret.
func mustFail(t *testing.T, what string, o ConnectOptions, want string, secrets ...string) {
	t.Helper()
	o.Timeout = 2 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := Connect(ctx, o)
	if err == nil {
		c.Close()
		t.Fatalf("%s: connected, want a refusal", what)
	}
	if !strings.Contains(strings.ToLower(err.Error()), want) {
		t.Errorf("%s: error %q does not say %q", what, err, want)
	}
	for _, s := range secrets {
		if s != "" && strings.Contains(err.Error(), s) {
			t.Errorf("%s: the error shows a secret: %q", what, err)
		}
	}
}

func TestAuthUserPassword(t *testing.T) {
	s := authServer(t, func(o *server.Options) { o.Username, o.Password = "fleet", "pa55-word-secret" })
	mustConnect(t, "user/password", ConnectOptions{URL: s.ClientURL(), User: "fleet", Password: "pa55-word-secret"})
	mustFail(t, "wrong password", ConnectOptions{URL: s.ClientURL(), User: "fleet", Password: "nope-secret"}, "authorization", "nope-secret")
	mustFail(t, "no credentials", ConnectOptions{URL: s.ClientURL()}, "authorization")
	// In the URL, as nats URLs allow; the error text redacts it.
	u := strings.Replace(s.ClientURL(), "nats://", "nats://fleet:wrong-url-secret@", 1)
	mustFail(t, "wrong password in the URL", ConnectOptions{URL: u}, "authorization", "wrong-url-secret")
	mustConnect(t, "user/password in the URL", ConnectOptions{URL: strings.Replace(s.ClientURL(), "nats://", "nats://fleet:pa55-word-secret@", 1)})
	// From the environment, as the worker and submit read it.
	t.Setenv("NATS_URL", s.ClientURL())
	t.Setenv("NATS_USER", "fleet")
	t.Setenv("NATS_PASSWORD", "pa55-word-secret")
	var o ConnectOptions
	o.FromEnv()
	mustConnect(t, "NATS_USER/NATS_PASSWORD", o)
}

func TestAuthToken(t *testing.T) {
	s := authServer(t, func(o *server.Options) { o.Authorization = "t0ken-secret" })
	mustConnect(t, "token", ConnectOptions{URL: s.ClientURL(), Token: "t0ken-secret"})
	mustFail(t, "wrong token", ConnectOptions{URL: s.ClientURL(), Token: "bad-token-secret"}, "authorization", "bad-token-secret")
	t.Setenv("NATS_TOKEN", "t0ken-secret")
	o := ConnectOptions{URL: s.ClientURL()}
	o.FromEnv()
	mustConnect(t, "NATS_TOKEN", o)
}

func TestAuthNKey(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	pub, _ := kp.PublicKey()
	seed, _ := kp.Seed()
	s := authServer(t, func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} })
	dir := t.TempDir()
	seedFile := filepath.Join(dir, "user.nk")
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, "nkey seed file", ConnectOptions{URL: s.ClientURL(), NKeySeedFile: seedFile})
	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	otherFile := filepath.Join(dir, "other.nk")
	if err := os.WriteFile(otherFile, otherSeed, 0o600); err != nil {
		t.Fatal(err)
	}
	mustFail(t, "unknown nkey", ConnectOptions{URL: s.ClientURL(), NKeySeedFile: otherFile}, "authorization", string(otherSeed))
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Connect(ctx, ConnectOptions{URL: s.ClientURL(), NKeySeedFile: filepath.Join(dir, "missing.nk")}); err == nil ||
		!strings.Contains(err.Error(), "nkey seed file") {
		t.Errorf("missing seed file: %v", err)
	}
	t.Setenv("NATS_NKEY", seedFile)
	o := ConnectOptions{URL: s.ClientURL()}
	o.FromEnv()
	mustConnect(t, "NATS_NKEY", o)
}

// TestAuthCreds runs the server in operator (JWT) mode and connects with a
// .creds file (user JWT + seed), as NGS/Synadia Cloud and nsc set-ups do.
func TestAuthCreds(t *testing.T) {
	okp, _ := nkeys.CreateOperator()
	opub, _ := okp.PublicKey()
	oc := jwt.NewOperatorClaims(opub)
	ojwt, err := oc.Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	op, err := jwt.DecodeOperatorClaims(ojwt)
	if err != nil {
		t.Fatal(err)
	}
	akp, _ := nkeys.CreateAccount()
	apub, _ := akp.PublicKey()
	ajwt, err := jwt.NewAccountClaims(apub).Encode(okp)
	if err != nil {
		t.Fatal(err)
	}
	ukp, _ := nkeys.CreateUser()
	upub, _ := ukp.PublicKey()
	uc := jwt.NewUserClaims(upub)
	uc.Name = "worker"
	ujwt, err := uc.Encode(akp)
	if err != nil {
		t.Fatal(err)
	}
	useed, _ := ukp.Seed()
	creds, err := jwt.FormatUserConfig(ujwt, useed)
	if err != nil {
		t.Fatal(err)
	}
	s := authServer(t, func(o *server.Options) {
		o.TrustedOperators = []*jwt.OperatorClaims{op}
		r := &server.MemAccResolver{}
		if err := r.Store(apub, ajwt); err != nil {
			t.Fatal(err)
		}
		o.AccountResolver = r
	})
	dir := t.TempDir()
	credsFile := filepath.Join(dir, "worker.creds")
	if err := os.WriteFile(credsFile, creds, 0o600); err != nil {
		t.Fatal(err)
	}
	mustConnect(t, "creds file", ConnectOptions{URL: s.ClientURL(), CredsFile: credsFile})
	// A user of an account the server does not know.
	bkp, _ := nkeys.CreateAccount()
	bjwt, _ := jwt.NewUserClaims(upub).Encode(bkp)
	bad, _ := jwt.FormatUserConfig(bjwt, useed)
	badFile := filepath.Join(dir, "bad.creds")
	if err := os.WriteFile(badFile, bad, 0o600); err != nil {
		t.Fatal(err)
	}
	mustFail(t, "creds of an unknown account", ConnectOptions{URL: s.ClientURL(), CredsFile: badFile}, "authorization", string(useed))
	mustFail(t, "no creds", ConnectOptions{URL: s.ClientURL()}, "authorization")
	t.Setenv("NATS_CREDS", credsFile)
	o := ConnectOptions{URL: s.ClientURL()}
	o.FromEnv()
	mustConnect(t, "NATS_CREDS", o)
}

// pki is a throw-away CA with a server and a client certificate.
type pki struct {
	dir                   string
	ca, cert, key         string // server
	clientCert, clientKey string
	caPool                *x509.CertPool
	serverTLS             tls.Certificate
	otherCert, otherKey   string // a client certificate from another CA
	otherCA               string
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

func newCA(t *testing.T, name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return cert, key, der
}

func issue(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, cn string, server bool, serial int64) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
		tmpl.DNSNames = []string{"localhost"}
	} else {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func newPKI(t *testing.T) *pki {
	t.Helper()
	p := &pki{dir: t.TempDir()}
	ca, caKey, caDER := newCA(t, "agentfleet test CA")
	p.ca = filepath.Join(p.dir, "ca.pem")
	writePEM(t, p.ca, "CERTIFICATE", caDER)
	p.caPool = x509.NewCertPool()
	p.caPool.AddCert(ca)
	write := func(name string, der []byte, key *ecdsa.PrivateKey) (string, string) {
		c, k := filepath.Join(p.dir, name+".pem"), filepath.Join(p.dir, name+"-key.pem")
		writePEM(t, c, "CERTIFICATE", der)
		kder, _ := x509.MarshalECPrivateKey(key)
		writePEM(t, k, "EC PRIVATE KEY", kder)
		return c, k
	}
	sder, skey := issue(t, ca, caKey, "nats-server", true, 2)
	p.cert, p.key = write("server", sder, skey)
	var err error
	if p.serverTLS, err = tls.LoadX509KeyPair(p.cert, p.key); err != nil {
		t.Fatal(err)
	}
	cder, ckey := issue(t, ca, caKey, "worker", false, 3)
	p.clientCert, p.clientKey = write("client", cder, ckey)
	other, otherKey, otherDER := newCA(t, "someone else's CA")
	p.otherCA = filepath.Join(p.dir, "other-ca.pem")
	writePEM(t, p.otherCA, "CERTIFICATE", otherDER)
	oder, okey := issue(t, other, otherKey, "worker", false, 4)
	p.otherCert, p.otherKey = write("other-client", oder, okey)
	return p
}

// TestAuthTLS: TLS with client certificates (mutual TLS): the client
// verifies the server against --tlsca and shows --tlscert/--tlskey; the
// server requires and verifies a client certificate of its CA.
func TestAuthTLS(t *testing.T) {
	p := newPKI(t)
	s := authServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify = true, true
		o.TLSTimeout = 2
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{p.serverTLS}, ClientCAs: p.caPool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
	})
	u := s.ClientURL()
	mustConnect(t, "mutual TLS", ConnectOptions{URL: u, TLSCA: p.ca, TLSCert: p.clientCert, TLSKey: p.clientKey})
	mustConnect(t, "mutual TLS, tls:// URL", ConnectOptions{URL: strings.Replace(u, "nats://", "tls://", 1),
		TLSCA: p.ca, TLSCert: p.clientCert, TLSKey: p.clientKey})
	mustFail(t, "no client certificate", ConnectOptions{URL: u, TLSCA: p.ca}, "")
	mustFail(t, "client certificate of another CA", ConnectOptions{URL: u, TLSCA: p.ca, TLSCert: p.otherCert, TLSKey: p.otherKey}, "")
	mustFail(t, "server not trusted (wrong CA)", ConnectOptions{URL: u, TLSCA: p.otherCA, TLSCert: p.clientCert, TLSKey: p.clientKey}, "certificate")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Connect(ctx, ConnectOptions{URL: u, TLSCA: p.ca, TLSCert: p.clientCert}); err == nil ||
		!strings.Contains(err.Error(), "both a certificate and a key") {
		t.Errorf("certificate without key: %v", err)
	}
	t.Setenv("NATS_CA", p.ca)
	t.Setenv("NATS_CERT", p.clientCert)
	t.Setenv("NATS_KEY", p.clientKey)
	o := ConnectOptions{URL: u}
	o.FromEnv()
	mustConnect(t, "NATS_CA/NATS_CERT/NATS_KEY", o)
}

// TestAuthTLSMapsCertificateToUser: with verify_and_map the certificate's
// identity is the NATS user, so permissions follow the certificate.
func TestAuthTLSMapsCertificateToUser(t *testing.T) {
	t.Parallel()
	p := newPKI(t)
	s := authServer(t, func(o *server.Options) {
		o.TLS, o.TLSVerify, o.TLSMap = true, true, true
		o.TLSTimeout = 2
		o.TLSConfig = &tls.Config{Certificates: []tls.Certificate{p.serverTLS}, ClientCAs: p.caPool,
			ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12}
		o.Users = []*server.User{{Username: "CN=worker", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"agents.run.*.events"}}}}}
	})
	mustConnect(t, "certificate mapped to user CN=worker", ConnectOptions{URL: s.ClientURL(), TLSCA: p.ca, TLSCert: p.clientCert, TLSKey: p.clientKey})
}
