package host

import (
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// TestHostRecord: the record keeps each sysctl's value before the first
// change (a restart after a crash sees the agent's own value and must not
// take it for the original), survives a reload, and disappears once
// nothing is left to undo.
func TestHostRecord(t *testing.T) {
	dir := t.TempDir()
	r, err := loadHostRecord(dir)
	if err != nil || !r.empty() {
		t.Fatalf("no file: %+v, %v; want an empty record", r, err)
	}
	ign := "/proc/sys/net/ipv4/conf/eth0/arp_ignore"
	vip1, vip2 := netip.MustParseAddr("198.18.0.100"), netip.MustParseAddr("198.18.0.7")
	for _, step := range []func() error{
		func() error { return r.addSysctl(ign, "0") },
		func() error { return r.addVIP(vip1) },
		func() error { return r.addVIP(vip2) },
		func() error { return r.addVIP(vip1) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	// The restarted agent reads the value it set itself.
	again, err := loadHostRecord(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := again.addSysctl(ign, "1"); err != nil {
		t.Fatal(err)
	}
	if v, ok := again.original(ign); !ok || v != "0" {
		t.Errorf("original of %s after a restart: %q %v, want 0", ign, v, ok)
	}
	if diff := cmp.Diff([]netip.Addr{vip2, vip1}, again.VIPs, cmpopts.EquateComparable(netip.Addr{})); diff != "" {
		t.Errorf("vips (-want +got):\n%s", diff)
	}
	if !again.hasVIP(vip1) || again.hasVIP(netip.MustParseAddr("198.18.0.8")) {
		t.Error("hasVIP wrong")
	}
	for _, step := range []func() error{
		func() error { return again.dropVIP(vip1) },
		func() error { return again.dropVIP(vip2) },
		func() error { return again.dropSysctl(ign) },
	} {
		if err := step(); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, hostRecordFile)); !os.IsNotExist(err) {
		t.Errorf("record left after everything was undone: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 0 {
		t.Errorf("files left in the data dir: %v", left)
	}
}

func TestHostRecordRefusesDamage(t *testing.T) {
	tests := []struct{ name, content, want string }{
		{"not json", "{", "unreadable"},
		{"any file", `{"sysctls":[{"path":"/etc/passwd","value":"x"}]}`, "not a sysctl"},
		{"climbs out", `{"sysctls":[{"path":"/proc/sys/net/ipv4/conf/../../../../etc/arp_ignore","value":"x"}]}`, "not a sysctl"},
		{"other sysctl", `{"sysctls":[{"path":"/proc/sys/net/ipv4/conf/eth0/forwarding","value":"1"}]}`, "not a sysctl"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if err := os.WriteFile(filepath.Join(dir, hostRecordFile), []byte(tc.content), 0o600); err != nil {
				t.Fatal(err)
			}
			if _, err := loadHostRecord(dir); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one saying %q", err, tc.want)
			}
		})
	}
}
