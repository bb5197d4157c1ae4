package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// TestIGMPModeBystander: on a switch with IGMP snooping and a querier, a
// bystander port (no agent, joined nothing) receives no VIP frame in igmp
// mode while the nodes serve every request; switched to multicast mode at
// runtime, the switch forwards every VIP frame the client sends to the same
// bystander.
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
	l := upLab(ctx, t, Options{Nodes: 2, Binary: bin, MACMode: "igmp", Family: family})
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
			count := countVIPFrames(t, l, vip)
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
			sent[vip], bystander[vip] = count()
			t.Logf("%s mode, %s: %d requests, %d VIP frames from the client, %d of them forwarded to the bystander", mode, vip, res.Successes, sent[vip], bystander[vip])
		}
		return bystander, sent
	}

	by, sent := phase("igmp")
	for _, vip := range l.VIPs() {
		if sent[vip] == 0 || by[vip] != 0 {
			t.Errorf("igmp mode: the switch forwarded %d of the client's %d frames to %s to the bystander, want 0", by[vip], sent[vip], vip)
		}
	}
	if _, err := l.CLI(ctx, "node1", "settings", "set", "--mac-mode", "multicast"); err != nil {
		t.Fatal(err)
	}
	by, sent = phase("multicast")
	for _, vip := range l.VIPs() {
		if sent[vip] == 0 || by[vip] != sent[vip] {
			t.Errorf("multicast mode: the switch forwarded %d of the client's %d frames to %s to the bystander, want them all", by[vip], sent[vip], vip)
		}
	}
}

// countVIPFrames counts, in the lab's switch, the frames to vip that
// enter from the client's port and the frames to vip that the switch
// forwards to the bystander's port, from now on; the returned function
// reads both. The counters are nftables counters in the switch's
// own table (bridge family, after the igmp mode's snooping drops), so they
// are exact: a capture in the hosts loses frames when its buffer fills
// under load and cannot tell the switch's decision from its own losses.
func countVIPFrames(t *testing.T, l *Lab, vip netip.Addr) func() (sent, bystander int64) {
	t.Helper()
	table := fmt.Sprintf("shoal_test_count_%d", time.Now().UnixNano()%1e9)
	daddr := "ip daddr"
	if vip.Is6() {
		daddr = "ip6 daddr"
	}
	nft := func(stdin string, args ...string) []byte {
		t.Helper()
		cmd := exec.Command("ip", append([]string{"netns", "exec", l.Switch, "nft"}, args...)...)
		cmd.Stdin = strings.NewReader(stdin)
		out, err := cmd.CombinedOutput()
		if err != nil {
			t.Fatalf("nft %v in %s: %v: %s", args, l.Switch, err, out)
		}
		return out
	}
	nft(fmt.Sprintf("table bridge %[1]s {\n"+
		"\tcounter sent {}\n\tcounter bystander {}\n"+
		"\tchain from_client { type filter hook prerouting priority -300; iifname %[2]q %[3]s %[4]s counter name sent; }\n"+
		"\tchain to_bystander { type filter hook forward priority 100; oifname %[5]q %[3]s %[4]s counter name bystander; }\n"+
		"}\n", table, l.Client.BridgePort, daddr, vip, l.Bystander.BridgePort), "-f", "-")
	t.Cleanup(func() {
		_ = exec.Command("ip", "netns", "exec", l.Switch, "nft", "delete", "table", "bridge", table).Run()
	})
	return func() (sent, bystander int64) {
		t.Helper()
		var list struct {
			Nftables []struct {
				Counter *struct {
					Name    string `json:"name"`
					Packets int64  `json:"packets"`
				} `json:"counter"`
			} `json:"nftables"`
		}
		if err := json.Unmarshal(nft("", "-j", "list", "counters", "table", "bridge", table), &list); err != nil {
			t.Fatalf("nft counters: %v", err)
		}
		for _, o := range list.Nftables {
			switch {
			case o.Counter == nil:
			case o.Counter.Name == "sent":
				sent = o.Counter.Packets
			case o.Counter.Name == "bystander":
				bystander = o.Counter.Packets
			}
		}
		return sent, bystander
	}
}
