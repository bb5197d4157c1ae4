package health

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/config"
)

func TestHealthHysteresis(t *testing.T) {
	fail := errors.New("down")
	h := newHealthState(2, 3)
	if h.healthy {
		t.Fatal("a new health state is healthy, want sick until rise probes pass")
	}
	steps := []struct {
		err     error
		healthy bool
		changed bool
	}{
		{nil, false, false}, // one success is not enough to start
		{fail, false, false},
		{nil, false, false},
		{nil, true, true}, // rise (2) successes in a row
		{fail, true, false},
		{fail, true, false},
		{nil, true, false}, // a success resets the failure streak
		{fail, true, false},
		{fail, true, false},
		{fail, false, true}, // third failure in a row
		{nil, false, false},
		{fail, false, false},
		{nil, false, false},
		{nil, true, true}, // second success in a row
	}
	for i, s := range steps {
		changed := h.observe(s.err)
		if changed != s.changed || h.healthy != s.healthy {
			t.Fatalf("step %d: changed %v healthy %v, want %v %v", i, changed, h.healthy, s.changed, s.healthy)
		}
	}
}

func TestHealthCheckerHTTP(t *testing.T) {
	var sick atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if sick.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	}))
	defer srv.Close()
	hc := NewChecker(config.Health{URL: srv.URL, Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Fall: 2, Rise: 2})
	if hc.healthy.Load() {
		t.Fatal("healthy before any probe ran")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flips := make(chan bool, 10)
	go hc.Run(ctx, func(ok bool) { flips <- ok })
	if got := waitFlip(t, flips); !got || !hc.healthy.Load() {
		t.Fatal("first flip was to sick, want healthy once rise probes passed")
	}
	sick.Store(true)
	if got := waitFlip(t, flips); got {
		t.Fatal("first flip was to healthy, want sick")
	}
	sick.Store(false)
	if got := waitFlip(t, flips); !got {
		t.Fatal("second flip was to sick, want healthy")
	}
}

func TestHealthCheckerTCP(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	hc := NewChecker(config.Health{TCP: addr, Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Fall: 1, Rise: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flips := make(chan bool, 10)
	go hc.Run(ctx, func(ok bool) { flips <- ok })
	if got := waitFlip(t, flips); !got {
		t.Fatal("listening port: first flip was to sick, want healthy")
	}
	l.Close() // the application dies
	if got := waitFlip(t, flips); got || hc.healthy.Load() {
		t.Fatal("closed port still healthy")
	}
}

func waitFlip(t *testing.T, ch <-chan bool) bool {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		t.Fatal("health verdict did not change within 5s")
	}
	return false
}

// TestHealthCheckerStartsSick: with a probe, a node is sick until rise
// probes pass (a service that never listens never makes it healthy);
// without one, it is healthy at once.
func TestHealthCheckerStartsSick(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there
	hc := NewChecker(config.Health{TCP: addr, Interval: 10 * time.Millisecond, Timeout: 10 * time.Millisecond, Fall: 1, Rise: 1})
	ctx, cancel := context.WithCancel(context.Background())
	flips := make(chan bool, 10)
	done := make(chan struct{})
	go func() { defer close(done); hc.Run(ctx, func(ok bool) { flips <- ok }) }()
	deadline := time.Now().Add(200 * time.Millisecond)
	for time.Now().Before(deadline) {
		if hc.healthy.Load() {
			t.Fatal("healthy while nothing listens")
		}
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	<-done
	if len(flips) != 0 || hc.lastErr.Load().(string) == "" {
		t.Errorf("%d flips, last error %q; want none and the probe's error", len(flips), hc.lastErr.Load())
	}
	if !NewChecker(config.Health{}).healthy.Load() {
		t.Error("no health check configured: sick, want healthy")
	}
}
