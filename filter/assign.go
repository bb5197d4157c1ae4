package filter

import (
	"cmp"
	"fmt"
	"slices"
)

// Owners is the result of the ownership function for one view: the owner of
// every bucket of every rule, NoNode where nobody may take new connections.
type Owners struct {
	Rules map[RuleID]*[NumBuckets]NodeID
	Maps  map[RuleID]*Mapping // what each rule's bucket numbers mean (Config.Mappings)
}

// Assign computes every bucket's owner given the eligible nodes (live,
// started, healthy). Every node that runs it with the same config and
// eligible set gets the same answer.
//
// Multiple-host rules spread buckets with a balanced preference tree over
// the registered nodes of positive weight: the buckets are split among those
// nodes in exact proportion to their weights (largest remainder), each bucket
// going to the node that scores it highest while that node has room; the
// buckets of a node that is not eligible are split again, the same way, among
// the others. A bucket's owner is thus the first eligible node of a fixed,
// per-bucket preference order, so a node leaving moves exactly its own
// buckets and a node coming back takes exactly those back; and because every
// split is proportional, shares follow the weights for any set of failures,
// not only on average.
func Assign(c *Config, eligible []NodeID) *Owners {
	return (*Assigner)(nil).Assign(c, eligible)
}

// Assigner computes Assign, remembering each rule's table so that a rule
// whose inputs did not change is not computed again: adding a rule or
// changing one node's weight on one rule recomputes that rule only. A nil
// Assigner remembers nothing. It is not safe for concurrent use.
type Assigner struct {
	memo map[string]ruleTable // by ruleInputs
	next map[string]ruleTable // filled during one Assign
	// split and nextSplit: each rule's splits (by splitKey), which do not
	// depend on who is eligible: a view that only adds or drops nodes
	// re-splits nothing it split before.
	split, nextSplit map[string]*splits
	mapsOf           *Config // the config maps was computed from
	maps             map[RuleID]*Mapping
	scratch          scratch
}

// Assign is Assign with memory. The tables it returns are shared with later
// calls and must not be modified.
func (a *Assigner) Assign(c *Config, eligible []NodeID) *Owners {
	elig := make(map[NodeID]bool, len(eligible))
	for _, id := range eligible {
		if c.Node(id) != nil {
			elig[id] = true
		}
	}
	if a != nil {
		a.next = make(map[string]ruleTable, len(c.Rules))
		a.nextSplit = make(map[string]*splits, len(c.Rules))
		defer func() { a.memo, a.next, a.split, a.nextSplit = a.next, nil, a.nextSplit, nil }()
	}
	o := &Owners{Rules: make(map[RuleID]*[NumBuckets]NodeID, len(c.Rules)+1)}
	switch {
	case a == nil:
		o.Maps = c.Mappings()
	case a.mapsOf == c:
		o.Maps = a.maps
	default:
		o.Maps = c.Mappings()
		a.mapsOf, a.maps = c, o.Maps
	}
	o.Rules[DefaultRule] = fill(defaultHost(c, elig))
	for i := range c.Rules {
		r := &c.Rules[i]
		if a == nil {
			o.Rules[r.ID] = assignRule(c, r, elig, nil).t
			continue
		}
		key := ruleInputs(c, r, elig)
		rt, ok := a.memo[key]
		if !ok {
			rt = assignRule(c, r, elig, a)
		}
		if rt.splits != nil {
			// Kept for the next views also when this one's table was
			// remembered: the agent assigns each view more than once, and
			// a split dropped on the second call was made again, every
			// bucket scored for every candidate, at the next view change.
			a.nextSplit[rt.splitKey] = rt.splits
		}
		a.next[key] = rt
		o.Rules[r.ID] = rt.t
	}
	return o
}

// ruleTable is a rule's table and the splits it was placed from (none for
// a rule that is not split).
type ruleTable struct {
	t        *[NumBuckets]NodeID
	splitKey string
	splits   *splits
}

