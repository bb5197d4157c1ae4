//go:build linux

package filter

import (
	"bytes"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/google/gopacket/layers"
	"github.com/vishvananda/netlink"
)

// TestPinAdopt: a data plane pinned and released stays attached and keeps
// judging by its tables with no process holding it; the next loader adopts
// its tables and link as they are (same verdicts, same MAC, the lease
// left), moves the link to its own program without detaching, and leaves
// no pin behind; Close then detaches. Pins of another program are
// replaced: the link is taken over, the tables are fresh.
func TestPinAdopt(t *testing.T) {
	ns := newNetns(t)
	enterNetns(t, ns)
	ifname := uniqueName("pa")
	run(t, "ip", "-n", ns, "link", "add", ifname, "type", "veth", "peer", "name", ifname+"p")
	run(t, "ip", "-n", ns, "link", "set", ifname, "up")
	x := loadXDP(t)

	vip := netip.MustParseAddr("198.18.0.1")
	mac := []byte{0x02, 0, 0, 0, 0xaa, 1}
	c := &Config{Seed: 77, VIPs: []netip.Addr{vip}, Rules: []Rule{{ID: 1, VIP: vip, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinityNone}}}
	mine := &pkt{src: netip.MustParseAddr("198.18.5.5"), sport: 4000, dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true}
	other := &pkt{src: netip.MustParseAddr("198.18.5.6"), sport: 4001, dst: vip, dport: 80, proto: layers.IPProtocolTCP, ack: true}
	st := new([NumBuckets]BucketState)
	st[Bucket(77, AffinityNone, 0xc6120505, 4000)] = Owned
	if st[Bucket(77, AffinityNone, 0xc6120506, 4001)] == Owned {
		t.Skip("the two test flows share a bucket; pick others")
	}
	if err := x.Update(&Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{1: st}}, mac); err != nil {
		t.Fatal(err)
	}
	if err := x.Attach(ifname); err != nil {
		t.Fatal(err)
	}
	if err := x.RenewLease(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	member := netip.MustParseAddr("198.18.5.9")
	if err := x.SetMembers([]netip.Addr{member}); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join("/sys/fs/bpf", uniqueName("shoaltest"), "node")
	t.Cleanup(func() { removePins(dir); os.Remove(filepath.Dir(dir)) })
	if err := x.Pin(dir); err != nil {
		t.Fatal(err)
	}
	// Tables pushed after Pin are what the next loader adopts.
	if err := x.Update(&Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{1: st}}, mac); err != nil {
		t.Fatal(err)
	}
	rec := x.Pinned()
	if err := x.Release(); err != nil {
		t.Fatal(err)
	}
	if id := attachedProg(t, ifname); id == 0 {
		t.Fatal("released: no program on the interface; want the pinned one attached")
	}

	y, ad, err := LoadPinnedXDP(dir, rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { y.Close() })
	if !ad.Link || !ad.Tables || !bytes.Equal(ad.MAC, mac) || ad.Lease <= 4*time.Second || ad.Lease > 5*time.Second {
		t.Fatalf("adoption %+v; want link and tables, mac %x, a lease of 4-5 s", ad, mac)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("pin directory still there after adoption: %v", err)
	}
	// The forwarding members come along, and can be changed.
	if fc, err := y.ForwardCounters(); err != nil || len(fc.Peers) != 1 {
		t.Errorf("adopted forwarding members %+v, %v; want %s", fc.Peers, err, member)
	}
	if err := y.SetMembers(nil); err != nil {
		t.Errorf("SetMembers after adoption: %v", err)
	}
	if fc, err := y.ForwardCounters(); err != nil || len(fc.Peers) != 0 {
		t.Errorf("forwarding members after removal %+v, %v; want none", fc.Peers, err)
	}
	for _, tc := range []struct {
		name string
		p    *pkt
		want uint32
	}{{"owned flow", mine, xdpPass}, {"flow of another node", other, xdpDrop}} {
		act, out, err := y.Run(tc.p.build())
		if err != nil {
			t.Fatal(err)
		}
		if act != tc.want || act == xdpPass && !bytes.Equal(out[:6], mac) {
			t.Errorf("%s through adopted tables: action %d, dst %x; want %d", tc.name, act, out[:6], tc.want)
		}
	}
	if err := y.Attach(ifname); err != nil {
		t.Fatal(err)
	}
	if y.Mode() != AttachTC {
		t.Errorf("adopted link's mode %q, want tc (veth)", y.Mode())
	}
	y.mu.Lock()
	info, err := y.attached().Info()
	y.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if id, _ := info.ID(); attachedProg(t, ifname) != uint32(id) {
		t.Errorf("interface runs program %d, want the adopter's %d", attachedProg(t, ifname), id)
	}
	// The adopter's own updates carry on from the adopted state.
	if err := y.Update(&Tables{Config: c, States: map[RuleID]*[NumBuckets]BucketState{}}, mac); err != nil {
		t.Fatal(err)
	}
	if act, _, _ := y.Run(mine.build()); act != xdpDrop {
		t.Errorf("after the adopter's update: owned flow action %d, want drop", act)
	}

	// Pins of another program: the link is taken over, the tables are not.
	if err := y.Pin(dir); err != nil {
		t.Fatal(err)
	}
	rec = y.Pinned()
	rec.Program = "another"
	if err := y.Release(); err != nil {
		t.Fatal(err)
	}
	z, ad, err := LoadPinnedXDP(dir, rec)
	if err != nil {
		t.Fatal(err)
	}
	if !ad.Link || ad.Tables || !strings.Contains(ad.Why, "another program") {
		t.Fatalf("stale pins: adoption %+v; want the link only, and why", ad)
	}
	if err := z.Attach(ifname); err != nil {
		t.Fatal(err)
	}
	if err := z.Close(); err != nil {
		t.Fatal(err)
	}
	if id := attachedProg(t, ifname); id != 0 {
		t.Errorf("after Close the interface still runs program %d", id)
	}
}

