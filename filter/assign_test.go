package filter

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

func testConfig(weights ...int) *Config {
	c := &Config{Seed: 0x5eed, VIPs: []netip.Addr{netip.MustParseAddr("198.18.0.100")}}
	c.Rules = []Rule{{ID: 1, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Mode: ModeMultiple, Affinity: AffinityNone}}
	for i, w := range weights {
		c.Nodes = append(c.Nodes, Node{ID: NodeID(i + 1), HostPriority: i + 1,
			Rules: map[RuleID]NodeRule{1: {Weight: w}}})
	}
	return c
}

func ids(n int) []NodeID {
	out := make([]NodeID, n)
	for i := range out {
		out[i] = NodeID(i + 1)
	}
	return out
}

// flowShares sends n random flows through the table and returns each node's share.
func flowShares(t *testing.T, c *Config, o *Owners, n int) map[NodeID]float64 {
	t.Helper()
	rng := rand.New(rand.NewPCG(1, 2))
	counts := map[NodeID]int{}
	table := o.Rules[1]
	for i := 0; i < n; i++ {
		b := Bucket(c.Seed, AffinityNone, rng.Uint32(), uint16(rng.Uint32()))
		counts[table[b]]++
	}
	shares := map[NodeID]float64{}
	for id, k := range counts {
		shares[id] = float64(k) / float64(n)
	}
	return shares
}

func TestBalanceEqualWeights(t *testing.T) {
	for _, n := range []int{2, 3, 5, 8, 16, 32, 64} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			w := make([]int, n)
			for i := range w {
				w[i] = DefaultWeight
			}
			c := testConfig(w...)
			o := Assign(c, ids(n))
			shares := flowShares(t, c, o, 1_000_000)
			mean := 1.0 / float64(n)
			for id := range ids(n) {
				if s := shares[NodeID(id+1)]; s > 1.02*mean {
					t.Errorf("node %d serves %.4f of flows, over 1.02x the mean %.4f", id+1, s, mean)
				}
			}
			if shares[NoNode] != 0 {
				t.Errorf("%.4f of flows have no owner", shares[NoNode])
			}
		})
	}
}

func TestBalanceAfterFailures(t *testing.T) {
	// The busiest survivor stays within 1.02x the mean whichever nodes fail.
	c := testConfig(50, 50, 50, 50, 50, 50, 50, 50)
	for _, down := range [][]NodeID{{1}, {8}, {2, 5}, {1, 2, 3}, {3, 4, 6, 8}} {
		t.Run(fmt.Sprint(down), func(t *testing.T) {
			var up []NodeID
			for _, id := range ids(8) {
				if !contains(down, id) {
					up = append(up, id)
				}
			}
			shares := flowShares(t, c, Assign(c, up), 1_000_000)
			mean := 1.0 / float64(len(up))
			for _, id := range up {
				if shares[id] > 1.02*mean {
					t.Errorf("node %d serves %.4f, over 1.02x the mean %.4f", id, shares[id], mean)
				}
			}
			for _, id := range down {
				if shares[id] != 0 {
					t.Errorf("failed node %d still owns %.4f", id, shares[id])
				}
			}
		})
	}
}

func contains(s []NodeID, id NodeID) bool {
	for _, x := range s {
		if x == id {
			return true
		}
	}
	return false
}

func TestWeightsHonoured(t *testing.T) {
	tests := []struct {
		name    string
		weights []int
	}{
		{"100/50/0", []int{100, 50, 0}},
		{"100/50/25", []int{100, 50, 25}},
		{"10/90", []int{10, 90}},
		{"1/100/100/100", []int{1, 100, 100, 100}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			c := testConfig(tc.weights...)
			shares := flowShares(t, c, Assign(c, ids(len(tc.weights))), 1_000_000)
			total := 0
			for _, w := range tc.weights {
				total += w
			}
			for i, w := range tc.weights {
				want := float64(w) / float64(total)
				got := shares[NodeID(i+1)]
				if d := got - want; d > 0.01 || d < -0.01 {
					t.Errorf("node %d weight %d: share %.4f, want %.4f +- 0.01", i+1, w, got, want)
				}
				if w == 0 && got != 0 {
					t.Errorf("node %d has weight 0 but owns %.4f of new flows", i+1, got)
				}
			}
		})
	}
}

