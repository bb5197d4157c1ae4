package heartbeat

import (
	"testing"
	"time"
)

// TestScaledTiming: the settings up to 16 nodes; past them a longer period
// and a shorter tolerance whose product, the silence before a death, is
// never shorter than the settings'; never below MinScaledTolerance.
func TestScaledTiming(t *testing.T) {
	for _, tc := range []struct {
		period time.Duration
		tol, n int
		wantP  time.Duration
		wantT  int
	}{
		{75 * time.Millisecond, 12, 3, 75 * time.Millisecond, 12},
		{75 * time.Millisecond, 12, 16, 75 * time.Millisecond, 12},
		{75 * time.Millisecond, 12, 17, 150 * time.Millisecond, 6},
		{75 * time.Millisecond, 12, 32, 150 * time.Millisecond, 6},
		{75 * time.Millisecond, 12, 33, 225 * time.Millisecond, 4},
		{75 * time.Millisecond, 12, 64, 225 * time.Millisecond, 4}, // k capped at 12/4
		{20 * time.Millisecond, 12, 64, 60 * time.Millisecond, 4},
		{100 * time.Millisecond, 10, 40, 200 * time.Millisecond, 5},
		{100 * time.Millisecond, 13, 40, 300 * time.Millisecond, 5}, // 1.5 s, not less than 1.3 s
		{200 * time.Millisecond, 5, 64, 200 * time.Millisecond, 5},  // too few periods to scale
		{75 * time.Millisecond, 12, 0, 75 * time.Millisecond, 12},
	} {
		p, tol := ScaledTiming(tc.period, tc.tol, tc.n)
		if p != tc.wantP || tol != tc.wantT {
			t.Errorf("ScaledTiming(%v, %d, %d) = %v, %d; want %v, %d", tc.period, tc.tol, tc.n, p, tol, tc.wantP, tc.wantT)
		}
		if time.Duration(tol)*p < time.Duration(tc.tol)*tc.period {
			t.Errorf("ScaledTiming(%v, %d, %d): death after %v, sooner than the settings' %v", tc.period, tc.tol, tc.n, time.Duration(tol)*p, time.Duration(tc.tol)*tc.period)
		}
	}
}