// attachedProg returns the id of the program on ifname (XDP, or the first
// on tcx ingress), 0 if none.
func attachedProg(t *testing.T, ifname string) uint32 {
	t.Helper()
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		t.Fatal(err)
	}
	if x := l.Attrs().Xdp; x != nil && x.Attached {
		return x.ProgId
	}
	q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		t.Fatal(err)
	}
	if len(q.Programs) > 0 {
		return uint32(q.Programs[0].ID)
	}
	return 0
}

// TestPinAdoptIPv6VIPs: the record carries the IPv6 VIP directory, so an
// adopter that removes an IPv6 VIP clears it from every version of the
// tables: traffic to it passes again.
func TestPinAdoptIPv6VIPs(t *testing.T) {
	ns := newNetns(t)
	enterNetns(t, ns)
	ifname := uniqueName("pa")
	run(t, "ip", "-n", ns, "link", "add", ifname, "type", "veth", "peer", "name", ifname+"p")
	run(t, "ip", "-n", ns, "link", "set", ifname, "up")
	x := loadXDP(t)
	mac := []byte{0x02, 0, 0, 0, 0xaa, 2}
	vip4, vip6 := netip.MustParseAddr("198.18.0.1"), netip.MustParseAddr("2001:db8::1")
	with := &Tables{Config: &Config{Seed: 7, VIPs: []netip.Addr{vip4, vip6}}}
	without := &Tables{Config: &Config{Seed: 7, VIPs: []netip.Addr{vip4}}}
	for range tableVersions { // every version holds the IPv6 VIP
		if err := x.Update(with, mac); err != nil {
			t.Fatal(err)
		}
	}
	if err := x.Attach(ifname); err != nil {
		t.Fatal(err)
	}
	frame := pkt6{src: netip.MustParseAddr("2001:db8:5::5"), dst: vip6, sport: 1, dport: 80, proto: layers.IPProtocolTCP}.build()
	if act, _, _ := x.Run(frame); act != xdpDrop {
		t.Fatalf("to the IPv6 VIP, no bucket owned: action %d, want drop", act)
	}
	dir := filepath.Join("/sys/fs/bpf", uniqueName("shoaltest"), "node")
	t.Cleanup(func() { removePins(dir); os.Remove(filepath.Dir(dir)) })
	if err := x.Pin(dir); err != nil {
		t.Fatal(err)
	}
	rec := x.Pinned()
	if err := x.Release(); err != nil {
		t.Fatal(err)
	}
	y, ad, err := LoadPinnedXDP(dir, rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { y.Close() })
	if !ad.Tables {
		t.Fatalf("adoption %+v; want the tables", ad)
	}
	for i := range tableVersions {
		if err := y.Update(without, mac); err != nil {
			t.Fatal(err)
		}
		if act, _, _ := y.Run(frame); act != xdpPass {
			t.Errorf("update %d without the IPv6 VIP: action %d, want pass", i+1, act)
		}
	}
}