// ruleInputs is everything a rule's table depends on, as a map key.
func ruleInputs(c *Config, r *Rule, elig map[NodeID]bool) string {
	b := make([]byte, 0, 32+len(c.Nodes)*16)
	b = fmt.Appendf(b, "%d|%v|%d-%d|%d|%d|%d|%d|", c.Seed, r.VIP, r.PortLo, r.PortHi, r.Proto, r.Mode, r.Affinity, r.State)
	b = fmt.Appendf(b, "%d|", r.ID)
	for i := range c.Nodes {
		n := &c.Nodes[i]
		nr := n.RuleOf(r.ID)
		b = fmt.Appendf(b, "%d:%t:%d:%d:%d,", n.ID, elig[n.ID], nr.Weight, nr.HandlingPriority, nr.State)
	}
	return string(b)
}

func fill(id NodeID) *[NumBuckets]NodeID {
	t := new([NumBuckets]NodeID)
	if id != NoNode {
		for b := range t {
			t[b] = id
		}
	}
	return t
}

// defaultHost is the eligible node with the lowest host priority.
func defaultHost(c *Config, elig map[NodeID]bool) NodeID {
	best, bestPrio := NoNode, 0
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if elig[n.ID] && (best == NoNode || n.HostPriority < bestPrio) {
			best, bestPrio = n.ID, n.HostPriority
		}
	}
	return best
}

// assignRule computes rule r's table; with an Assigner, from the splits it
// keeps, which it returns with the table (the caller keeps them).
func assignRule(c *Config, r *Rule, elig map[NodeID]bool, a *Assigner) ruleTable {
	if r.Mode == ModeDisabled || r.State != RuleEnabled {
		return ruleTable{t: fill(NoNode)}
	}
	takes := func(n *Node) bool { return elig[n.ID] && n.RuleOf(r.ID).State == RuleEnabled }
	if r.Mode == ModeSingle {
		best, bestPrio := NoNode, 0
		for i := range c.Nodes {
			n := &c.Nodes[i]
			if p := n.RuleOf(r.ID).HandlingPriority; takes(n) && (best == NoNode || p < bestPrio) {
				best, bestPrio = n.ID, p
			}
		}
		return ruleTable{t: fill(best)}
	}
	var cands []candidate
	for i := range c.Nodes {
		n := &c.Nodes[i]
		if w := n.RuleOf(r.ID).Weight; w > 0 {
			cands = append(cands, candidate{id: n.ID, weight: w, takes: takes(n)})
		}
	}
	t := new([NumBuckets]NodeID)
	all := make([]uint16, NumBuckets)
	for b := range all {
		all[b] = uint16(b)
	}
	s := splitter{seed: c.Seed ^ uint32(r.ID)*0x9e3779b9, owners: t}
	if a != nil {
		s.scratch = &a.scratch
	}
	if a == nil || len(cands) == 0 {
		s.spread(all, cands)
		return ruleTable{t: t}
	}
	// The first split is most of the work (every bucket scored for every
	// candidate), then the split of each candidate's group among the
	// others when it does not take traffic: keep them for the next views.
	key := splitKey(s.seed, cands)
	sp := a.split[key]
	if sp == nil {
		sp = &splits{top: s.group(all, cands), sub: map[NodeID][][]uint16{}}
	}
	s.place(sp.top, cands, sp.sub)
	return ruleTable{t: t, splitKey: key, splits: sp}
}

// splits are a rule's kept splits: top, every bucket among the
// candidates; sub, by candidate, its group among the others (made when
// a view first leaves it out). Neither depends on who is eligible. In a
// 64-node lab's storm of view changes, splitting the groups of the nodes
// left out again for every view was a fifth of the agents' CPU.
type splits struct {
	top [][]uint16
	sub map[NodeID][][]uint16
}

// splitKey is what a split of every bucket depends on: the seed and the
// candidates with their weights, not whether they take traffic.
func splitKey(seed uint32, cands []candidate) string {
	b := fmt.Appendf(make([]byte, 0, 8+len(cands)*8), "%d|", seed)
	for _, cd := range cands {
		b = fmt.Appendf(b, "%d:%d,", cd.id, cd.weight)
	}
	return string(b)
}

