package host

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/mdlayher/ndp"
	"github.com/mdlayher/packet"

	"github.com/shoalnet/shoal/internal/netnstest"
	"github.com/shoalnet/shoal/rules"
)

var (
	hostVIP6    = netip.MustParseAddr("2001:db8:fa::100")
	hostAsker6  = netip.MustParseAddr("2001:db8:fa::1")
	hostNodeIP6 = netip.MustParseAddr("2001:db8:fa::11")
)

// clientNamespace moves the veth peer of the host namespace into a client
// namespace of its own, with IPv6 addresses on both ends (no duplicate
// address detection, so they are usable at once).
func clientNamespace(t *testing.T, hostNS string) string {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	ns := "shoal-v6c-" + hex.EncodeToString(b[:])
	mustIP(t, "netns", "add", ns)
	t.Cleanup(func() {
		if out, err := exec.Command("ip", "netns", "del", ns).CombinedOutput(); err != nil {
			t.Errorf("remove namespace %s: %v: %s", ns, err, out)
		}
	})
	mustIP(t, "-n", hostNS, "link", "set", hostTestPeer, "netns", ns)
	mustIP(t, "-n", ns, "link", "set", "lo", "up")
	mustIP(t, "-n", ns, "link", "set", hostTestPeer, "up")
	mustIP(t, "-n", ns, "addr", "add", hostAsker6.String()+"/64", "dev", hostTestPeer, "nodad")
	mustIP(t, "-n", hostNS, "addr", "add", hostNodeIP6.String()+"/64", "dev", hostTestIf, "nodad")
	return ns
}

