package rules

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/raft"
)

var otherKey = bytes.Repeat([]byte{7}, KeySize)

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
	return PeerName(&st), nil
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

func TestRaftStreamRefuses(t *testing.T) {
	known := map[string]bool{"a": true, "b": true}
	refusals := NewRefusals(slog.New(slog.DiscardHandler))
	server, err := listenTLSStream(streamConfig{
		bind: "127.0.0.1:0", certs: testCerts(t, "b", testKey), refusals: refusals, log: slog.New(slog.DiscardHandler),
		admitAddr: func(a netip.Addr) bool { return a == netip.MustParseAddr("127.0.0.1") },
		admitName: func(n string) bool { return known[n] },
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Close() })
	addr := server.Addr().String()
	accepted := make(chan net.Conn, 8)
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	expectNone := func(t *testing.T, reason string) {
		t.Helper()
		poll(t, 5*time.Second, "refusal counted", func() error {
			if refusals.Count("raft", reason) == 0 {
				return errors.New("no " + reason + " refusal yet")
			}
			return nil
		})
		select {
		case c := <-accepted:
			c.Close()
			t.Fatal("raft accepted the connection")
		default:
		}
	}
	dialer := func(name string, key []byte) *tlsStream {
		return &tlsStream{certs: testCerts(t, name, key), admitName: func(string) bool { return true }}
	}

	t.Run("member", func(t *testing.T) {
		c, err := dialer("a", testKey).Dial(raft.ServerAddress(addr), time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte("append")); err != nil {
			t.Fatal(err)
		}
		select {
		case sc := <-accepted:
			defer sc.Close()
			got := make([]byte, 6)
			if _, err := io.ReadFull(sc, got); err != nil || string(got) != "append" {
				t.Errorf("server read %q, %v", got, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("server never accepted a member's connection")
		}
	})
	t.Run("other key", func(t *testing.T) {
		if c, err := dialer("a", otherKey).Dial(raft.ServerAddress(addr), time.Second); err == nil {
			// TLS 1.3 clients finish before the server checks them; the
			// server then closes.
			c.Write([]byte("append"))
			c.Close()
		}
		expectNone(t, RefuseHandshake)
	})
	t.Run("plain TCP junk", func(t *testing.T) {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.Write(bytes.Repeat([]byte("junk"), 1000))
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.ReadAll(c); err != nil && !errors.Is(err, net.ErrClosed) && !strings.Contains(err.Error(), "reset") {
			t.Fatalf("server kept a junk connection open: %v", err)
		}
	})
	t.Run("certificate of a stranger", func(t *testing.T) {
		if c, err := dialer("mallory", testKey).Dial(raft.ServerAddress(addr), time.Second); err == nil {
			c.Write([]byte("append"))
			c.Close()
		}
		expectNone(t, RefuseNotMember)
	})
	t.Run("unregistered address", func(t *testing.T) {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.9: %v", err)
		}
		c.Close()
		expectNone(t, RefuseAddress)
	})
	t.Run("dialer refuses a server it does not know", func(t *testing.T) {
		d := &tlsStream{certs: testCerts(t, "a", testKey), admitName: func(n string) bool { return n == "c" }}
		if c, err := d.Dial(raft.ServerAddress(addr), time.Second); !errors.Is(err, ErrAuth) {
			if c != nil {
				c.Close()
			}
			t.Fatalf("dial a server named b when only c is known: %v, want ErrAuth", err)
		}
	})
}

// TestPeerAPIRefuses checks who the peer API answers: members over mutual
// TLS from their addresses; joins from anyone holding a certificate of the
// cluster; nobody else.
func TestPeerAPIRefuses(t *testing.T) {
	nodes := newCluster(t, 1)
	n := nodes[0]
	state := PeerURL(n.apiAddr, pathState)
	get := func(c *http.Client) (int, error) {
		resp, err := c.Get(state)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	fromAddr := func(ip string, certs *Certs) *http.Client {
		c := NewPeerClient(certs)
		tr := c.Transport.(*http.Transport)
		tr.DialContext = (&net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}).DialContext
		return c
	}
	noCert := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}}
	tests := []struct {
		name   string
		client *http.Client
		want   int // 0: the connection fails
	}{
		{"member", NewPeerClient(testCerts(t, "n1", testKey)), http.StatusOK},
		{"plain HTTP", http.DefaultClient, 0},
		{"TLS without a client certificate", noCert, 0},
		{"other key", NewPeerClient(testCerts(t, "n1", otherKey)), 0},
		{"certificate of a stranger", NewPeerClient(testCerts(t, "mallory", testKey)), http.StatusForbidden},
		{"member's certificate from another address", fromAddr("127.0.0.9", testCerts(t, "n1", testKey)), http.StatusForbidden},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.client
			if tc.name == "plain HTTP" {
				resp, err := c.Get(strings.Replace(state, "https://", "http://", 1))
				if err == nil {
					code := resp.StatusCode
					resp.Body.Close()
					if code == http.StatusOK {
						t.Fatalf("plain HTTP got %d", code)
					}
				}
				return
			}
			got, err := get(c)
			if tc.want == 0 {
				if err == nil {
					t.Fatalf("got %d, want the connection refused", got)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %d, %v; want %d", got, err, tc.want)
			}
		})
	}
	if n.store.cfg.Refusals.Count("peer", RefuseNotMember) == 0 || n.store.cfg.Refusals.Count("peer", RefuseAddress) == 0 {
		t.Errorf("refusals not counted: %v", n.store.cfg.Refusals.Counts())
	}
}

