package peer

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

var otherKey = bytes.Repeat([]byte{7}, KeySize)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func testCerts(t testing.TB, name string, keys ...[]byte) *Certs {
	t.Helper()
	c, err := NewCerts(TLSOptions{Name: name, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// operatorCA is an operator CA and the files of the certificates it issued.
type operatorCA struct {
	t   testing.TB
	dir string
	ca  *CA
}

func newOperatorCA(t testing.TB) *operatorCA {
	t.Helper()
	ca, err := CreateCA("test ca", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	o := &operatorCA{t: t, dir: t.TempDir(), ca: ca}
	o.write("ca.pem", EncodeCertPEM(ca.Cert))
	return o
}

func (o *operatorCA) write(name string, b []byte) string {
	p := filepath.Join(o.dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		o.t.Fatal(err)
	}
	return p
}

// certs issues a certificate for name and loads it as a node would.
func (o *operatorCA) certs(name string) *Certs {
	o.t.Helper()
	cert, key, err := o.ca.Issue(name, nil, time.Hour, time.Now())
	if err != nil {
		o.t.Fatal(err)
	}
	kp, err := EncodeKeyPEM(key)
	if err != nil {
		o.t.Fatal(err)
	}
	c, err := NewCerts(TLSOptions{
		Name: name, CAFile: filepath.Join(o.dir, "ca.pem"),
		CertFile: o.write(name+".pem", EncodeCertPEM(cert)), KeyFile: o.write(name+"-key.pem", kp),
	})
	if err != nil {
		o.t.Fatal(err)
	}
	return c
}

func TestDeriveCAIsTheSameEverywhere(t *testing.T) {
	a, _, err := DeriveCA(testKey)
	if err != nil {
		t.Fatal(err)
	}
	b, _, err := DeriveCA(bytes.Clone(testKey))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Raw, b.Raw) {
		t.Error("two derivations from one key gave different CA certificates")
	}
	c, _, err := DeriveCA(otherKey)
	if err != nil {
		t.Fatal(err)
	}
	if bytes.Equal(a.Raw, c.Raw) || a.Subject.CommonName == c.Subject.CommonName {
		t.Error("two keys gave the same CA")
	}
	if _, _, err := DeriveCA([]byte("short")); !errors.Is(err, ErrInvalid) {
		t.Errorf("a short key: %v, want ErrInvalid", err)
	}
}

// handshake runs a TLS handshake between a client and a server config over
// a pipe and returns the server's view of the client's name, or an error
// from either side.
func handshake(t *testing.T, client, server *tls.Config) (string, error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cc, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close(); sc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	srv := tls.Server(sc, server)
	errc := make(chan error, 1)
	go func() {
		err := srv.HandshakeContext(ctx)
		if err == nil {
			// A TLS 1.3 client finishes before the server has checked its
			// certificate; a read shows whether the server kept it.
			_, err = srv.Write([]byte{1})
		}
		errc <- err
	}()
	tc := tls.Client(cc, client)
	cerr := tc.HandshakeContext(ctx)
	if cerr == nil {
		_, cerr = tc.Read(make([]byte, 1))
	}
	serr := <-errc
	if err := errors.Join(cerr, serr); err != nil {
		return "", err
	}
	st := srv.ConnectionState()
	return Name(&st), nil
}

func TestCertsHandshake(t *testing.T) {
	op := newOperatorCA(t)
	op2 := newOperatorCA(t)
	noCert := &tls.Config{MinVersion: tls.VersionTLS13, InsecureSkipVerify: true}
	tls12 := testCerts(t, "old", testKey).ClientConfigForTest()
	tls12.MinVersion, tls12.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	tests := []struct {
		name           string
		client, server *tls.Config
		want           string // the client's name as the server sees it; "" = refused
	}{
		{"same key", testCerts(t, "a", testKey).ClientConfig(), testCerts(t, "b", testKey).ServerConfig(), "a"},
		{"other key", testCerts(t, "a", otherKey).ClientConfig(), testCerts(t, "b", testKey).ServerConfig(), ""},
		{"client without a certificate", noCert, testCerts(t, "b", testKey).ServerConfig(), ""},
		{"server of another cluster", testCerts(t, "a", testKey).ClientConfig(), testCerts(t, "b", otherKey).ServerConfig(), ""},
		{"TLS 1.2", tls12, testCerts(t, "b", testKey).ServerConfig(), ""},
		{"rotation: old primary, new also trusted", testCerts(t, "a", testKey, otherKey).ClientConfig(), testCerts(t, "b", otherKey, testKey).ServerConfig(), "a"},
		{"rotation: new primary, peer without it", testCerts(t, "a", otherKey, testKey).ClientConfig(), testCerts(t, "b", testKey).ServerConfig(), ""},
		{"operator CA", op.certs("a").ClientConfig(), op.certs("b").ServerConfig(), "a"},
		{"operator CA of another cluster", op2.certs("a").ClientConfig(), op.certs("b").ServerConfig(), ""},
		{"derived client, operator server", testCerts(t, "a", testKey).ClientConfig(), op.certs("b").ServerConfig(), ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := handshake(t, tc.client, tc.server)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("handshake succeeded as %q, want it refused", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("handshake: name %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}

// ClientConfigForTest is ClientConfig without its version floor, to try
// older versions against a server.
func (c *Certs) ClientConfigForTest() *tls.Config {
	cfg := c.ClientConfig()
	cfg.MinVersion = 0
	return cfg
}

func TestOperatorCertMustNameTheNode(t *testing.T) {
	op := newOperatorCA(t)
	op.certs("a") // writes a.pem and a-key.pem
	_, err := NewCerts(TLSOptions{Name: "b", CAFile: filepath.Join(op.dir, "ca.pem"), CertFile: filepath.Join(op.dir, "a.pem"), KeyFile: filepath.Join(op.dir, "a-key.pem")})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), `for "a"`) {
		t.Errorf("node b with a's certificate: %v, want a clear ErrInvalid", err)
	}
	_, err = NewCerts(TLSOptions{Name: "a", CAFile: filepath.Join(op.dir, "ca.pem")})
	if !errors.Is(err, ErrInvalid) {
		t.Errorf("operator mode without cert and key: %v, want ErrInvalid", err)
	}
}

func TestDerivedLeafIsReissued(t *testing.T) {
	c := testCerts(t, "a", testKey)
	now := time.Now()
	c.now = func() time.Time { return now }
	first, err := c.certificate()
	if err != nil {
		t.Fatal(err)
	}
	now = now.Add(leafLifetime / 4)
	if again, _ := c.certificate(); again != first {
		t.Error("leaf reissued a quarter into its life")
	}
	now = now.Add(leafLifetime / 2)
	renewed, err := c.certificate()
	if err != nil {
		t.Fatal(err)
	}
	if renewed == first || !renewed.Leaf.NotAfter.After(first.Leaf.NotAfter) {
		t.Error("leaf not reissued past half its life")
	}
	if _, err := c.verify([]*x509.Certificate{renewed.Leaf}, x509.ExtKeyUsageServerAuth); err != nil {
		t.Errorf("the reissued leaf does not verify: %v", err)
	}
	now = first.Leaf.NotAfter.Add(time.Minute)
	if _, err := c.verify([]*x509.Certificate{first.Leaf}, x509.ExtKeyUsageServerAuth); err == nil {
		t.Error("an expired leaf verified")
	}
}