// movedBuckets counts the buckets of rule 1 whose owner differs.
func movedBuckets(a, b *Owners) (moved int, from map[NodeID]int) {
	from = map[NodeID]int{}
	ta, tb := a.Rules[1], b.Rules[1]
	for i := range ta {
		if ta[i] != tb[i] {
			moved++
			from[ta[i]]++
		}
	}
	return moved, from
}

func TestLeaveMovesOnlyItsBuckets(t *testing.T) {
	for _, n := range []int{2, 3, 8, 32} {
		c := testConfig(make([]int, n)...)
		for i := range c.Nodes {
			c.Nodes[i].Rules[1] = NodeRule{Weight: 20 + 10*(i%5)}
		}
		before := Assign(c, ids(n))
		for leaver := NodeID(1); leaver <= NodeID(n); leaver++ {
			var up []NodeID
			for _, id := range ids(n) {
				if id != leaver {
					up = append(up, id)
				}
			}
			after := Assign(c, up)
			moved, from := movedBuckets(before, after)
			own := before.Owned(leaver)[1].Count()
			if moved != own || from[leaver] != own {
				t.Errorf("n=%d node %d leaves: %d buckets moved (%v), want exactly its %d", n, leaver, moved, from, own)
			}
		}
	}
}

func TestJoinMovesAtMostItsShare(t *testing.T) {
	for _, n := range []int{1, 2, 3, 7, 31, 63} {
		c := testConfig(make([]int, n+1)...)
		for i := range c.Nodes {
			c.Nodes[i].Rules[1] = NodeRule{Weight: DefaultWeight}
		}
		all := ids(n + 1)
		before := Assign(c, all[:n])
		after := Assign(c, all)
		moved, _ := movedBuckets(before, after)
		limit := (1.0/float64(n+1) + 0.01) * NumBuckets
		if float64(moved) > limit {
			t.Errorf("join to %d nodes moved %d buckets, over %.0f", n, moved, limit)
		}
		if got := after.Owned(NodeID(n + 1))[1].Count(); got != moved {
			t.Errorf("join to %d nodes: %d moved but the newcomer owns %d", n, moved, got)
		}
	}
}

func TestRegistryGrowthChurn(t *testing.T) {
	// Registering a new node (before it is eligible) changes the preference
	// tree; a user sees it as buckets moving between running nodes, which
	// the dirty/draining states make safe. Keep it bounded.
	for _, n := range []int{3, 8, 32} {
		c := testConfig(make([]int, n)...)
		for i := range c.Nodes {
			c.Nodes[i].Rules[1] = NodeRule{Weight: DefaultWeight}
		}
		before := Assign(c, ids(n))
		grown := testConfig(make([]int, n+1)...)
		for i := range grown.Nodes {
			grown.Nodes[i].Rules[1] = NodeRule{Weight: DefaultWeight}
		}
		after := Assign(grown, ids(n))
		moved, _ := movedBuckets(before, after)
		t.Logf("n=%d: registering node %d moves %d of %d buckets among running nodes", n, n+1, moved, NumBuckets)
		if float64(moved) > 2.0/float64(n+1)*NumBuckets {
			t.Errorf("registering a node to %d moved %d buckets, over 2/(N+1)", n, moved)
		}
	}
}

