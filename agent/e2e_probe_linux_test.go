package agent_test

import (
	"context"
	"fmt"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/heartbeat"
)

// dropHeartbeats makes host's namespace drop the heartbeats it receives
// from the node at from (from everyone when from is the zero Addr), with
// an nftables table of its own; heal removes it (also at cleanup). It runs
// in the input hook, after XDP, so it is what a host firewall does.
func dropHeartbeats(t *testing.T, l *lab.Lab, host string, from netip.Addr) (heal func()) {
	t.Helper()
	return firewallHeartbeats(t, l, host, "input", from)
}

// muteHeartbeats makes host's namespace drop every heartbeat it sends (its
// output hook), as an egress firewall does; heal removes the rule.
func muteHeartbeats(t *testing.T, l *lab.Lab, host string) (heal func()) {
	t.Helper()
	return firewallHeartbeats(t, l, host, "output", netip.Addr{})
}

// firewallHeartbeats drops heartbeats in host's namespace at hook (input:
// received from peer, or from everyone if peer is the zero Addr; output:
// sent to peer, or to everyone).
func firewallHeartbeats(t *testing.T, l *lab.Lab, host, hook string, peer netip.Addr) (heal func()) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables' nft (apt-get install nftables; .ci/run installs it)")
	}
	ns := node(t, l, host).Namespace
	nft := func(script string) error {
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft in %s: %v: %s", host, err, out)
		}
		return nil
	}
	match := ""
	if peer.IsValid() {
		dir := "saddr"
		if hook == "output" {
			dir = "daddr"
		}
		match = "ip " + dir + " " + peer.String() + " "
	}
	table := "shoal_test_hbdrop_" + hook
	if err := nft(fmt.Sprintf("table inet %s {\n chain %s {\n  type filter hook %[2]s priority 0; policy accept;\n  %sudp dport %d drop\n }\n}\n", table, hook, match, lab.HeartbeatPort)); err != nil {
		t.Fatal(err)
	}
	healed := false
	heal = func() {
		t.Helper()
		if healed {
			return
		}
		healed = true
		if err := nft("delete table inet " + table); err != nil {
			t.Error(err)
		}
	}
	t.Cleanup(heal)
	return heal
}

// TestE2EPlugTwoNodes: in a 2-node cluster, the survivor of a pulled plug
// takes every bucket. The plugged node's peer API stays reachable, so this
// fails if a probe finds a plugged node alive (the survivor would then take
// itself for deaf and take nothing).
func TestE2EPlugTwoNodes(t *testing.T) {
	l := upLab(t, 2)
	mustShoal(t, l, "node2", "plug", "pull")
	pulled := time.Now()
	poll(t, 10*time.Second, "node1 covers every bucket alone", func() error { return covered(l, "node1") })
	t.Logf("node1 owns every bucket %v after the pull", time.Since(pulled).Round(time.Millisecond))
	mustShoal(t, l, "node2", "plug", "restore")
	poll(t, 10*time.Second, "node2 back", func() error { return covered(l, "node1", "node2") })
}

