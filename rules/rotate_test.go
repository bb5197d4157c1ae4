package rules

import (
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/shoalnet/shoal/peer"
)

// TestKeyRotation runs the documented rotation on a 3-node cluster, with
// writes from every node and fresh connections after each step: add the
// new key everywhere, switch the primary node by node, remove the old key.
// No write fails; afterwards a holder of only the old key is refused.
func TestKeyRotation(t *testing.T) {
	oldKey, newKey := testKey, otherKey
	nodes := make([]*testNode, 3)
	for i := range nodes {
		nodes[i] = newTestNode(t, fmt.Sprintf("n%d", i+1))
		nodes[i].certs = testCerts(t, nodes[i].name, oldKey)
	}
	nodes[0].start(true)
	for i, n := range nodes[1:] {
		n.start(false)
		if _, err := n.store.Join(testCtx(t, 10*time.Second), nodes[i].apiAddr, NodeInfo{}); err != nil {
			t.Fatal(err)
		}
	}
	mustApply(t, nodes[0], &PutVIP{VIP: vip1})
	writes := 0
	writeFromEach := func(step string) {
		t.Helper()
		for _, n := range nodes {
			// New connections for every write: Raft's pool and the peer
			// client's idle connections would otherwise hide a refusal.
			n.store.client.CloseIdleConnections()
			writes++
			vip := netip.AddrFrom4([4]byte{198, 18, 9, byte(writes)})
			if _, err := n.store.Apply(testCtx(t, 10*time.Second), &PutVIP{VIP: vip}); err != nil {
				t.Fatalf("%s: write from %s: %v", step, n.name, err)
			}
		}
		waitConverged(t, nodes)
	}
	reload := func(n *testNode, keys ...[]byte) {
		t.Helper()
		if err := n.store.TLS().Reload(peer.TLSOptions{Name: n.name, Addrs: []netip.Addr{netip.MustParseAddr("127.0.0.1")}, Keys: keys}); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range nodes {
		reload(n, oldKey, newKey)
		writeFromEach("1. accept the new key on " + n.name)
	}
	for _, n := range nodes {
		reload(n, newKey, oldKey)
		writeFromEach("2. sign with the new key on " + n.name)
	}
	for _, n := range nodes {
		reload(n, newKey)
		writeFromEach("3. drop the old key on " + n.name)
	}
	// Raft restarts its connections too: restart a follower, which must
	// catch up over fresh ones under the new key only.
	_, followers := leaderOf(t, nodes)
	f := followers[0]
	f.stop()
	f.certs = testCerts(t, f.name, newKey)
	f.start(false)
	writeFromEach("after a restart under the new key")

	old := peer.NewClient(testCerts(t, "n1", oldKey))
	old.Timeout = 5 * time.Second
	if resp, err := old.Get(peer.URL(nodes[0].apiAddr, PeerPathPrefix+"ping")); err == nil {
		resp.Body.Close()
		t.Errorf("a holder of only the old key is still accepted: %s", resp.Status)
	}
}
