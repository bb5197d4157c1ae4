package node

import (
	"fmt"
	"math/rand/v2"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/google/gopacket"
	"github.com/google/gopacket/layers"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/rules"
)

// flowCheck follows every node's kernel tables, push by push, and judges
// the SYN of each of a sample of flows with the reference data plane on
// every node: a moment when no node takes a flow's SYN (none accepts it,
// and no node hands it over to one that accepts the handed copy) is a gap,
// one when two take it a double. It sees what bridgeCheck cannot: flows
// whose bucket numbers change with the rules.
type flowCheck struct {
	mu      sync.Mutex
	tables  map[filter.NodeID]*filter.Tables
	ref     map[*filter.Tables]*filter.Classifier
	flows   [][]byte // SYN frames, flooded (to the cluster MAC)
	armed   bool
	gaps    int
	doubles int
	first   string
}

var clusterMAC = net.HardwareAddr{0x03, 0xbf, 0xc6, 0x12, 0x07, 0x64}

// synFrame is a client's SYN to vip, addressed to dst.
func synFrame(dst net.HardwareAddr, client netip.AddrPort, vip netip.AddrPort) []byte {
	eth := &layers.Ethernet{SrcMAC: net.HardwareAddr{2, 0xc0, 0, 0, 0, 1}, DstMAC: dst, EthernetType: layers.EthernetTypeIPv4}
	ip := &layers.IPv4{Version: 4, TTL: 64, Protocol: layers.IPProtocolTCP,
		SrcIP: client.Addr().AsSlice(), DstIP: vip.Addr().AsSlice()}
	tcp := &layers.TCP{SrcPort: layers.TCPPort(client.Port()), DstPort: layers.TCPPort(vip.Port()), SYN: true, Seq: 1, Window: 64240}
	tcp.SetNetworkLayerForChecksum(ip)
	buf := gopacket.NewSerializeBuffer()
	if err := gopacket.SerializeLayers(buf, gopacket.SerializeOptions{FixLengths: true, ComputeChecksums: true}, eth, ip, tcp); err != nil {
		panic(err)
	}
	return buf.Bytes()
}

func newFlowCheck(c *testCluster, vip netip.Addr, ports []uint16, n int) *flowCheck {
	fc := &flowCheck{tables: map[filter.NodeID]*filter.Tables{}, ref: map[*filter.Tables]*filter.Classifier{}}
	rng := rand.New(rand.NewPCG(5, 6))
	for range n {
		client := netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, byte(rng.IntN(4)), byte(rng.IntN(256))}), uint16(1024+rng.IntN(60000)))
		fc.flows = append(fc.flows, synFrame(clusterMAC, client, netip.AddrPortFrom(vip, ports[rng.IntN(len(ports))])))
	}
	for _, tn := range c.nodes {
		id := tn.id
		f := func(_, next *filter.Tables) {
			fc.mu.Lock()
			defer fc.mu.Unlock()
			fc.tables[id] = next
			if fc.armed {
				fc.check(id)
			}
		}
		tn.dp.watch.Store(&f)
	}
	return fc
}

func (fc *flowCheck) arm() {
	fc.mu.Lock()
	defer fc.mu.Unlock()
	fc.armed = true
}

func (fc *flowCheck) judge(id filter.NodeID, frame []byte) filter.Result {
	t := fc.tables[id]
	c := fc.ref[t]
	if c == nil {
		c = filter.NewClassifier(t, testMAC(int(id)), nil)
		fc.ref[t] = c
	}
	return c.Classify(append([]byte(nil), frame...))
}