// TestE2EDeafNode: node3 stops hearing heartbeats (a firewall in its
// namespace drops every heartbeat it receives; it still sends, and its peer
// API answers). Its probes find its peers alive, so it knows it is deaf and
// takes nothing: from the fault on it never accepts more buckets than it
// had, and node1 and node2 cover every bucket. No held connection breaks
// (on node1 and node2, nor on node3, whose connections drain there). Without
// probes node3 would find itself alone and take every bucket, and the
// others would yield to it.
func TestE2EDeafNode(t *testing.T) {
	l := upLab(t, 3)
	accepting := func(name string) (int, error) {
		st, err := client(t, l, name).Status(context.Background())
		if err != nil {
			return 0, err
		}
		n := 0
		for _, b := range st.Accepting {
			n += b
		}
		return n, nil
	}
	h := hold(t, l, dialFromClient(t, l, 30), 100*time.Millisecond)
	share, err := accepting("node3")
	if err != nil || share == 0 {
		t.Fatalf("node3 accepts %d buckets (%v) before the fault, want its share", share, err)
	}
	heal := dropHeartbeats(t, l, "node3", netip.Addr{})
	deafened := time.Now()
	// Until node1 and node2 cover every bucket, and for longer than a node
	// takes to declare its peers dead after that, node3 takes nothing more.
	most := 0
	check := func() {
		n, err := accepting("node3")
		if err != nil {
			t.Fatal(err)
		}
		most = max(most, n)
		if n > share {
			t.Fatalf("deaf node3 accepts %d buckets %v after the fault, more than its share %d", n, time.Since(deafened), share)
		}
	}
	poll(t, 10*time.Second, "node1 and node2 cover every bucket", func() error { check(); return covered(l, "node1", "node2") })
	t.Logf("node1 and node2 own every bucket %v after node3 went deaf (node3 accepted at most %d of its %d meanwhile)", time.Since(deafened).Round(time.Millisecond), most, share)
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if n, err := accepting("node3"); err != nil || n != 0 {
			t.Fatalf("deaf node3 accepts %d buckets (%v), want 0", n, err)
		}
		if err := covered(l, "node1", "node2"); err != nil {
			t.Fatalf("with node3 deaf: %v", err)
		}
	}
	heal()
	poll(t, 10*time.Second, "node3 back after it hears again", func() error { return covered(l, "node1", "node2", "node3") })
	h.close()
	t.Logf("held connections by node: node1 %d, node2 %d, node3 %d", len(byNode(h.conns)["node1"]), len(byNode(h.conns)["node2"]), len(byNode(h.conns)["node3"]))
	h.check(t)
}

// TestE2EMuteNode: node3's heartbeats stop reaching anyone (a firewall in
// its namespace drops every heartbeat it sends; it still hears its peers,
// and its peer API answers their probes). node1 and node2, which hear each
// other, take every bucket within T+3 periods; node3, which learns from
// their heartbeats that they do not hear it, takes none, and no held
// connection breaks. Under new-connection load, at most 1% of requests
// fail.
func TestE2EMuteNode(t *testing.T) {
	l := upLab(t, 3)
	bound := time.Duration(heartbeat.DefaultTolerance+3) * heartbeat.DefaultPeriod
	h := hold(t, l, dialFromClient(t, l, 30), 100*time.Millisecond)
	waitLoad := startLoad(context.Background(), t, l, lab.LoadArgs{Duration: 6 * time.Second, Concurrency: 8, Rate: 200, Timeout: 3 * time.Second})
	time.Sleep(500 * time.Millisecond)
	heal := muteHeartbeats(t, l, "node3")
	muted := time.Now()
	var unsettled time.Time
	var why error
	for time.Since(muted) < 4*time.Second {
		names, err := owners(l)
		if ok := err == nil && slices.Equal(names, []string{"node1", "node2"}); !ok {
			if err == nil {
				err = fmt.Errorf("owners %v", names)
			}
			unsettled, why = time.Now(), err
		}
		time.Sleep(20 * time.Millisecond)
	}
	settled := unsettled.Sub(muted)
	t.Logf("node3 mute: node1 and node2 the only owners %v after the fault (bound T+3 periods = %v)", settled.Round(time.Millisecond), bound)
	if settled > bound {
		t.Errorf("ownership settled %v after node3 went mute, bound %v; last unsettled: %v", settled, bound, why)
	}
	heal()
	r := waitLoad()
	t.Logf("load: %d requests, %d failed, %d delayed by a SYN retransmission; by node %v", r.Requests, r.Failures, r.Delayed, r.ByNode)
	if r.Requests == 0 || r.Failures*100 > r.Requests {
		t.Errorf("%d of %d requests failed (%v), want at most 1%%", r.Failures, r.Requests, r.Errors)
	}
	poll(t, 10*time.Second, "node3 back once it is heard again", func() error { return covered(l, "node1", "node2", "node3") })
	h.close()
	t.Logf("held connections by node: node1 %d, node2 %d, node3 %d", len(byNode(h.conns)["node1"]), len(byNode(h.conns)["node2"]), len(byNode(h.conns)["node3"]))
	h.check(t)
}
