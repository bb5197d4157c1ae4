package host

// Tests of the host setup in network namespaces they create. Each runs its
// part that touches the host in a child process started inside the
// namespace (`ip netns exec`), so that every goroutine, socket and sysctl
// of the code under test is in the namespace, never in the host's.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/arp"
	"github.com/mdlayher/packet"
	"golang.org/x/time/rate"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

const (
	hostTestIf    = "shh0"         // the cluster interface in the test namespace
	hostTestPeer  = "shh1"         // its veth peer, where the test's ARP requests come from
	hostTestAsker = "198.18.250.1" // the first of the 90 addresses askARP asks from
)

var (
	hostVIP1    = netip.MustParseAddr("198.18.250.100")
	hostVIP2    = netip.MustParseAddr("198.18.250.101")
	hostVIP3    = netip.MustParseAddr("198.18.250.102")
	operatorVIP = "198.18.250.9/32" // on lo before the agent: not the agent's
)

// hostNamespace creates a namespace with lo up and a veth pair, removed
// when the test ends.
func hostNamespace(t *testing.T) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("host tests need root (network namespaces)")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("host tests need iproute2's ip")
	}
	var b [3]byte
	rand.Read(b[:])
	ns := "shoal-host-" + hex.EncodeToString(b[:])
	mustIP(t, "netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("remove namespace %s: %v: %s", ns, err, out)
		}
	})
	mustIP(t, "-n", ns, "link", "set", "lo", "up")
	addVeth(t, ns)
	return ns
}

func addVeth(t *testing.T, ns string) {
	t.Helper()
	mustIP(t, "-n", ns, "link", "add", hostTestIf, "type", "veth", "peer", "name", hostTestPeer)
	mustIP(t, "-n", ns, "link", "set", hostTestIf, "up")
	mustIP(t, "-n", ns, "link", "set", hostTestPeer, "up")
}

func mustIP(t *testing.T, args ...string) string {
	t.Helper()
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// nsHostState is what the agent may change in a namespace.
type nsHostState struct {
	LoAddrs                 []string
	ARPIgnore, ARPAnnounce  string
	DropUnicastInL2Multicst string
	Record                  bool
}

func readHostState(t *testing.T, ns, dataDir string) nsHostState {
	t.Helper()
	var st nsHostState
	for _, f := range strings.Fields(mustIP(t, "-n", ns, "-o", "addr", "show", "dev", "lo")) {
		if strings.Contains(f, "/") {
			st.LoAddrs = append(st.LoAddrs, f)
		}
	}
	slices.Sort(st.LoAddrs)
	sysctl := func(name string) string {
		out, err := exec.Command("ip", "netns", "exec", ns, "cat", sysctlPath(hostTestIf, name)).Output()
		if err != nil {
			t.Fatalf("read %s in %s: %v", name, ns, err)
		}
		return strings.TrimSpace(string(out))
	}
	st.ARPIgnore, st.ARPAnnounce, st.DropUnicastInL2Multicst = sysctl("arp_ignore"), sysctl("arp_announce"), sysctl("drop_unicast_in_l2_multicast")
	_, err := os.Stat(filepath.Join(dataDir, hostRecordFile))
	st.Record = err == nil
	return st
}

// hostChild is a child process that set the host up in a namespace and
// holds it until signalled.
type hostChild struct {
	cmd  *exec.Cmd
	done chan error
}

// startHostChild runs TestHostChild in ns with vips and waits until it
// has set the host up.
func startHostChild(t *testing.T, ns, dataDir string, vips ...netip.Addr) *hostChild {
	t.Helper()
	var list []string
	for _, v := range vips {
		list = append(list, v.String())
	}
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHostChild$", "-test.short", "-test.v")
	cmd.Env = append(os.Environ(), "SHOAL_HOST_CHILD="+dataDir, "SHOAL_HOST_CHILD_VIPS="+strings.Join(list, ","))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &hostChild{cmd: cmd, done: make(chan error, 1)}
	ready := make(chan struct{})
	var lines bytes.Buffer
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines.WriteString(sc.Text() + "\n")
			if sc.Text() == "host ready" {
				close(ready)
			}
		}
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() {
		cmd.Process.Kill() // only this child, by its PID; harmless once it exited
	})
	select {
	case <-ready:
	case err := <-c.done:
		t.Fatalf("host child exited before it was ready: %v\n%s%s", err, lines.String(), stderr.String())
	case <-time.After(20 * time.Second):
		t.Fatalf("host child not ready within 20s:\n%s%s", lines.String(), stderr.String())
	}
	return c
}

