//go:build linux

package filter

import (
	"errors"
	"os"
	"testing"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// loadXDP loads the program, or skips the test where that cannot work.
func loadXDP(tb testing.TB) *XDP {
	tb.Helper()
	if os.Geteuid() != 0 {
		tb.Skip("XDP tests need root (CAP_BPF, CAP_NET_ADMIN); CI runs them as root")
	}
	x, err := LoadXDP()
	if errors.Is(err, ebpf.ErrNotSupported) || errors.Is(err, unix.EPERM) {
		tb.Skipf("this kernel or sandbox cannot load the XDP program: %v", err)
	}
	if err != nil {
		tb.Fatalf("LoadXDP: %v", err)
	}
	tb.Cleanup(func() { x.Close() })
	return x
}

func TestLoadXDP(t *testing.T) {
	loadXDP(t)
}
