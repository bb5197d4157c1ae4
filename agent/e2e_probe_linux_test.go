package agent_test

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
)

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
// takes nothing; node1 and node2 cover every bucket. Without probes node3
// would find itself alone and take every bucket, and the others would yield
// to it.
func TestE2EDeafNode(t *testing.T) {
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables' nft (apt-get install nftables; .ci/run installs it)")
	}
	l := upLab(t, 3)
	ns := node(t, l, "node3").Namespace
	nft := func(script string) error {
		cmd := exec.Command("ip", "netns", "exec", ns, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft: %v: %s", err, out)
		}
		return nil
	}
	table := "shoal_probe_deaf"
	if err := nft(fmt.Sprintf("table inet %s {\n chain input {\n  type filter hook input priority 0; policy accept;\n  udp dport %d drop\n }\n}\n", table, lab.HeartbeatPort)); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nft("delete table inet " + table) })
	deafened := time.Now()
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
	poll(t, 10*time.Second, "node1 and node2 cover every bucket", func() error { return covered(l, "node1", "node2") })
	t.Logf("node1 and node2 own every bucket %v after node3 went deaf", time.Since(deafened).Round(time.Millisecond))
	// For longer than a node takes to declare its peers dead, node3 takes
	// nothing and the others keep every bucket.
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
		if n, err := accepting("node3"); err != nil || n != 0 {
			t.Fatalf("deaf node3 accepts %d buckets (%v), want 0", n, err)
		}
		if err := covered(l, "node1", "node2"); err != nil {
			t.Fatalf("with node3 deaf: %v", err)
		}
	}
	if err := nft("delete table inet " + table); err != nil {
		t.Fatal(err)
	}
	poll(t, 10*time.Second, "node3 back after it hears again", func() error { return covered(l, "node1", "node2", "node3") })
}