func (c *hostChild) signal(t *testing.T, sig syscall.Signal) error {
	t.Helper()
	if err := c.cmd.Process.Signal(sig); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-c.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("host child did not exit within 10s of %v", sig)
	}
	return nil
}

// TestHostChild is the child's side of TestHostCrashRecovery: it sets the
// host up, says so, and tears it down on SIGTERM. Skipped unless started
// by the parent.
func TestHostChild(t *testing.T) {
	dataDir := os.Getenv("SHOAL_HOST_CHILD")
	if dataDir == "" {
		t.Skip("run by TestHostCrashRecovery inside its namespace")
	}
	var vips []netip.Addr
	for _, s := range strings.Split(os.Getenv("SHOAL_HOST_CHILD_VIPS"), ",") {
		vips = append(vips, netip.MustParseAddr(s))
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	h, err := Setup(Config{Announcer: l2(nil, nil), Interface: hostTestIf, DataDir: dataDir, VIPs: vips})
	if err != nil {
		t.Fatal(err)
	}
	h.Start(ctx, func() {})
	fmt.Println("host ready")
	<-ctx.Done()
	if err := h.Teardown(); err != nil {
		t.Fatal(err)
	}
}

// TestHostCrashRecovery: an agent killed with SIGKILL leaves its VIPs and
// sysctls; the next one adopts them from the record (and repairs what the
// cluster changed meanwhile), and its SIGTERM leaves the host as it was
// before the first start: the operator's own address on lo kept, the
// original sysctls back (not the killed agent's values), the record gone.
// drop_unicast_in_l2_multicast stays set.
func TestHostCrashRecovery(t *testing.T) {
	type run struct {
		vips []netip.Addr
		sig  syscall.Signal
	}
	tests := []struct {
		name string
		runs []run
	}{
		{"clean stop", []run{{[]netip.Addr{hostVIP1}, syscall.SIGTERM}}},
		{"kill, restart, stop", []run{{[]netip.Addr{hostVIP1, hostVIP2}, syscall.SIGKILL}, {[]netip.Addr{hostVIP1, hostVIP2}, syscall.SIGTERM}}},
		{"kill, restart without a vip, stop", []run{{[]netip.Addr{hostVIP1, hostVIP2}, syscall.SIGKILL}, {[]netip.Addr{hostVIP2}, syscall.SIGTERM}}},
		{"ipv6: kill, restart without it, stop", []run{{[]netip.Addr{hostVIP1, hostVIP6}, syscall.SIGKILL}, {[]netip.Addr{hostVIP1}, syscall.SIGTERM}}},
		{"ipv6: kill, restart, stop", []run{{[]netip.Addr{hostVIP6}, syscall.SIGKILL}, {[]netip.Addr{hostVIP6, hostVIP2}, syscall.SIGTERM}}},
		{"killed twice", []run{{[]netip.Addr{hostVIP1}, syscall.SIGKILL}, {[]netip.Addr{hostVIP1, hostVIP2}, syscall.SIGKILL}, {[]netip.Addr{hostVIP1}, syscall.SIGTERM}}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ns := hostNamespace(t)
			dataDir := t.TempDir()
			mustIP(t, "-n", ns, "addr", "add", operatorVIP, "dev", "lo")
			// Originals that are not the defaults, so that restoring "0"
			// would not pass for restoring.
			if out, err := exec.Command("ip", "netns", "exec", ns, "sh", "-c", "echo 1 > "+sysctlPath(hostTestIf, "arp_announce")).CombinedOutput(); err != nil {
				t.Fatalf("%v: %s", err, out)
			}
			before := readHostState(t, ns, dataDir)
			for i, r := range tc.runs {
				c := startHostChild(t, ns, dataDir, r.vips...)
				st := readHostState(t, ns, dataDir)
				for _, v := range r.vips {
					if !slices.Contains(st.LoAddrs, netip.PrefixFrom(v, v.BitLen()).String()) {
						t.Errorf("run %d: vip %s not on lo: %v", i, v, st.LoAddrs)
					}
				}
				if len(st.LoAddrs) != len(before.LoAddrs)+len(r.vips) {
					t.Errorf("run %d: lo has %v, want %v and the vips %v", i, st.LoAddrs, before.LoAddrs, r.vips)
				}
				if st.ARPIgnore != "1" || st.ARPAnnounce != "2" || st.DropUnicastInL2Multicst != "1" || !st.Record {
					t.Errorf("run %d: running host %+v, want arp_ignore 1, arp_announce 2, drop_unicast_in_l2_multicast 1, a record", i, st)
				}
				err := c.signal(t, r.sig)
				if r.sig == syscall.SIGTERM && err != nil {
					t.Errorf("run %d: child failed: %v", i, err)
				}
			}
			want := before
			want.DropUnicastInL2Multicst = "1"
			if got := readHostState(t, ns, dataDir); !equalHostState(got, want) {
				t.Errorf("host after the last stop:\n got %+v\nwant %+v", got, want)
			}
		})
	}
}