// TestOperatorCANodeActsOnlyAsItself: with an operator CA, the certificate
// of node A cannot join as B, forward on behalf of B, or talk Raft as a
// node that is not registered.
func TestOperatorCANodeActsOnlyAsItself(t *testing.T) {
	op := newOperatorCA(t)
	n1 := newTestNode(t, "n1")
	n1.certs = op.certs("n1")
	n1.start(true)
	n2 := newTestNode(t, "n2")
	n2.certs = op.certs("n2")
	n2.start(false)
	if _, err := n2.store.Join(testCtx(t, 10*time.Second), n1.apiAddr, NodeInfo{}); err != nil {
		t.Fatalf("n2 joins as itself: %v", err)
	}

	// n3 holds a certificate for n3 and tries to join as n4.
	n3 := op.certs("n3")
	me := NodeInfo{Name: "n4", HeartbeatAddr: "127.0.0.1:7946", RaftAddr: "127.0.0.1:1", APIAddr: "127.0.0.1:2"}
	body, _ := jsonBody(me)
	post := func(c *Certs, path string, body []byte, forwardedAs string) int {
		req, _ := http.NewRequest(http.MethodPost, PeerURL(n1.apiAddr, path), bytes.NewReader(body))
		if forwardedAs != "" {
			req.Header.Set(headerForwarded, forwardedAs)
		}
		resp, err := NewPeerClient(c).Do(req)
		if err != nil {
			t.Fatalf("post %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	if code := post(n3, pathJoin, body, ""); code != http.StatusForbidden {
		t.Errorf("n3's certificate joins as n4: %d, want 403", code)
	}
	data, _ := encodeEntry(&PutVIP{VIP: vip1}, 99)
	if code := post(op.certs("n2"), pathApply, data, "n1"); code != http.StatusForbidden {
		t.Errorf("n2's certificate forwards as n1: %d, want 403", code)
	}
	if code := post(n3, pathApply, data, "n3"); code != http.StatusForbidden {
		t.Errorf("unregistered n3 forwards a write: %d, want 403", code)
	}
	if st := n1.store.State(); st.NodeByName("n4") != nil || st.HasVIP(vip1) {
		t.Error("a refused request changed the state")
	}
	// Raft: n3's certificate is valid under the CA, but n3 is no member.
	d := &tlsStream{certs: n3, admitName: func(string) bool { return true }}
	if c, err := d.Dial(raft.ServerAddress(n1.raftAddr), time.Second); err == nil {
		c.Write([]byte("junk"))
		c.Close()
	}
	poll(t, 5*time.Second, "raft refusal counted", func() error {
		if n1.store.cfg.Refusals.Count("raft", RefuseNotMember) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	// And the real join still works end to end for a node acting as itself.
	mustApply(t, n2, &PutVIP{VIP: vip1})
}
