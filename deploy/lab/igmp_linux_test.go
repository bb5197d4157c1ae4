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
func TestIGMPModeBystander(t *testing.T) {
	needRoot(t)
	if testing.Short() {
		t.Skip("builds shoal and a 2-node lab; skipped with -short")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	l, err := Up(ctx, Options{Nodes: 2, Binary: bin, Base: t.TempDir(), MACMode: "igmp"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := l.Down(context.Background()); err != nil {
			t.Errorf("lab down: %v", err)
		}
	})
	if ports, err := l.groupPorts(ctx, IGMPGroup(l.VIP).String()); err != nil || strings.Join(ports, ",") != "p-node1,p-node2" {
		t.Errorf("the switch's members of %s: %v (%v), want both nodes' ports only", IGMPGroup(l.VIP), ports, err)
	}

	phase := func(mode string) (bystander, sent int64) {
		t.Helper()
		want := ClusterMACIn(mode, l.VIP)
		if err := Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
			if mac, err := l.Neighbor(ctx, l.VIP.String()); err != nil || mac != want && mac != "" {
				return fmt.Errorf("client resolves the VIP to %q (%v), want %s", mac, err, want)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s mode: %v", mode, err)
		}
		// The client's capture starts first and stops last: every frame it
		// counts went out while the bystander's capture ran.
		cl := countVIPFrames(t, l, l.Client.Namespace, l.VIP)
		by := countVIPFrames(t, l, l.Bystander.Namespace, l.VIP)
		res, err := l.Load(ctx, LoadArgs{Duration: 2 * time.Second, Concurrency: 4}, nil)
		if err != nil {
			t.Fatalf("%s mode: load: %v", mode, err)
		}
		if res.Failures != 0 || res.Successes == 0 || len(res.ByNode) != len(l.Nodes) {
			t.Errorf("%s mode: %d requests, %d failed, served by %v; want all served, by every node", mode, res.Requests, res.Failures, res.ByNode)
		}
		if mac, _ := l.Neighbor(ctx, l.VIP.String()); mac != want {
			t.Errorf("%s mode: client resolved the VIP to %q, want %s", mode, mac, want)
		}
		time.Sleep(100 * time.Millisecond) // the last frames reach the captures
		bystander, sent = by(), cl()
		t.Logf("%s mode: %d requests, %d VIP frames sent by the client, %d reached the bystander", mode, res.Successes, sent, bystander)
		return bystander, sent
	}

	by, sent := phase("igmp")
	if sent == 0 || by != 0 {
		t.Errorf("igmp mode: the bystander received %d of the client's %d VIP frames, want 0", by, sent)
	}
	if _, err := l.CLI(ctx, "node1", "settings", "set", "--mac-mode", "multicast"); err != nil {
		t.Fatal(err)
	}
	by, sent = phase("multicast")
	if sent == 0 || by < sent {
		t.Errorf("multicast mode: the bystander received %d of the client's %d VIP frames, want them all", by, sent)
	}
}

// countVIPFrames captures on the Interface of namespace ns until the
// returned function is called, which returns how many IPv4 frames to vip
// the capture saw.
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
			if ip4, ok := p.Layer(layers.LayerTypeIPv4).(*layers.IPv4); ok {
				if dst, _ := netip.AddrFromSlice(ip4.DstIP); dst == vip {
					n.Add(1)
				}
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