func equalHostState(a, b nsHostState) bool {
	return slices.Equal(a.LoAddrs, b.LoAddrs) && a.ARPIgnore == b.ARPIgnore && a.ARPAnnounce == b.ARPAnnounce &&
		a.DropUnicastInL2Multicst == b.DropUnicastInL2Multicst && a.Record == b.Record
}

// TestHostLinkEvents runs TestHostLinkEventsInNamespace in a namespace of
// its own.
func TestHostLinkEvents(t *testing.T) {
	ns := hostNamespace(t)
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHostLinkEventsInNamespace$", "-test.short", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "SHOAL_HOST_LINK_TEST="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestHostLinkEventsInNamespace")) {
		t.Fatalf("in namespace: %v\n%s", err, out)
	}
	t.Logf("in namespace:\n%s", out)
}

// TestHostLinkEventsInNamespace: the host re-arms itself after link
// events: ARP is still answered after a link down and up; after a MAC
// change, replies come from the new MAC and the node is unhealthy until
// the data plane has it; on a recreated interface, the sysctls, ARP and XDP
// come back; VIPs follow the cluster's at runtime.
func TestHostLinkEventsInNamespace(t *testing.T) {
	dataDir := os.Getenv("SHOAL_HOST_LINK_TEST")
	if dataDir == "" {
		t.Skip("run by TestHostLinkEvents inside its namespace")
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	arpLimit, ndpLimit := rate.NewLimiter(1000, 200), rate.NewLimiter(1000, 200)
	h, err := Setup(Config{Announcer: l2(arpLimit, ndpLimit), Interface: hostTestIf, DataDir: dataDir, VIPs: []netip.Addr{hostVIP1, hostVIP6}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.Teardown(); err != nil {
			t.Error(err)
		}
	})
	xdp, err := filter.LoadXDP()
	if err != nil {
		t.Fatal(err)
	}
	defer xdp.Close()
	empty := filter.NewTables(&filter.Config{}, 1, nil, nil, nil)
	push := func() {
		if err := xdp.Update(empty, h.MAC()); err != nil {
			t.Error(err)
			return
		}
		h.Pushed(h.MAC())
	}
	push()
	if err := h.AttachXDP(xdp); err != nil {
		t.Fatal(err)
	}
	changes := make(chan struct{}, 16)
	h.Start(ctx, func() { changes <- struct{}{} })

	healthy := func() error {
		if ok, why := h.Healthy(); !ok {
			return fmt.Errorf("host unhealthy: %s", why)
		}
		return nil
	}
	answeredBy := func(vip netip.Addr, mac net.HardwareAddr) func() error {
		return func() error {
			src, err := askARP(vip, rules.MACMulticast)
			if err != nil {
				return err
			}
			if !bytes.Equal(src, mac) {
				return fmt.Errorf("reply for %s from %s, want %s", vip, src, mac)
			}
			return nil
		}
	}
	ifMAC := func() net.HardwareAddr {
		ifi, err := net.InterfaceByName(hostTestIf)
		if err != nil {
			t.Fatal(err)
		}
		return ifi.HardwareAddr
	}
	pollFor(t, 5*time.Second, "healthy at start", healthy)
	pollFor(t, 5*time.Second, "arp answered at start", answeredBy(hostVIP1, ifMAC()))
	pollFor(t, 5*time.Second, "ndp answered at start", answeredNDP(t, hostVIP6, ifMAC()))
	// At rest, with nothing wrong, the host polls nothing: it checks on
	// events only (one stray link event is allowed; a periodic check would
	// have run twice).
	before, rest := h.checks.Load(), 5*hostRecheck/2
	time.Sleep(rest)
	if n := h.checks.Load() - before; n > 1 {
		t.Errorf("%d host checks in %v at rest; want none", n, rest)
	}

	mustIP(t, "link", "set", "dev", hostTestIf, "down")
	mustIP(t, "link", "set", "dev", hostTestIf, "up")
	pollFor(t, 5*time.Second, "arp answered after link down and up", answeredBy(hostVIP1, ifMAC()))
	pollFor(t, 5*time.Second, "ndp answered after link down and up", answeredNDP(t, hostVIP6, ifMAC()))
	t.Logf("arp counters after the flap: %v", h.Counters()["arp"])

	newMAC := net.HardwareAddr{0x02, 0x5e, 0x10, 0x00, 0x00, 0x99}
	mustIP(t, "link", "set", "dev", hostTestIf, "address", newMAC.String())
	pollFor(t, 5*time.Second, "the agent told of the new mac", func() error {
		if !bytes.Equal(h.MAC(), newMAC) {
			return fmt.Errorf("host mac %s", h.MAC())
		}
		return nil
	})
	if err := healthy(); err == nil {
		t.Error("healthy while the data plane still rewrites to the old mac")
	}
	select {
	case <-changes:
	default:
		t.Error("mac changed without telling the agent")
	}
	push() // what the agent does when told
	pollFor(t, 5*time.Second, "healthy with the new mac pushed", healthy)
	pollFor(t, 5*time.Second, "arp replies from the new mac", answeredBy(hostVIP1, newMAC))
	pollFor(t, 5*time.Second, "ndp replies from the new mac", answeredNDP(t, hostVIP6, newMAC))

	mustIP(t, "link", "del", hostTestIf)
	pollFor(t, 5*time.Second, "unhealthy without the interface", func() error {
		if healthy() == nil {
			return fmt.Errorf("healthy")
		}
		return nil
	})
	mustIP(t, "link", "add", hostTestIf, "type", "veth", "peer", "name", hostTestPeer)
	mustIP(t, "link", "set", hostTestIf, "up")
	mustIP(t, "link", "set", hostTestPeer, "up")
	pollFor(t, 5*time.Second, "healthy on the recreated interface", func() error {
		if !bytes.Equal(h.MAC(), ifMAC()) {
			return fmt.Errorf("host mac %s, interface %s", h.MAC(), ifMAC())
		}
		push()
		return healthy()
	})
	pollFor(t, 5*time.Second, "arp answered on the recreated interface", answeredBy(hostVIP1, ifMAC()))
	pollFor(t, 5*time.Second, "ndp answered on the recreated interface", answeredNDP(t, hostVIP6, ifMAC()))
	if out := mustIP(t, "-6", "maddr", "show", "dev", hostTestIf); !strings.Contains(out, solicitedNode(hostVIP6).String()) {
		t.Errorf("solicited-node group not joined on the recreated interface:\n%s", out)
	}
	if m, err := filter.Attached(hostTestIf); err != nil || m == filter.AttachNone || m != h.xdp.Mode() {
		t.Errorf("data plane on the recreated interface: %q (%v), the host says %q", m, err, h.xdp.Mode())
	}
	for name, want := range map[string]string{"arp_ignore": "1", "arp_announce": "2", "drop_unicast_in_l2_multicast": "1"} {
		if b, _ := os.ReadFile(sysctlPath(hostTestIf, name)); strings.TrimSpace(string(b)) != want {
			t.Errorf("recreated interface: %s = %q, want %s", name, b, want)
		}
	}
	if b, _ := os.ReadFile(sysctl6Path(hostTestIf, "drop_unicast_in_l2_multicast")); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("recreated interface: ipv6 drop_unicast_in_l2_multicast = %q, want 1", b)
	}

	onLo := func(vip netip.Addr) bool {
		return strings.Contains(mustIP(t, "-4", "addr", "show", "dev", "lo"), " "+vip.String()+"/32")
	}
	h.SetVIPs([]netip.Addr{hostVIP1, hostVIP3, hostVIP6}, "")
	h.SetVIPs([]netip.Addr{hostVIP1, hostVIP3, hostVIP6}, "") // again: changes nothing
	pollFor(t, 5*time.Second, "a vip added at runtime answered", answeredBy(hostVIP3, ifMAC()))
	if !onLo(hostVIP3) {
		t.Error("vip added at runtime not on lo")
	}
	mustIP(t, "addr", "del", hostVIP3.String()+"/32", "dev", "lo") // by hand: the host puts it back
	pollFor(t, 5*time.Second, "a vip taken off lo put back", func() error {
		if !onLo(hostVIP3) {
			return fmt.Errorf("%s not on lo", hostVIP3)
		}
		return nil
	})
	h.SetVIPs([]netip.Addr{hostVIP3}, "")
	pollFor(t, 5*time.Second, "a removed vip off lo", func() error {
		if onLo(hostVIP1) {
			return fmt.Errorf("%s still on lo", hostVIP1)
		}
		if strings.Contains(mustIP(t, "-6", "addr", "show", "dev", "lo"), hostVIP6.String()) {
			return fmt.Errorf("%s still on lo", hostVIP6)
		}
		return nil
	})
	if nas := solicit(t, "", hostVIP6, 300*time.Millisecond); len(nas) != 0 {
		t.Errorf("ndp still answered for the removed vip %s: %v", hostVIP6, nas)
	}
	if out := mustIP(t, "-6", "maddr", "show", "dev", hostTestIf); strings.Contains(out, solicitedNode(hostVIP6).String()) {
		t.Errorf("solicited-node group of the removed vip still joined:\n%s", out)
	}
	if _, err := askARP(hostVIP1, rules.MACMulticast); err == nil {
		t.Errorf("arp still answered for the removed vip %s", hostVIP1)
	}
	rec, err := loadHostRecord(dataDir)
	if err != nil || !slices.Equal(rec.VIPs, []netip.Addr{hostVIP3}) {
		t.Errorf("record vips %v (%v), want [%s]", rec.VIPs, err, hostVIP3)
	}

	// igmp mode at runtime: ARP answers with the group's MAC, the
	// interface joined the group (so the kernel answers IGMP queries) and
	// holds the new MAC, not the old one; back to multicast undoes it.
	maddr := func() string { return mustIP(t, "maddr", "show", "dev", hostTestIf) }
	igmpMAC, group := ClusterMAC(hostVIP3, rules.MACIGMP).String(), rules.IGMPGroup(hostVIP3).String()
	mcastMAC := ClusterMAC(hostVIP3, rules.MACMulticast).String()
	mld, mldMAC := rules.IGMPGroup(hostVIP6).String(), ClusterMAC(hostVIP6, rules.MACIGMP).String()
	h.SetVIPs([]netip.Addr{hostVIP3, hostVIP6}, rules.MACIGMP)
	pollFor(t, 5*time.Second, "igmp mode: arp answers with the group's mac", func() error {
		_, err := askARP(hostVIP3, rules.MACIGMP)
		return err
	})
	pollFor(t, 5*time.Second, "igmp mode: ndp answers with the mld group's mac", answeredNDPIn(t, hostVIP6, ifMAC(), rules.MACIGMP))
	pollFor(t, 5*time.Second, "igmp mode: groups and macs on the interface", func() error {
		m := maddr()
		for _, want := range []string{"inet  " + group, "inet6 " + mld, igmpMAC, mldMAC} {
			if !strings.Contains(m, want) {
				return fmt.Errorf("want %s:\n%s", want, m)
			}
		}
		if strings.Contains(m, mcastMAC) {
			return fmt.Errorf("want no %s:\n%s", mcastMAC, m)
		}
		return nil
	})
	h.SetVIPs([]netip.Addr{hostVIP3}, rules.MACMulticast)
	pollFor(t, 5*time.Second, "back to multicast mode", func() error {
		if _, err := askARP(hostVIP3, rules.MACMulticast); err != nil {
			return err
		}
		if m := maddr(); strings.Contains(m, group) || strings.Contains(m, igmpMAC) || strings.Contains(m, mld) || !strings.Contains(m, mcastMAC) {
			return fmt.Errorf("want %s only:\n%s", mcastMAC, m)
		}
		return nil
	})

	// Over the reply rate, requests are counted and not answered.
	limited := h.Counters()["arp"]["rate_limited"]
	arpLimit.SetBurst(0)
	arpLimit.SetLimit(0)
	if _, err := askARP(hostVIP3, rules.MACMulticast); err == nil {
		t.Error("arp answered with no reply allowed by the rate limit")
	}
	if got := h.Counters()["arp"]["rate_limited"]; got != limited+1 {
		t.Errorf("rate_limited %d, want %d", got, limited+1)
	}
	h.SetVIPs([]netip.Addr{hostVIP3, hostVIP6}, "")
	pollFor(t, 5*time.Second, "an ipv6 vip added at runtime answered", answeredNDP(t, hostVIP6, ifMAC()))
	limited6 := h.Counters()["ndp"]["rate_limited"]
	ndpLimit.SetBurst(0)
	ndpLimit.SetLimit(0)
	if nas := solicit(t, "", hostVIP6, 300*time.Millisecond); len(nas) != 0 {
		t.Errorf("ndp answered with no reply allowed by the rate limit: %v", nas)
	}
	if got := h.Counters()["ndp"]["rate_limited"]; got != limited6+1 {
		t.Errorf("ndp rate_limited %d, want %d", got, limited6+1)
	}
}

