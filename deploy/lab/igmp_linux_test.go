package lab

import (
	"context"
	"fmt"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"
	"github.com/google/gopacket/pcapgo"
)

// TestIGMPModeBystander: on a switch with IGMP snooping and a querier, a
// bystander port (no agent, joined nothing) receives no VIP frame in igmp
// mode while the nodes serve every request; switched to multicast mode at
// runtime, the same bystander receives every VIP frame the client sends.
// The dual lab does the same for an IPv6 VIP (MLD) beside the IPv4 one.
func TestIGMPModeBystander(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("builds shoal and two 2-node labs; skipped with -short")
	}
	bin := buildShoal(t)
	for _, family := range []Family{Family4, FamilyDual} {
		t.Run("family "+string(family), func(t *testing.T) { testIGMPMode(t, bin, family) })
	}
}

func testIGMPMode(t *testing.T, bin string, family Family) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := Up(ctx, Options{Nodes: 2, Binary: bin, Base: t.TempDir(), MACMode: "igmp", Family: family})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	for _, vip := range l.VIPs() {
		if ports, err := l.groupPorts(ctx, IGMPGroup(vip).String()); err != nil || strings.Join(ports, ",") != "p-node1,p-node2" {
			t.Errorf("the switch's members of %s: %v (%v), want both nodes' ports only", IGMPGroup(vip), ports, err)
		}
	}

	// phase loads every VIP in turn and returns, per VIP, the frames to it
	// the bystander and the client saw.
	phase := func(mode string) (bystander, sent map[netip.Addr]int64) {
		t.Helper()
		bystander, sent = map[netip.Addr]int64{}, map[netip.Addr]int64{}
		for _, vip := range l.VIPs() {
			want := ClusterMACIn(mode, vip)
			if err := Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
				if mac, err := l.Neighbor(ctx, vip.String()); err != nil || mac != want && mac != "" {
					return fmt.Errorf("client resolves %s to %q (%v), want %s", vip, mac, err, want)
				}
				return nil
			}); err != nil {
				t.Fatalf("%s mode: %v", mode, err)
			}
			// The client's capture starts first and stops last: every frame
			// it counts went out while the bystander's capture ran.
			cl := countVIPFrames(t, l, l.Client.Namespace, vip)
			by := countVIPFrames(t, l, l.Bystander.Namespace, vip)
			res, err := l.Load(ctx, LoadArgs{URL: URL(vip), Duration: 1500 * time.Millisecond, Concurrency: 4}, nil)
			if err != nil {
				t.Fatalf("%s mode: load %s: %v", mode, vip, err)
			}
			if res.Failures != 0 || res.Successes == 0 || len(res.ByNode) != len(l.Nodes) {
				t.Errorf("%s mode, %s: %d requests, %d failed, served by %v; want all served, by every node", mode, vip, res.Requests, res.Failures, res.ByNode)
			}
			if mac, _ := l.Neighbor(ctx, vip.String()); mac != want {
				t.Errorf("%s mode: client resolved %s to %q, want %s", mode, vip, mac, want)
			}
			time.Sleep(100 * time.Millisecond) // the last frames reach the captures
			bystander[vip], sent[vip] = by(), cl()
			t.Logf("%s mode, %s: %d requests, %d VIP frames sent by the client, %d reached the bystander", mode, vip, res.Successes, sent[vip], bystander[vip])
		}
		return bystander, sent
	}

	by, sent := phase("igmp")
	for _, vip := range l.VIPs() {
		if sent[vip] == 0 || by[vip] != 0 {
			t.Errorf("igmp mode: the bystander received %d of the client's %d frames to %s, want 0", by[vip], sent[vip], vip)
		}
	}
	if _, err := l.CLI(ctx, "node1", "settings", "set", "--mac-mode", "multicast"); err != nil {
		t.Fatal(err)
	}
	by, sent = phase("multicast")
	for _, vip := range l.VIPs() {
		if sent[vip] == 0 || by[vip] < sent[vip] {
			t.Errorf("multicast mode: the bystander received %d of the client's %d frames to %s, want them all", by[vip], sent[vip], vip)
		}
	}
}

// countVIPFrames captures on the Interface of namespace ns until the
// returned function is called, which returns how many IP frames to vip the
// capture saw.
func countVIPFrames(t *testing.T, l *Lab, ns string, vip netip.Addr) func() int64 {
	t.Helper()
	var h *pcapgo.EthernetHandle
	if err := inNamespace(t, ns, func() error {
		var err error
		h, err = pcapgo.NewEthernetHandle(Interface)
		return err
	}); err != nil {
		t.Fatalf("capture in %s: %v", ns, err)
	}
	var n atomic.Int64
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			data, _, err := h.ReadPacketData()
			if err != nil {
				return
			}
			p := gopacket.NewPacket(data, layers.LayerTypeEthernet, gopacket.NoCopy)
			var dst netip.Addr
			if ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
				dst, _ = netip.AddrFromSlice(ip4.DstIP)
			} else if ip6, ok := p.Layer(layers.LayerTypeIPv6).(*layers.IPv6); ok {
				dst, _ = netip.AddrFromSlice(ip6.DstIP)
			}
			if dst.Unmap() == vip {
				n.Add(1)
			}
		}
	}()
	var once sync.Once
	stop := func() int64 {
		once.Do(func() { h.Close(); wg.Wait() })
		return n.Load()
	}
	t.Cleanup(func() { stop() })
	return stop
}
