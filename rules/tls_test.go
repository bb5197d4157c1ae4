package rules

import (
	"bytes"
	"crypto/tls"
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
	"github.com/shoalnet/shoal/peer"
)

var otherKey = bytes.Repeat([]byte{7}, peer.KeySize)

func testCerts(t testing.TB, name string, keys ...[]byte) *peer.Certs {
	t.Helper()
	c, err := peer.NewCerts(peer.TLSOptions{Name: name, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// operatorCA is an operator CA and the files of the certificates it issued.
type operatorCA struct {
	t   testing.TB
	dir string
	ca  *peer.CA
}

func newOperatorCA(t testing.TB) *operatorCA {
	t.Helper()
	ca, err := peer.CreateCA("test ca", time.Hour, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	o := &operatorCA{t: t, dir: t.TempDir(), ca: ca}
	o.write("ca.pem", peer.EncodeCertPEM(ca.Cert))
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
func (o *operatorCA) certs(name string) *peer.Certs {
	o.t.Helper()
	cert, key, err := o.ca.Issue(name, nil, time.Hour, time.Now())
	if err != nil {
		o.t.Fatal(err)
	}
	kp, err := peer.EncodeKeyPEM(key)
	if err != nil {
		o.t.Fatal(err)
	}
	c, err := peer.NewCerts(peer.TLSOptions{
		Name: name, CAFile: filepath.Join(o.dir, "ca.pem"),
		CertFile: o.write(name+".pem", peer.EncodeCertPEM(cert)), KeyFile: o.write(name+"-key.pem", kp),
	})
	if err != nil {
		o.t.Fatal(err)
	}
	return c
}

func TestRaftStreamRefuses(t *testing.T) {
	known := map[string]bool{"a": true, "b": true}
	refusals := peer.NewRefusals(slog.New(slog.DiscardHandler))
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
		expectNone(t, peer.RefuseHandshake)
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
		expectNone(t, peer.RefuseNotMember)
	})
	t.Run("unregistered address", func(t *testing.T) {
		d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP("127.0.0.9")}}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Skipf("cannot dial from 127.0.0.9: %v", err)
		}
		c.Close()
		expectNone(t, peer.RefuseAddress)
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
	state := peer.URL(n.apiAddr, pathState)
	get := func(c *http.Client) (int, error) {
		resp, err := c.Get(state)
		if err != nil {
			return 0, err
		}
		resp.Body.Close()
		return resp.StatusCode, nil
	}
	fromAddr := func(ip string, certs *peer.Certs) *http.Client {
		c := peer.NewClient(certs)
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
		{"member", peer.NewClient(testCerts(t, "n1", testKey)), http.StatusOK},
		{"plain HTTP", http.DefaultClient, 0},
		{"TLS without a client certificate", noCert, 0},
		{"other key", peer.NewClient(testCerts(t, "n1", otherKey)), 0},
		{"certificate of a stranger", peer.NewClient(testCerts(t, "mallory", testKey)), http.StatusForbidden},
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
	if n.store.cfg.Refusals.Count("peer", peer.RefuseNotMember) == 0 || n.store.cfg.Refusals.Count("peer", peer.RefuseAddress) == 0 {
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
	post := func(c *peer.Certs, path string, body []byte, forwardedAs string) int {
		req, _ := http.NewRequest(http.MethodPost, peer.URL(n1.apiAddr, path), bytes.NewReader(body))
		if forwardedAs != "" {
			req.Header.Set(headerForwarded, forwardedAs)
		}
		resp, err := peer.NewClient(c).Do(req)
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
		if n1.store.cfg.Refusals.Count("raft", peer.RefuseNotMember) == 0 {
			return errors.New("not yet")
		}
		return nil
	})
	// And the real join still works end to end for a node acting as itself.
	mustApply(t, n2, &PutVIP{VIP: vip1})
}
