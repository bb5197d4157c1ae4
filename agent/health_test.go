package agent

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

func TestHealthHysteresis(t *testing.T) {
	fail := errors.New("down")
	h := newHealthState(2, 3)
	steps := []struct {
		err     error
		healthy bool
		changed bool
	}{
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
	hc := newHealthChecker(HealthConfig{URL: srv.URL, Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Fall: 2, Rise: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flips := make(chan bool, 10)
	go hc.run(ctx, func(ok bool) { flips <- ok })
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
	hc := newHealthChecker(HealthConfig{TCP: addr, Interval: 50 * time.Millisecond, Timeout: 40 * time.Millisecond, Fall: 1, Rise: 1})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	flips := make(chan bool, 10)
	go hc.run(ctx, func(ok bool) { flips <- ok })
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