func (fc *flowCheck) check(pushed filter.NodeID) {
	for fi, frame := range fc.flows {
		var takers []string
		for id := range fc.tables {
			res := fc.judge(id, frame)
			switch res.Verdict {
			case filter.Accept:
				takers = append(takers, fmt.Sprintf("node %d", id))
			case filter.HandOver:
				for to := range fc.tables {
					if net.HardwareAddr(res.To[:]).String() != testMAC(int(to)).String() {
						continue
					}
					handed := append([]byte(nil), frame...)
					copy(handed[0:6], res.To[:])
					if fc.judge(to, handed).Verdict == filter.Accept {
						takers = append(takers, fmt.Sprintf("node %d handed by node %d", to, id))
					}
				}
			}
		}
		if len(takers) == 1 {
			continue
		}
		if len(takers) == 0 {
			fc.gaps++
		} else {
			fc.doubles++
		}
		if fc.first == "" {
			fc.first = fmt.Sprintf("after node %d's push, flow %d: taken by %v", pushed, fi, takers)
			for id, t := range fc.tables {
				res := fc.judge(id, frame)
				h := uint8(0)
				if t.HandTo[res.Rule] != nil {
					h = t.HandTo[res.Rule][res.Bucket]
				}
				fc.first += fmt.Sprintf("; node %d: %v %v rule %d bucket %d %v hand %d, prev %v, seed %d, rules %d", id, res.Verdict, res.Reason,
					res.Rule, res.Bucket, res.State, h, t.Prev != nil, t.Config.Seed, len(t.Config.Rules))
			}
		}
	}
}

// TestRemappingRuleChangesKeepEveryFlowTaken changes the rules, each time
// in a settled cluster (a change in the middle of a hand-over leaves the
// flows that the previous tables hand over without an owner until the
// new rules' view converges: docs/ARCHITECTURE.md), in the ways
// that give flows other bucket numbers (a port range widened, the hash
// seed, a rule removed, its traffic falling to the default host), with one
// node's data plane slow, so that its peers apply each change well before
// it advertises it. Each node keeps judging the SYNs its previous tables
// took by them, keeps them while their new owner is not ready and hands
// them over once it is: at no push does a sampled flow's SYN lack a node to
// take it, nor have two.
func TestRemappingRuleChangesKeepEveryFlowTaken(t *testing.T) {
	c := newTestCluster(t, 3, 20*time.Millisecond)
	vip := netip.MustParseAddr("198.18.7.100")
	fc := newFlowCheck(c, vip, []uint16{80, 81}, 600)
	for i := range 3 {
		c.start(i + 1)
	}
	settled := func() bool {
		for _, tn := range c.nodes {
			s := tn.n.mem.snap.Load()
			k := tn.dp.kernel.Load()
			if s == nil || len(s.hb.View.Eligible) != 3 || !s.hb.Converged || k == nil || k.Prev != nil ||
				s.rs.Index != c.rules.State().Index || tn.n.rec.pub.Load().tablesIndex != s.rs.Index {
				return false
			}
			// And the check has seen those tables (its watch runs after
			// the kernel's swap): judging by tables gone showed doubles
			// that were not there.
			fc.mu.Lock()
			seen := fc.tables[tn.id] == k
			fc.mu.Unlock()
			if !seen {
				return false
			}
			for _, h := range k.HandTo {
				if *h != ([filter.NumBuckets]uint8{}) {
					return false // a hand-over, or a bucket pending
				}
			}
		}
		return true
	}
	c.await("three nodes settled", 10*time.Second, settled)
	c.nodes[1].dp.delay.Store(int64(15 * time.Millisecond)) // node 2: most of a period
	fc.arm()
	prevs := 0
	for _, change := range []struct {
		what string
		do   func(st *rules.State)
	}{
		{"rule 1 widened to ports 80-81", func(st *rules.State) { st.Rules[0].PortHi = 81 }},
		{"hash seed changed", func(st *rules.State) { st.Settings.HashSeed = 99 }},
		{"rule 1 removed", func(st *rules.State) { st.Rules = nil }},
	} {
		c.rules.set(change.do)
		c.await(change.what+" applied everywhere with a prev", 10*time.Second, func() bool {
			k := c.nodes[0].dp.kernel.Load()
			return k != nil && k.Prev != nil
		})
		prevs++
		c.await(change.what+" settled", 10*time.Second, settled)
	}
	fc.mu.Lock()
	defer fc.mu.Unlock()
	if fc.gaps > 0 || fc.doubles > 0 {
		t.Errorf("%d flow-moments without a node to take the SYN, %d with two; first: %s", fc.gaps, fc.doubles, fc.first)
	}
}