// TestPinEgress: routed forwarding's MSS clamp at the interface's egress
// survives a hitless restart: pinned and released, it stays attached with
// no process holding it; the next loader moves it to its own program when
// its tables forward (one program at egress, never none), and removes it
// when they stop forwarding.
func TestPinEgress(t *testing.T) {
	ns := newNetns(t)
	enterNetns(t, ns)
	ifname := uniqueName("pe")
	run(t, "ip", "-n", ns, "link", "add", ifname, "type", "veth", "peer", "name", ifname+"p")
	run(t, "ip", "-n", ns, "link", "set", ifname, "up")
	egress := func() []link.AttachedProgram {
		t.Helper()
		l, err := netlink.LinkByName(ifname)
		if err != nil {
			t.Fatal(err)
		}
		q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			t.Fatal(err)
		}
		return q.Programs
	}
	vip := netip.MustParseAddr("198.18.0.1")
	c := &Config{Seed: 7, VIPs: []netip.Addr{vip}, Rules: []Rule{{ID: 1, VIP: vip, PortLo: 80, PortHi: 80, Proto: ProtoTCP}}}
	tables := func(forward bool) *Tables {
		tb := allIn(c, Owned)
		if forward {
			tb.Routed, tb.Self, tb.MTU = true, netip.MustParseAddr("198.18.9.1"), 1500
		}
		return tb
	}
	mac := []byte{0x02, 0, 0, 0, 0xaa, 2}
	x := loadXDP(t)
	if err := x.Update(tables(true), mac); err != nil {
		t.Fatal(err)
	}
	if err := x.Attach(ifname); err != nil {
		t.Fatal(err)
	}
	if err := x.Update(tables(true), mac); err != nil {
		t.Fatal(err)
	}
	if n := len(egress()); n != 1 {
		t.Fatalf("%d programs at egress with forwarding tables, want the MSS clamp", n)
	}
	dir := filepath.Join("/sys/fs/bpf", uniqueName("shoaltest"), "node")
	t.Cleanup(func() { removePins(dir); os.Remove(filepath.Dir(dir)) })
	if err := x.Pin(dir); err != nil {
		t.Fatal(err)
	}
	rec := x.Pinned()
	if err := x.Release(); err != nil {
		t.Fatal(err)
	}
	if n := len(egress()); n != 1 {
		t.Fatalf("released: %d programs at egress, want the pinned clamp still there", n)
	}
	y, _, err := LoadPinnedXDP(dir, rec)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { y.Close() })
	if err := y.Attach(ifname); err != nil {
		t.Fatal(err)
	}
	if err := y.Update(tables(true), mac); err != nil {
		t.Fatal(err)
	}
	if n := len(egress()); n != 1 {
		t.Fatalf("adopted: %d programs at egress, want the clamp moved to the new program", n)
	}
	if err := y.Update(tables(false), mac); err != nil {
		t.Fatal(err)
	}
	if n := len(egress()); n != 0 {
		t.Errorf("tables that do not forward: %d programs at egress, want none", n)
	}
}