type candidate struct {
	id     NodeID
	weight int
	takes  bool // eligible for this rule
}

type splitter struct {
	seed    uint32
	owners  *[NumBuckets]NodeID
	scratch *scratch // nil: group allocates its own
}

// spread gives each bucket in buckets to a candidate, in proportion to the
// weights, then hands the share of each candidate that does not take traffic
// to the remaining candidates the same way.
func (s *splitter) spread(buckets []uint16, cands []candidate) {
	if len(buckets) == 0 || len(cands) == 0 {
		return // owners stay NoNode
	}
	if len(buckets) == 1 && singleFastPath {
		s.spreadOne(buckets[0], cands)
		return
	}
	s.place(s.group(buckets, cands), cands, nil)
}

// group splits buckets among cands in proportion to their weights, each
// bucket to the candidate that scores it highest while that one has room:
// the groups, by candidate. It does not look at who takes traffic, and
// leaves buckets alone.
//
// The split walks every (bucket, candidate) pair from the highest score
// down and gives the bucket to the candidate if neither is done. Most pairs
// are of a bucket already taken or a candidate already full by the time the
// walk reaches them, and stay so: the pairs are cut into 256 bands by their
// score's top byte (one counting pass, one scatter), and each band, as the
// walk reaches it, is first rid of such pairs and then sorted. A full
// sort of every pair made a new rule cost each node of 64 about 14 ms and
// 12.7 MB of garbage; all 64 at once on a lab's two cores set off a storm
// of late heartbeats and false deaths (docs/BENCHMARKS-LOG.md).
func (s *splitter) group(buckets []uint16, cands []candidate) [][]uint16 {
	quota := apportion(len(buckets), cands, func(ci int) uint32 {
		// Ties in rounding go by a hash of the group, so that the extra
		// buckets of many small groups do not all fall to one node.
		return Hash(s.seed, uint32(buckets[0])|1<<16, uint32(cands[ci].id))
	})
	// A score is Hash(seed, bucket, candidate): the bucket's round of the
	// hash is the same for every candidate, and is done once.
	var first [NumBuckets]uint32
	for i, b := range buckets {
		first[i] = murmurRound(s.seed, uint32(b))
	}
	// Every (bucket, candidate) pair as a key that sorts by score, then
	// bucket, then candidate; counted by band.
	n := len(buckets) * len(cands)
	keys := s.scratch.keys(n)
	var count [256]int
	i := 0
	for ci, cd := range cands {
		for j, b := range buckets {
			score := finish(murmurRound(first[j], uint32(cd.id)), 2)
			keys[i] = uint64(score)<<32 | uint64(b)<<16 | uint64(ci)
			count[score>>24]++
			i++
		}
	}
	var start, next [256]int
	pos := 0
	for d, c := range count {
		start[d], next[d] = pos, pos
		pos += c
	}
	banded := s.scratch.banded(n)
	for _, k := range keys {
		d := k >> 56
		banded[next[d]] = k
		next[d]++
	}
	var taken [NumBuckets / 64]uint64
	groups := make([][]uint16, len(cands))
	left := len(buckets)
	done := func(k uint64) bool {
		b, ci := uint16(k>>16), int(k&0xffff)
		return taken[b/64]&(1<<(b%64)) != 0 || len(groups[ci]) == quota[ci]
	}
	for d := 255; d >= 0 && left > 0; d-- {
		// A pair whose bucket is taken or whose candidate is full stays
		// so: drop those before sorting. Past the first bands, that is
		// nearly every pair, and the walk's tail (the last buckets, left
		// to the few candidates with room) sorts only what it can use.
		band := banded[start[d] : start[d]+count[d]]
		live := band[:0]
		for _, k := range band {
			if !done(k) {
				live = append(live, k)
			}
		}
		slices.Sort(live)
		for j := len(live) - 1; j >= 0 && left > 0; j-- {
			k := live[j]
			if done(k) {
				continue
			}
			b, ci := uint16(k>>16), int(k&0xffff)
			taken[b/64] |= 1 << (b % 64)
			groups[ci] = append(groups[ci], b)
			left--
		}
	}
	return groups
}

