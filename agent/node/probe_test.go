package node

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/shoalnet/shoal/heartbeat"
)

func TestProbeTimeout(t *testing.T) {
	for _, tc := range []struct {
		name string
		cfg  heartbeat.Config
		want time.Duration
	}{
		{"defaults", heartbeat.Config{}.WithDefaults(), 375 * time.Millisecond}, // (12/2-1) x 75 ms
		{"fast profile", heartbeat.Config{Period: heartbeat.FastProfile.Period, Tolerance: heartbeat.FastProfile.Tolerance}, 100 * time.Millisecond},
		{"odd tolerance", heartbeat.Config{Period: 100 * time.Millisecond, Tolerance: 5}, 150 * time.Millisecond},
		{"tiny tolerance: half a period", heartbeat.Config{Period: 100 * time.Millisecond, Tolerance: 2}, 50 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := probeTimeout(tc.cfg); got != tc.want {
				t.Errorf("probeTimeout = %v, want %v", got, tc.want)
			}
			// It must end before the peer would be declared dead.
			if end := tc.cfg.Period*time.Duration(tc.cfg.Tolerance)/2 + probeTimeout(tc.cfg); end >= tc.cfg.Period*time.Duration(tc.cfg.Tolerance) {
				t.Errorf("a probe may end at %v, not before death at T periods", end)
			}
		})
	}
}

// fakeChecks answers probes per address: "alive", "dead", or "hang" (until
// the probe's deadline, as a dial to a host that does not answer). It records every call and each one's deadline.
type fakeChecks struct {
	mu        sync.Mutex
	calls     map[string]int
	deadlines map[string]time.Duration
}

func (f *fakeChecks) check(ctx context.Context, api string) heartbeat.ProbeResult {
	f.mu.Lock()
	f.calls[api]++
	if d, ok := ctx.Deadline(); ok {
		f.deadlines[api] = time.Until(d)
	}
	f.mu.Unlock()
	switch api {
	case "alive":
		return heartbeat.ProbeAlive
	case "hang":
		<-ctx.Done()
		return heartbeat.ProbeSilent
	}
	return heartbeat.ProbeGone
}

func (f *fakeChecks) callsTo(api string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[api]
}

func newFakeChecks() *fakeChecks {
	return &fakeChecks{calls: map[string]int{}, deadlines: map[string]time.Duration{}}
}

// TestProber drives the prober as the membership loop does: suspects in,
// answers out, one probe per peer at a time, none without an address.
func TestProber(t *testing.T) {
	f := newFakeChecks()
	p := newProber(f.check)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); p.wait() })
	addrs := map[uint32]string{1: "alive", 2: "dead", 3: "hang", 5: ""}
	apiAddr := func(id uint32) string { return addrs[id] }
	const timeout = 100 * time.Millisecond

	start := time.Now()
	p.start(ctx, []uint32{1, 2, 3, 4, 5}, timeout, apiAddr)
	p.start(ctx, []uint32{1, 2, 3, 4, 5}, timeout, apiAddr) // all in flight: nothing new
	got := map[uint32]heartbeat.ProbeResult{}
	deadline := time.After(5 * time.Second)
	for len(got) < 3 {
		select {
		case r := <-p.results:
			if _, dup := got[r.id]; dup {
				t.Fatalf("two answers for peer %d", r.id)
			}
			got[r.id] = r.result
			p.done(r)
		case <-deadline:
			t.Fatalf("answers after 5 s: %v, want peers 1-3", got)
		}
	}
	if took := time.Since(start); took > timeout+time.Second {
		t.Errorf("hanging probes answered after %v, want about %v", took, timeout)
	}
	want := map[uint32]heartbeat.ProbeResult{1: heartbeat.ProbeAlive, 2: heartbeat.ProbeGone, 3: heartbeat.ProbeSilent}
	for id, r := range want {
		if got[id] != r {
			t.Errorf("peer %d: probe result %v, want %v", id, got[id], r)
		}
	}
	for _, api := range []string{"alive", "dead", "hang"} {
		if n := f.callsTo(api); n != 1 {
			t.Errorf("%s probed %d times, want 1 (one probe per peer at a time)", api, n)
		}
		if d := f.deadlines[api]; d <= 0 || d > timeout {
			t.Errorf("%s: probe deadline %v away, want within %v", api, d, timeout)
		}
	}
	if n := f.callsTo(""); n != 0 {
		t.Errorf("a peer without an API address was probed %d times", n)
	}

	// Answered: the next start probes again.
	p.start(ctx, []uint32{1}, timeout, apiAddr)
	select {
	case r := <-p.results:
		p.done(r)
		if r.id != 1 || r.result != heartbeat.ProbeAlive {
			t.Errorf("second probe: %+v, want peer 1 alive", r)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no answer to the second probe")
	}
	if n := f.callsTo("alive"); n != 2 {
		t.Errorf("alive probed %d times, want 2", n)
	}
}

// TestProberStops: cancelling the probes' context ends a probe still
// running, and its answer is not delivered.
func TestProberStops(t *testing.T) {
	f := newFakeChecks()
	p := newProber(f.check)
	ctx, cancel := context.WithCancel(context.Background())
	p.start(ctx, []uint32{3}, time.Minute, func(uint32) string { return "hang" })
	for until := time.Now().Add(5 * time.Second); f.callsTo("hang") == 0; time.Sleep(time.Millisecond) {
		if time.Now().After(until) {
			t.Fatal("the probe did not start")
		}
	}
	cancel()
	done := make(chan struct{})
	go func() { p.wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("wait did not return after cancel")
	}
	select {
	case r := <-p.results:
		// The probe may have won the race with cancel and answered; it
		// must then say not alive (the peer never answered).
		if r.result == heartbeat.ProbeAlive {
			t.Errorf("a cancelled probe answered alive: %+v", r)
		}
	default:
	}
}

// TestProberBounded: at most maxProbes probes run at a time; the other
// suspects are probed as those answer.
func TestProberBounded(t *testing.T) {
	f := newFakeChecks()
	p := newProber(f.check)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() { cancel(); p.wait() })
	var suspects []uint32
	for id := uint32(1); id <= 3*maxProbes; id++ {
		suspects = append(suspects, id)
	}
	apiAddr := func(uint32) string { return "hang" }
	const timeout = 200 * time.Millisecond
	p.start(ctx, suspects, timeout, apiAddr)
	p.start(ctx, suspects, timeout, apiAddr)
	time.Sleep(timeout / 2)
	if n := f.callsTo("hang"); n != maxProbes {
		t.Fatalf("%d probes started for %d suspects, want %d at a time", n, len(suspects), maxProbes)
	}
	for answered := 0; answered < len(suspects); answered++ {
		select {
		case r := <-p.results:
			p.done(r)
			p.start(ctx, suspects, timeout, apiAddr)
		case <-time.After(5 * time.Second):
			t.Fatalf("%d of %d suspects answered", answered, len(suspects))
		}
		if len(p.busy) > maxProbes {
			t.Fatalf("%d probes in flight, want at most %d", len(p.busy), maxProbes)
		}
	}
}