func pollFor(t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, timeout, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// askARP asks, from the veth peer, who has vip, and returns the Ethernet
// source of the reply; the reply must carry the cluster MAC of mode.
// askers numbers askARP's requests.
var askers atomic.Uint32

func askARP(vip netip.Addr, mode rules.MACMode) (net.HardwareAddr, error) {
	ifi, err := net.InterfaceByName(hostTestPeer)
	if err != nil {
		return nil, err
	}
	c, err := packet.Listen(ifi, packet.Raw, etherTypeARP, nil)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// Each request asks from an address of its own, and only a reply to it
	// counts. A reply the responder sent to an earlier request (when the
	// VIP was still answered) can reach this socket late under load: a
	// frame from veth waits in the backlog of the CPU that sent it, and a
	// starved CPU delivers its backlog after the other's. That was the
	// flake "arp still answered for the removed vip".
	a4 := netip.MustParseAddr(hostTestAsker).As4()
	a4[3] += byte(askers.Add(1) % 90)
	asker := netip.AddrFrom4(a4)
	req, err := arp.NewPacket(arp.OperationRequest, ifi.HardwareAddr, asker, net.HardwareAddr{0, 0, 0, 0, 0, 0}, vip)
	if err != nil {
		return nil, err
	}
	if _, err := c.WriteTo(ethernetFrame(broadcastMAC, ifi.HardwareAddr, req), &packet.Addr{HardwareAddr: broadcastMAC}); err != nil {
		return nil, err
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 1600)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return nil, fmt.Errorf("no arp reply for %s: %w", vip, err)
		}
		var p arp.Packet
		if n < ethHeaderLen || p.UnmarshalBinary(buf[ethHeaderLen:n]) != nil || p.Operation != arp.OperationReply || p.TargetIP != asker || p.SenderIP != vip {
			continue
		}
		if !bytes.Equal(p.SenderHardwareAddr, ClusterMAC(vip, mode)) {
			return nil, fmt.Errorf("reply says %s is at %s, want the %s mode's cluster mac %s", vip, p.SenderHardwareAddr, mode, ClusterMAC(vip, mode))
		}
		return slices.Clone(net.HardwareAddr(buf[6:12])), nil
	}
}