func TestSingleHostAndDefaultHost(t *testing.T) {
	c := testConfig(50, 50, 50)
	c.Rules[0].Mode = ModeSingle
	c.Nodes[0].Rules[1] = NodeRule{Weight: 50, HandlingPriority: 3}
	c.Nodes[1].Rules[1] = NodeRule{Weight: 50, HandlingPriority: 1}
	c.Nodes[2].Rules[1] = NodeRule{Weight: 50, HandlingPriority: 2}
	tests := []struct {
		name          string
		up            []NodeID
		single, deflt NodeID
	}{
		{"all up", []NodeID{1, 2, 3}, 2, 1},
		{"2 down", []NodeID{1, 3}, 3, 1},
		{"1 down", []NodeID{2, 3}, 2, 2},
		{"none", nil, NoNode, NoNode},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			o := Assign(c, tc.up)
			for b := 0; b < NumBuckets; b++ {
				if got := o.Rules[1][b]; got != tc.single {
					t.Fatalf("single-host bucket %d owner %d, want %d", b, got, tc.single)
				}
				if got := o.Rules[DefaultRule][b]; got != tc.deflt {
					t.Fatalf("default bucket %d owner %d, want %d", b, got, tc.deflt)
				}
			}
		})
	}
}

func TestDisabledAndDrainingRules(t *testing.T) {
	c := testConfig(50, 50)
	c.Rules[0].State = RuleDraining
	for _, id := range ids(2) {
		if got := Assign(c, ids(2)).Owned(id)[1]; got != nil {
			t.Errorf("draining rule gives node %d %d new buckets, want none", id, got.Count())
		}
	}
	// A node draining one rule keeps the tree: the other takes exactly its buckets.
	c = testConfig(50, 50)
	before := Assign(c, ids(2))
	c.Nodes[0].Rules[1] = NodeRule{Weight: 50, State: RuleDraining}
	after := Assign(c, ids(2))
	if after.Owned(1)[1] != nil {
		t.Errorf("node 1 drains rule 1 but still owns buckets")
	}
	if moved, _ := movedBuckets(before, after); moved != before.Owned(1)[1].Count() {
		t.Errorf("node drain moved %d buckets, want %d", moved, before.Owned(1)[1].Count())
	}
}

func TestAssignerMatchesAssign(t *testing.T) {
	c := testConfig(50, 50, 50, 50)
	c.Rules = append(c.Rules, Rule{ID: 2, PortLo: 443, PortHi: 443, Proto: ProtoTCP, Mode: ModeMultiple})
	var a Assigner
	steps := []func(){
		func() {},
		func() { c.Nodes[1].Rules[1] = NodeRule{Weight: 100} },
		func() { c.Rules = append(c.Rules, Rule{ID: 3, PortLo: 53, PortHi: 53, Proto: ProtoUDP}) },
		func() { c.Seed++ },
		func() { c.Rules[0].State = RuleDraining },
	}
	for i, step := range steps {
		step()
		for _, up := range [][]NodeID{{1, 2, 3, 4}, {1, 3}, {2, 3, 4}, {1, 2, 3, 4}} {
			got, want := a.Assign(c, up), Assign(c, up)
			for id, wt := range want.Rules {
				if *got.Rules[id] != *wt {
					t.Fatalf("step %d, eligible %v: rule %d differs from a fresh Assign", i, up, id)
				}
			}
		}
	}
}

func BenchmarkAssignerOneRuleChanged(b *testing.B) {
	c := testConfig(50, 50, 50)
	for id := RuleID(2); id <= 20; id++ {
		c.Rules = append(c.Rules, Rule{ID: id, PortLo: uint16(8000 + id), PortHi: uint16(8000 + id), Proto: ProtoTCP})
	}
	var a Assigner
	a.Assign(c, ids(3))
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		c.Nodes[0].Rules[1] = NodeRule{Weight: 1 + i%100}
		a.Assign(c, ids(3))
	}
}

func BenchmarkAssignTwentyRules(b *testing.B) {
	c := testConfig(50, 50, 50)
	for id := RuleID(2); id <= 20; id++ {
		c.Rules = append(c.Rules, Rule{ID: id, PortLo: uint16(8000 + id), PortHi: uint16(8000 + id), Proto: ProtoTCP})
	}
	for i := 0; i < b.N; i++ {
		Assign(c, ids(3))
	}
}