// TestHostNDP: with an IPv6 VIP on lo, the host answers Neighbor
// Solicitations for it with the cluster MAC, from the interface's MAC, and
// the node's kernel does not answer them itself (the VIP is not on the
// interface), also with the VIP's solicited-node group joined; a Linux
// client takes the multicast target link-layer address into its neighbour
// table; on exit the group and the VIP are gone. Before the agent, the
// kernel does not answer for a VIP someone put on lo either.
func TestHostNDP(t *testing.T) {
	ns := hostNamespace(t)
	cns := clientNamespace(t, ns)
	ifMAC := func() net.HardwareAddr {
		var mac net.HardwareAddr
		netnstest.Do(t, ns, func() error {
			ifi, err := net.InterfaceByName(hostTestIf)
			if err == nil {
				mac = ifi.HardwareAddr
			}
			return err
		})
		return mac
	}()
	cmac := ClusterMAC(hostVIP6, rules.MACMulticast)

	// The kernel alone, with the VIP on lo: no answer.
	mustIP(t, "-n", ns, "addr", "add", hostVIP6.String()+"/128", "dev", "lo", "nodad")
	if nas := solicit(t, cns, hostVIP6, 500*time.Millisecond); len(nas) != 0 {
		t.Errorf("the kernel answered a solicitation for an address on lo: %v", nas)
	}
	mustIP(t, "-n", ns, "addr", "del", hostVIP6.String()+"/128", "dev", "lo")

	c := startHostChild(t, ns, t.TempDir(), hostVIP1, hostVIP6)
	if out := mustIP(t, "-n", ns, "-6", "maddr", "show", "dev", hostTestIf); !strings.Contains(out, solicitedNode(hostVIP6).String()) {
		t.Errorf("solicited-node group %s not joined on %s:\n%s", solicitedNode(hostVIP6), hostTestIf, out)
	}
	// Exactly one answer per solicitation: the responder's.
	for i := range 3 {
		nas := solicit(t, cns, hostVIP6, 500*time.Millisecond)
		if len(nas) != 1 {
			t.Fatalf("solicitation %d: %d advertisements, want the responder's alone: %v", i, len(nas), nas)
		}
		if na := nas[0]; !bytes.Equal(na.tlla, cmac) || !bytes.Equal(na.ethSrc, ifMAC) || !na.solicited {
			t.Errorf("advertisement %+v, want target link-layer address %s from %s, solicited", na, cmac, ifMAC)
		}
	}
	// A Linux client resolves the VIP to the cluster MAC.
	err := netnstest.Do(t, cns, func() error {
		conn, err := net.Dial("udp6", netip.AddrPortFrom(hostVIP6, 9).String())
		if err != nil {
			return err
		}
		defer conn.Close()
		_, err = conn.Write([]byte("x"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	pollFor(t, 3*time.Second, "the client's neighbour entry for the vip", func() error {
		out := mustIP(t, "-n", cns, "-6", "neigh", "show", hostVIP6.String(), "dev", hostTestPeer)
		if !strings.Contains(out, "lladdr "+cmac.String()) {
			return fmt.Errorf("ip -6 neigh: %q, want lladdr %s", strings.TrimSpace(out), cmac)
		}
		t.Logf("client: %s", strings.TrimSpace(out))
		return nil
	})
	if err := c.signal(t, syscall.SIGTERM); err != nil {
		t.Fatalf("host child: %v", err)
	}
	if out := mustIP(t, "-n", ns, "-6", "maddr", "show", "dev", hostTestIf); strings.Contains(out, solicitedNode(hostVIP6).String()) {
		t.Errorf("solicited-node group still joined after exit:\n%s", out)
	}
	if out := mustIP(t, "-n", ns, "-6", "addr", "show", "dev", "lo"); strings.Contains(out, hostVIP6.String()) {
		t.Errorf("ipv6 vip still on lo after exit:\n%s", out)
	}
	if nas := solicit(t, cns, hostVIP6, 300*time.Millisecond); len(nas) != 0 {
		t.Errorf("answered after exit: %v", nas)
	}
}

// seenNA is an advertisement the client saw.
type seenNA struct {
	ethSrc, tlla net.HardwareAddr
	solicited    bool
}

// solicit sends one Neighbor Solicitation for target from the veth peer in
// the client namespace cns ("": this one), to the target's solicited-node
// group as a resolving kernel does, and returns every advertisement for
// target that arrives within wait.
func solicit(t *testing.T, cns string, target netip.Addr, wait time.Duration) []seenNA {
	t.Helper()
	var conn *packet.Conn
	var ifi *net.Interface
	open := func() error {
		var err error
		if ifi, err = net.InterfaceByName(hostTestPeer); err != nil {
			return err
		}
		conn, err = packet.Listen(ifi, packet.Raw, etherTypeIPv6, nil)
		return err
	}
	var err error
	if cns == "" {
		err = open()
	} else {
		err = netnstest.Do(t, cns, open)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	f := solicitation(t, ifi.HardwareAddr, hostAsker6, solicitedNode(target), target, ifi.HardwareAddr)
	if _, err := conn.WriteTo(f, &packet.Addr{HardwareAddr: f[0:6]}); err != nil {
		t.Fatal(err)
	}
	var out []seenNA
	conn.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 1600)
	for {
		n, _, err := conn.ReadFrom(buf)
		if err != nil {
			return out
		}
		b := buf[:n]
		if n < ethHeaderLen+ipv6HeaderLen+4 || b[ethHeaderLen+6] != protoICMPv6 {
			continue
		}
		m, err := ndp.ParseMessage(b[ethHeaderLen+ipv6HeaderLen:])
		na, ok := m.(*ndp.NeighborAdvertisement)
		if err != nil || !ok || na.TargetAddress != target {
			continue
		}
		out = append(out, seenNA{ethSrc: append(net.HardwareAddr(nil), b[6:12]...), tlla: tlla(na), solicited: na.Solicited})
	}
}

// answeredNDP returns a check that a solicitation for vip, from the veth
// peer in this namespace, gets exactly one advertisement: the cluster MAC,
// from mac.
func answeredNDP(t *testing.T, vip netip.Addr, mac net.HardwareAddr) func() error {
	return answeredNDPIn(t, vip, mac, rules.MACMulticast)
}

// answeredNDPIn is answeredNDP for the cluster MAC of mode.
func answeredNDPIn(t *testing.T, vip netip.Addr, mac net.HardwareAddr, mode rules.MACMode) func() error {
	return func() error {
		nas := solicit(t, "", vip, 300*time.Millisecond)
		if len(nas) != 1 {
			return fmt.Errorf("%d advertisements for %s, want 1: %v", len(nas), vip, nas)
		}
		if !bytes.Equal(nas[0].tlla, ClusterMAC(vip, mode)) || !bytes.Equal(nas[0].ethSrc, mac) {
			return fmt.Errorf("advertisement for %s says %s, from %s; want %s from %s", vip, nas[0].tlla, nas[0].ethSrc, ClusterMAC(vip, mode), mac)
		}
		return nil
	}
}

// TestHostRestartKeepsGroups runs TestHostRestartKeepsGroupsInNamespace in
// a namespace of its own.
func TestHostRestartKeepsGroups(t *testing.T) {
	ns := hostNamespace(t)
	cmd := exec.Command("ip", "netns", "exec", ns, os.Args[0], "-test.run=^TestHostRestartKeepsGroupsInNamespace$", "-test.short", "-test.v", "-test.count=1")
	cmd.Env = append(os.Environ(), "SHOAL_HOST_RESTART_TEST="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !bytes.Contains(out, []byte("--- PASS: TestHostRestartKeepsGroupsInNamespace")) {
		t.Fatalf("in namespace: %v\n%s", err, out)
	}
}

// TestHostRestartKeepsGroupsInNamespace: a host that leaves for a restart
// keeps the MAC of an IPv6 VIP's solicited-node group on the interface's
// multicast list (as it keeps the cluster MACs), so solicitations still
// reach the node while no agent runs; the next agent's sockets take over
// and it removes the kept entry, and its teardown leaves neither.
func TestHostRestartKeepsGroupsInNamespace(t *testing.T) {
	dataDir := os.Getenv("SHOAL_HOST_RESTART_TEST")
	if dataDir == "" {
		t.Skip("run by TestHostRestartKeepsGroups inside its namespace")
	}
	groupMAC := func() net.HardwareAddr {
		b := solicitedNode(hostVIP6).As16()
		return net.HardwareAddr{0x33, 0x33, b[12], b[13], b[14], b[15]}
	}()
	maddr := func() string { return mustIP(t, "maddr", "show", "dev", hostTestIf) }
	vips := vipSet{[]netip.Addr{hostVIP1, hostVIP6}, ""}
	h, err := Setup(Config{Announcer: l2(nil, nil), Interface: hostTestIf, DataDir: dataDir, VIPs: vips.vips})
	if err != nil {
		t.Fatal(err)
	}
	if out := maddr(); !strings.Contains(out, solicitedNode(hostVIP6).String()) || !strings.Contains(out, groupMAC.String()) {
		t.Fatalf("running: group %s (%s) not joined:\n%s", solicitedNode(hostVIP6), groupMAC, out)
	}
	if err := h.Leave(); err != nil {
		t.Fatal(err)
	}
	out := maddr()
	if strings.Contains(out, solicitedNode(hostVIP6).String()) {
		t.Errorf("the group's socket membership outlived the agent:\n%s", out)
	}
	if !strings.Contains(out, groupMAC.String()) || !strings.Contains(out, ClusterMAC(hostVIP6, "").String()) {
		t.Errorf("left for a restart: the group's mac %s and the cluster mac %s must stay:\n%s", groupMAC, ClusterMAC(hostVIP6, ""), out)
	}

	h, err = Setup(Config{Announcer: l2(nil, nil), Interface: hostTestIf, DataDir: dataDir, VIPs: vips.vips})
	if err != nil {
		t.Fatal(err)
	}
	if rec, err := loadHostRecord(dataDir); err != nil || len(rec.MACs) != 0 {
		t.Errorf("after the next start the record still keeps macs %v (%v)", rec.MACs, err)
	}
	if out := maddr(); !strings.Contains(out, solicitedNode(hostVIP6).String()) {
		t.Errorf("the next agent did not join the group:\n%s", out)
	}
	if err := h.Teardown(); err != nil {
		t.Fatal(err)
	}
	if out := maddr(); strings.Contains(out, groupMAC.String()) || strings.Contains(out, ClusterMAC(hostVIP6, "").String()) {
		t.Errorf("after teardown the group's or the cluster's mac is left:\n%s", out)
	}
}
