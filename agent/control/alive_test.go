package control

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalnet/shoal/heartbeat"
)

// tlsPeer serves h over TLS on loopback and returns its address and a
// client trusting it, without keep-alives as the agent's probe client.
func tlsPeer(t *testing.T, h http.Handler) (string, *http.Client) {
	t.Helper()
	ts := httptest.NewTLSServer(h)
	t.Cleanup(ts.Close)
	c := ts.Client()
	c.Transport.(*http.Transport).DisableKeepAlives = true
	return ts.Listener.Addr().String(), c
}

// TestPeerAPICheck probes real sockets on loopback: a live node, a plugged
// one, one whose API is gone, one that accepts TCP and then says nothing,
// and a peer of an older release without the endpoint.
func TestPeerAPICheck(t *testing.T) {
	const timeout = 200 * time.Millisecond
	_, client := tlsPeer(t, http.NotFoundHandler()) // any TLS server's client will do for the raw cases
	mux := func(plugged bool) http.Handler {
		m := http.NewServeMux()
		m.Handle("GET "+PathAlive, AliveHandler(func() bool { return plugged }))
		return m
	}

	dead, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	deadAddr := dead.Addr().String()
	dead.Close()

	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var held sync.WaitGroup
	t.Cleanup(func() { silent.Close(); held.Wait() })
	held.Add(1)
	go func() {
		defer held.Done()
		var conns []net.Conn
		defer func() {
			for _, c := range conns {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept() // and never answer the handshake
			if err != nil {
				return
			}
			conns = append(conns, c)
		}
	}()

	for _, tc := range []struct {
		name   string
		addr   func() (string, *http.Client)
		want   heartbeat.ProbeResult
		within time.Duration
	}{
		{"alive", func() (string, *http.Client) { return tlsPeer(t, mux(false)) }, heartbeat.ProbeAlive, timeout},
		{"plugged: gone", func() (string, *http.Client) { return tlsPeer(t, mux(true)) }, heartbeat.ProbeGone, timeout},
		{"older peer without the endpoint", func() (string, *http.Client) { return tlsPeer(t, http.NotFoundHandler()) }, heartbeat.ProbeAlive, timeout},
		{"connection refused: gone", func() (string, *http.Client) { return deadAddr, client }, heartbeat.ProbeGone, timeout},
		{"accepts, never answers (stalled): silent", func() (string, *http.Client) { return silent.Addr().String(), client }, heartbeat.ProbeSilent, timeout + 300*time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			addr, c := tc.addr()
			ctx, cancel := context.WithTimeout(context.Background(), timeout)
			defer cancel()
			start := time.Now()
			got := PeerAPICheck(c)(ctx, addr)
			if took := time.Since(start); took > tc.within {
				t.Errorf("probe took %v, want at most %v", took, tc.within)
			}
			if got != tc.want {
				t.Errorf("probe result %v, want %v", got, tc.want)
			}
		})
	}
}

// TestPeerAPICheckKeptConnection: probes of one peer share a connection
// (one TLS handshake); once the peer's agent ends (its listener and
// connections closed), the next probe on that client finds it gone, as a
// fresh connection would.
func TestPeerAPICheckKeptConnection(t *testing.T) {
	m := http.NewServeMux()
	m.Handle("GET "+PathAlive, AliveHandler(func() bool { return false }))
	ts := httptest.NewUnstartedServer(m)
	var conns atomic.Int32
	ts.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			conns.Add(1)
		}
	}
	ts.StartTLS()
	t.Cleanup(ts.Close)
	c := ts.Client()
	c.Transport.(*http.Transport).MaxIdleConnsPerHost, c.Transport.(*http.Transport).IdleConnTimeout = 1, probeIdle
	addr := ts.Listener.Addr().String()
	probe := func() heartbeat.ProbeResult {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		defer cancel()
		return PeerAPICheck(c)(ctx, addr)
	}
	for i := range 3 {
		if got := probe(); got != heartbeat.ProbeAlive {
			t.Fatalf("probe %d: %v, want alive", i+1, got)
		}
	}
	if n := conns.Load(); n != 1 {
		t.Errorf("3 probes opened %d connections, want 1 (kept)", n)
	}
	ts.Close() // the agent ends: listener and connections closed
	if got := probe(); got != heartbeat.ProbeGone {
		t.Errorf("probe after the peer's agent ended: %v, want gone", got)
	}
}

func TestAliveHandler(t *testing.T) {
	for _, tc := range []struct {
		plugged bool
		code    int
	}{{false, http.StatusOK}, {true, http.StatusServiceUnavailable}} {
		w := httptest.NewRecorder()
		AliveHandler(func() bool { return tc.plugged }).ServeHTTP(w, httptest.NewRequest(http.MethodGet, PathAlive, nil))
		if w.Code != tc.code {
			t.Errorf("plugged %v: status %d, want %d", tc.plugged, w.Code, tc.code)
		}
		if tc.plugged && !strings.Contains(w.Body.String(), "plug") {
			t.Errorf("plugged: body %q does not say why", w.Body.String())
		}
	}
}