// scratch is group's working memory, kept by an Assigner from one split to
// the next: at 64 nodes two arrays of 262,144 keys.
type scratch struct {
	k, b []uint64
}

// keys returns room for n keys: the first array, or a new one for a nil
// scratch.
func (sc *scratch) keys(n int) []uint64 {
	if sc == nil {
		return make([]uint64, n)
	}
	sc.k = slices.Grow(sc.k[:0], n)[:n]
	return sc.k
}

// banded is keys for the second array.
func (sc *scratch) banded(n int) []uint64 {
	if sc == nil {
		return make([]uint64, n)
	}
	sc.b = slices.Grow(sc.b[:0], n)[:n]
	return sc.b
}

// place gives each candidate that takes traffic its group, and spreads
// the groups of the others over the remaining candidates. It leaves groups
// alone (a kept split is placed again for later views). kept, if not nil,
// holds those groups' splits among the remaining candidates, by candidate,
// and takes the ones it makes (splits.sub); deeper levels, small groups,
// are split afresh.
func (s *splitter) place(groups [][]uint16, cands []candidate, kept map[NodeID][][]uint16) {
	for ci, cd := range cands {
		if cd.takes {
			for _, b := range groups[ci] {
				s.owners[b] = cd.id
			}
			continue
		}
		if len(groups[ci]) == 0 {
			continue
		}
		rest := make([]candidate, 0, len(cands)-1)
		rest = append(rest, cands[:ci]...)
		rest = append(rest, cands[ci+1:]...)
		if kept == nil || len(groups[ci]) == 1 && singleFastPath || len(rest) == 0 {
			s.spread(groups[ci], rest)
			continue
		}
		g, ok := kept[cd.id]
		if !ok {
			g = s.group(groups[ci], rest)
			kept[cd.id] = g
		}
		s.place(g, rest, nil)
	}
}

// singleFastPath lets spread place a lone bucket without splitting; tests
// turn it off to check that both ways agree.
var singleFastPath = true

// spreadOne is spread for a group of one bucket. Its quota goes to the
// candidate with the largest remainder, which for n = 1 is the largest
// weight (ties by the tie hash) whatever the other candidates are; so the
// recursion through candidates that do not take traffic is the same as
// walking one fixed order. It saves the deep recursion that many failed
// nodes would otherwise cost (64 nodes, one eligible: seconds).
func (s *splitter) spreadOne(b uint16, cands []candidate) {
	best, bestW, bestTie := NoNode, -1, uint32(0)
	for _, cd := range cands {
		if !cd.takes {
			continue
		}
		tie := Hash(s.seed, uint32(b)|1<<16, uint32(cd.id))
		if cd.weight > bestW || cd.weight == bestW && tie > bestTie {
			best, bestW, bestTie = cd.id, cd.weight, tie
		}
	}
	s.owners[b] = best
}

// apportion splits n among the candidates in proportion to their weights,
// by largest remainder (ties broken by tie), so the parts sum to n.
func apportion(n int, cands []candidate, tie func(int) uint32) []int {
	total := 0
	for _, c := range cands {
		total += c.weight
	}
	quota := make([]int, len(cands))
	rem := make([]int, len(cands))
	left := n
	for i, c := range cands {
		quota[i] = n * c.weight / total
		rem[i] = n * c.weight % total
		left -= quota[i]
	}
	order := make([]int, len(cands))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int {
		if rem[a] != rem[b] {
			return rem[b] - rem[a]
		}
		return cmp.Compare(tie(b), tie(a))
	})
	for i := 0; i < left; i++ {
		quota[order[i]]++
	}
	return quota
}