func TestSingleBucketFastPathAgrees(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for trial := 0; trial < 20; trial++ {
		n := 2 + rng.IntN(12)
		w := make([]int, n)
		for i := range w {
			w[i] = rng.IntN(101)
			if trial%2 == 0 {
				w[i] = DefaultWeight // ties everywhere
			}
		}
		c := testConfig(w...)
		var up []NodeID
		for _, id := range ids(n) {
			if rng.IntN(3) == 0 {
				up = append(up, id)
			}
		}
		fast := Assign(c, up)
		singleFastPath = false
		slow := Assign(c, up)
		singleFastPath = true
		if *fast.Rules[1] != *slow.Rules[1] {
			t.Fatalf("weights %v, eligible %v: the one-bucket fast path changes the table", w, up)
		}
	}
}

func BenchmarkAssignFewEligible(b *testing.B) {
	for _, n := range []int{32, 64} {
		c := testConfig(make([]int, n)...)
		for i := range c.Nodes {
			c.Nodes[i].Rules[1] = NodeRule{Weight: DefaultWeight}
		}
		for _, up := range []int{n, n / 2, 1} {
			b.Run(fmt.Sprintf("%d-nodes-%d-eligible", n, up), func(b *testing.B) {
				for i := 0; i < b.N; i++ {
					Assign(c, ids(up))
				}
			})
		}
	}
}

// TestGroupMatchesFullWalk: group, which sorts only the bands of scores
// its walk reaches, splits exactly as a walk over every (bucket, candidate)
// pair sorted at once (the definition every node and every release must
// agree on), for random buckets, candidates and weights, with its scratch
// reused across calls of every size and without one.
func TestGroupMatchesFullWalk(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 4096))
	var kept scratch
	for round := range 300 {
		nc := 1 + rng.IntN(80)
		cands := make([]candidate, nc)
		for i := range cands {
			w := DefaultWeight
			if round%2 == 1 {
				w = 1 + rng.IntN(100)
			}
			cands[i] = candidate{id: NodeID(1 + rng.IntN(1000)*100 + i), weight: w, takes: rng.IntN(2) == 0}
		}
		nb := 1 + rng.IntN(NumBuckets)
		if round%3 == 0 {
			nb = NumBuckets
		}
		buckets := make([]uint16, 0, nb)
		for _, b := range rng.Perm(NumBuckets)[:nb] {
			buckets = append(buckets, uint16(b))
		}
		seed := rng.Uint32()
		want := fullWalk(seed, buckets, cands)
		for _, sc := range []*scratch{nil, &kept} {
			s := splitter{seed: seed, scratch: sc}
			got := s.group(buckets, cands)
			for ci := range cands {
				if !slices.Equal(got[ci], want[ci]) {
					t.Fatalf("round %d (%d buckets, %d candidates, scratch %v): candidate %d's group differs from the full walk:\n got %v\nwant %v",
						round, nb, nc, sc != nil, ci, got[ci], want[ci])
				}
			}
		}
	}
}

// fullWalk is group's definition: every pair scored, all sorted, walked
// from the highest score down.
func fullWalk(seed uint32, buckets []uint16, cands []candidate) [][]uint16 {
	quota := apportion(len(buckets), cands, func(ci int) uint32 {
		return Hash(seed, uint32(buckets[0])|1<<16, uint32(cands[ci].id))
	})
	var keys []uint64
	for ci, cd := range cands {
		for _, b := range buckets {
			keys = append(keys, uint64(Hash(seed, uint32(b), uint32(cd.id)))<<32|uint64(b)<<16|uint64(ci))
		}
	}
	slices.Sort(keys)
	taken := map[uint16]bool{}
	groups := make([][]uint16, len(cands))
	for i := len(keys) - 1; i >= 0; i-- {
		b, ci := uint16(keys[i]>>16), int(keys[i]&0xffff)
		if taken[b] || len(groups[ci]) == quota[ci] {
			continue
		}
		taken[b] = true
		groups[ci] = append(groups[ci], b)
	}
	return groups
}

