package host

import (
	"bytes"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/rules"
)

// TestHostRestart: a host left for a restart keeps the VIPs on lo, the
// sysctls and the cluster MAC on the interface's multicast list (a device
// membership: the ARP socket's ends with it), recorded; the next host
// adopts them and drops the device membership once its socket holds its
// own; its teardown then leaves the host as it was.
func TestHostRestart(t *testing.T) {
	ns := hostNamespace(t)
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHostRestartInNamespace$", "-test.short", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "SHOAL_HOST_RESTART_TEST="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestHostRestartInNamespace")) {
		t.Fatalf("in namespace: %v\n%s", err, out)
	}
}

func TestHostRestartInNamespace(t *testing.T) {
	dataDir := os.Getenv("SHOAL_HOST_RESTART_TEST")
	if dataDir == "" {
		t.Skip("run by TestHostRestart inside its namespace")
	}
	mac := ClusterMAC(hostVIP1, rules.MACMulticast).String()
	inList := func() bool {
		out, err := exec.Command("ip", "maddr", "show", "dev", hostTestIf).CombinedOutput()
		if err != nil {
			t.Fatalf("ip maddr: %v: %s", err, out)
		}
		return strings.Contains(string(out), mac)
	}
	sysctl := func() string {
		b, _ := os.ReadFile(sysctlPath(hostTestIf, "arp_ignore"))
		return strings.TrimSpace(string(b))
	}
	onLo := func() bool {
		out, _ := exec.Command("ip", "-o", "addr", "show", "dev", "lo").CombinedOutput()
		return strings.Contains(string(out), hostVIP1.String()+"/32")
	}
	before := sysctl()
	h, err := Setup(Config{Announcer: l2(nil, nil), Interface: hostTestIf, DataDir: dataDir, VIPs: []netip.Addr{hostVIP1}})
	if err != nil {
		t.Fatal(err)
	}
	if !inList() {
		t.Fatalf("cluster mac %s not on the multicast list while the host runs", mac)
	}
	if err := h.Leave(); err != nil {
		t.Fatal(err)
	}
	if !inList() || !onLo() || sysctl() != "1" {
		t.Fatalf("left for a restart: mac listed %v, vip on lo %v, arp_ignore %s; want all kept", inList(), onLo(), sysctl())
	}
	rec, err := loadHostRecord(dataDir)
	if err != nil || len(rec.MACs) != 1 || rec.MACs[0] != mac {
		t.Fatalf("record after leave: %+v %v; want the mac recorded", rec, err)
	}

	h, err = Setup(Config{Announcer: l2(nil, nil), Interface: hostTestIf, DataDir: dataDir, VIPs: []netip.Addr{hostVIP1}})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := loadHostRecord(dataDir); err != nil || len(rec.MACs) != 0 {
		t.Errorf("record after the next start: %+v %v; want the kept macs dropped", rec, err)
	}
	if !inList() {
		t.Error("cluster mac not listed after the next start")
	}
	if err := h.Teardown(); err != nil {
		t.Fatal(err)
	}
	if inList() || onLo() || sysctl() != before {
		t.Errorf("after teardown: mac listed %v, vip on lo %v, arp_ignore %s (was %s); want the host as before", inList(), onLo(), sysctl(), before)
	}
	if _, err := os.Stat(rec.path); !os.IsNotExist(err) {
		t.Errorf("record still there after teardown: %v", err)
	}
}
