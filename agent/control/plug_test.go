package control

import (
	"testing"
	"time"
)

func TestPlugRestoresItself(t *testing.T) {
	restored := make(chan time.Duration, 4)
	restore := func(after time.Duration) { restored <- after }
	expect := func(t *testing.T, want time.Duration) {
		t.Helper()
		select {
		case got := <-restored:
			if got != want {
				t.Errorf("restored after %v, want %v", got, want)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the plug was not restored")
		}
	}
	expectNone := func(t *testing.T, wait time.Duration) {
		t.Helper()
		select {
		case got := <-restored:
			t.Errorf("restored (after %v), want nothing", got)
		case <-time.After(wait):
		}
	}

	t.Run("restores after the time asked", func(t *testing.T) {
		var p PlugRestorer
		p.Arm(PlugRequest{Pulled: true, RestoreAfter: 20 * time.Millisecond}, restore)
		expect(t, 20*time.Millisecond)
	})
	t.Run("a put-back plug is not restored again", func(t *testing.T) {
		var p PlugRestorer
		p.Arm(PlugRequest{Pulled: true, RestoreAfter: 30 * time.Millisecond}, restore)
		p.Arm(PlugRequest{Pulled: false}, restore)
		expectNone(t, 100*time.Millisecond)
	})
	t.Run("a second pull re-arms", func(t *testing.T) {
		var p PlugRestorer
		p.Arm(PlugRequest{Pulled: true, RestoreAfter: 30 * time.Millisecond}, restore)
		p.Arm(PlugRequest{Pulled: true, RestoreAfter: 60 * time.Millisecond}, restore)
		expect(t, 60*time.Millisecond)
		expectNone(t, 60*time.Millisecond)
	})
}

func TestPlugPullIsBounded(t *testing.T) {
	for _, tc := range []struct {
		ask, want time.Duration
	}{
		{0, MaxPlugPull},
		{-time.Second, MaxPlugPull},
		{5 * time.Second, 5 * time.Second},
		{time.Hour, MaxPlugPull},
	} {
		if got := restoreAfter(PlugRequest{Pulled: true, RestoreAfter: tc.ask}); got != tc.want {
			t.Errorf("restoreAfter(%v) = %v, want %v", tc.ask, got, tc.want)
		}
	}
}
