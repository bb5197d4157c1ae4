//go:build linux

package filter

import (
	"os"
	"testing"
)

// loadXDP loads the program, or skips the test where that cannot work.
func loadXDP(tb testing.TB) *XDP {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("XDP tests need root (CAP_BPF, CAP_NET_ADMIN); CI runs them as root")
	}
	x, err := LoadXDP()
	if err != nil {
		tb.Fatalf("LoadXDP: %v", err)
	}
	tb.Cleanup(func() { x.Close() })
	return x
}

func TestLoadXDP(t *testing.T) {
	loadXDP(t)
}
