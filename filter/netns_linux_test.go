//go:build linux

package filter

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/vishvananda/netns"
)

var nsCounter atomic.Int32

// uniqueName returns a name no other test (or test process) uses, short
// enough for an interface name.
func uniqueName(prefix string) string {
	return fmt.Sprintf("%s%d%c", prefix, os.Getpid()%100000, 'a'+rune(nsCounter.Add(1)%26))
}

// newNetns creates a network namespace with lo up, removed at cleanup.
func newNetns(t testing.TB) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("namespace tests need root; CI runs them as root")
	}
	name := uniqueName("shf")
	run(t, "ip", "netns", "add", name)
	t.Cleanup(func() { exec.Command("ip", "netns", "del", name).Run() })
	run(t, "ip", "-n", name, "link", "set", "lo", "up")
	return name
}

// enterNetns moves the calling goroutine, locked to its thread, into
// namespace name for the rest of the test. The thread is never unlocked,
// so the runtime discards it when the test's goroutine ends and no other
// goroutine ever runs in the namespace by accident.
func enterNetns(t testing.TB, name string) {
	t.Helper()
	runtime.LockOSThread()
	h, err := netns.GetFromName(name)
	if err != nil {
		t.Fatalf("open netns %s: %v", name, err)
	}
	defer h.Close()
	if err := netns.Set(h); err != nil {
		t.Fatalf("enter netns %s: %v", name, err)
	}
}

// enterNetnsWith makes a namespace (newNetns) whose lo holds addrs (IPv4
// as /32, IPv6 as /128 without duplicate address detection), enters it
// (enterNetns) and returns its name.
func enterNetnsWith(t testing.TB, addrs ...netip.Addr) string {
	t.Helper()
	ns := newNetns(t)
	for _, a := range addrs {
		if a.Is4() {
			run(t, "ip", "-n", ns, "addr", "add", a.String()+"/32", "dev", "lo")
		} else {
			run(t, "ip", "-n", ns, "addr", "add", a.String()+"/128", "dev", "lo", "nodad")
		}
	}
	enterNetns(t, ns)
	return ns
}

func run(t testing.TB, args ...string) string {
	t.Helper()
	out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}