// TestAssignerSplitMatchesAssign: an Assigner, which keeps each rule's
// first split between views, gives a fresh Assign's tables for random
// eligible sets of 8, 32 and 64 nodes, also across weight changes and a
// node registered later (the split is made again when the candidates
// change).
func TestAssignerSplitMatchesAssign(t *testing.T) {
	rng := rand.New(rand.NewPCG(28, 64))
	for _, n := range []int{8, 32, 64} {
		w := make([]int, n)
		for i := range w {
			w[i] = DefaultWeight
		}
		c := testConfig(w...)
		c.Rules = append(c.Rules, Rule{ID: 2, PortLo: 443, PortHi: 443, Proto: ProtoTCP, Mode: ModeMultiple, Affinity: AffinitySingle})
		var a Assigner
		for step := range 40 {
			switch step {
			case 15:
				c.Nodes[3].Rules[1] = NodeRule{Weight: 30}
			case 25:
				c.Nodes = append(c.Nodes, Node{ID: NodeID(n + 1), HostPriority: n + 1})
			}
			var up []NodeID
			for _, node := range c.Nodes {
				if rng.IntN(10) > 0 || step%5 == 0 {
					up = append(up, node.ID)
				}
			}
			got, want := a.Assign(c, up), Assign(c, up)
			for id, wt := range want.Rules {
				if *got.Rules[id] != *wt {
					t.Fatalf("%d nodes, step %d, %d eligible: rule %d differs from a fresh Assign", n, step, len(up), id)
				}
			}
		}
	}
}

// TestAssignerKeepsSplitOnRepeat: a view assigned twice (the agent's
// reconciler does, for hand-overs and for what it keeps) keeps the rule's
// split for the next view, which then places the kept split instead of
// scoring every bucket for every candidate again.
func TestAssignerKeepsSplitOnRepeat(t *testing.T) {
	w := make([]int, 16)
	for i := range w {
		w[i] = DefaultWeight
	}
	c := testConfig(w...)
	all, less := ids(16), ids(15)
	var a Assigner
	a.Assign(c, all)
	if len(a.split) != 1 {
		t.Fatalf("after the first view: %d splits kept, want 1", len(a.split))
	}
	var first *splits
	for _, sp := range a.split {
		first = sp
	}
	a.Assign(c, all)
	if len(a.split) != 1 {
		t.Fatalf("after the same view again: %d splits kept, want 1", len(a.split))
	}
	got := a.Assign(c, less)
	for _, sp := range a.split {
		if sp != first {
			t.Fatal("the next view split every bucket again instead of placing the kept split")
		}
	}
	if want := Assign(c, less); *got.Rules[1] != *want.Rules[1] {
		t.Fatal("the next view's table differs from a fresh Assign")
	}
}

// BenchmarkAssignerViewChange: a view change that drops one node of 64 and
// the next that brings it back, with the split kept (the agent's case),
// against a fresh Assign of the same views.
func BenchmarkAssignerViewChange(b *testing.B) {
	w := make([]int, 64)
	for i := range w {
		w[i] = DefaultWeight
	}
	c := testConfig(w...)
	all, less := ids(64), ids(63)
	b.Run("kept-split", func(b *testing.B) {
		var a Assigner
		a.Assign(c, all)
		i := 0
		for b.Loop() {
			if i++; i%2 == 0 {
				a.Assign(c, all)
			} else {
				a.Assign(c, less)
			}
		}
	})
	// Each view assigned twice, as the agent's reconciler does.
	b.Run("kept-split-twice", func(b *testing.B) {
		var a Assigner
		a.Assign(c, all)
		i := 0
		for b.Loop() {
			v := all
			if i++; i%2 == 1 {
				v = less
			}
			a.Assign(c, v)
			a.Assign(c, v)
		}
	})
	b.Run("fresh", func(b *testing.B) {
		i := 0
		for b.Loop() {
			if i++; i%2 == 0 {
				Assign(c, all)
			} else {
				Assign(c, less)
			}
		}
	})
	// A storm: each view leaves out another 10 of the 64 (of 20 that
	// flap), as in a lab whose nodes starve for CPU.
	views := make([][]NodeID, 16)
	rng := rand.New(rand.NewPCG(5, 5))
	for v := range views {
		out := map[NodeID]bool{}
		for len(out) < 10 {
			out[NodeID(1+rng.IntN(20))] = true
		}
		for _, id := range all {
			if !out[id] {
				views[v] = append(views[v], id)
			}
		}
	}
	b.Run("kept-split-storm", func(b *testing.B) {
		var a Assigner
		i := 0
		for b.Loop() {
			a.Assign(c, views[i%len(views)])
			i++
		}
	})
}

// BenchmarkNewTables: the tables of one node of 64 for one rule, as each
// push computes them (the node's share accepted, a few buckets draining
// here and at peers).
func BenchmarkNewTables(b *testing.B) {
	w := make([]int, 64)
	for i := range w {
		w[i] = DefaultWeight
	}
	c := testConfig(w...)
	o := Assign(c, ids(64))
	accept, peers, mine := Set{}, Set{}, Set{}
	for id, own := range o.Rules {
		for bk, n := range own {
			switch {
			case n == 1:
				accept.Add(id, uint16(bk))
			case bk%7 == 0:
				peers.Add(id, uint16(bk))
			case bk%11 == 0:
				mine.Add(id, uint16(bk))
			}
		}
	}
	for b.Loop() {
		NewTables(c, 1, accept, peers, mine)
	}
}

// TestOwnersOnlyGainWhenOthersLeave: with the same config, a node that
// stays eligible while others leave the eligible set keeps every bucket it
// owned, in every rule (multiple-host of any weights, single-host, the
// default rule, rules and nodes draining): a node that leaves moves only
// its own buckets. Random configs, random chains of departures, through
// Assign and through one Assigner (kept splits).
func TestOwnersOnlyGainWhenOthersLeave(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	for trial := 0; trial < 25; trial++ {
		n := 2 + rng.IntN(24)
		c := testConfig(make([]int, n)...)
		c.Rules = append(c.Rules,
			Rule{ID: 2, PortLo: 443, PortHi: 443, Proto: ProtoTCP, Mode: ModeSingle},
			Rule{ID: 3, PortLo: 53, PortHi: 53, Proto: ProtoUDP, Mode: ModeMultiple, Affinity: AffinitySingle})
		for i := range c.Nodes {
			nd := &c.Nodes[i]
			nd.HostPriority = 1 + rng.IntN(2*n)
			nd.Rules[1] = NodeRule{Weight: rng.IntN(101)}
			nd.Rules[2] = NodeRule{Weight: 50, HandlingPriority: 1 + rng.IntN(2*n)}
			r3 := NodeRule{Weight: 1 + rng.IntN(100)}
			if rng.IntN(8) == 0 {
				r3.State = RuleDraining
			}
			nd.Rules[3] = r3
		}
		var a Assigner
		up := ids(n)
		prev, prevA := Assign(c, up), a.Assign(c, up)
		for len(up) > 1 {
			for k := 1 + rng.IntN(min(3, len(up)-1)); k > 0; k-- {
				i := rng.IntN(len(up))
				up = slices.Delete(up, i, i+1)
			}
			next, nextA := Assign(c, up), a.Assign(c, up)
			for _, id := range up {
				for _, pair := range [][2]*Owners{{prev, next}, {prevA, nextA}} {
					before, after := pair[0].Owned(id), pair[1].Owned(id)
					for rid, set := range before {
						kept := after[rid]
						if kept == nil {
							kept = new(Bitmap)
						}
						for w := range set {
							if lost := set[w] &^ kept[w]; lost != 0 {
								t.Fatalf("trial %d: node %d lost buckets %#x of word %d, rule %d, when eligible went to %v", trial, id, lost, w, rid, up)
							}
						}
					}
				}
			}
			prev, prevA = next, nextA
		}
	}
}

// BenchmarkAssignerWeightChange64: an Assigner at 64 nodes when one node's
// weight on the rule changes, as a rule added or reweighted: the rule's
// split is made afresh (every bucket scored for every candidate).
func BenchmarkAssignerWeightChange64(b *testing.B) {
	w := make([]int, 64)
	for i := range w {
		w[i] = DefaultWeight
	}
	c := testConfig(w...)
	all := ids(64)
	var a Assigner
	a.Assign(c, all)
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		i++
		c.Nodes[0].Rules[1] = NodeRule{Weight: 1 + i%100}
		a.Assign(c, all)
	}
}
