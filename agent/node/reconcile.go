package node

import (
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// plan is everything one reconcile decides from its inputs.
type plan struct {
	tables   *filter.Tables
	draining filter.Set // buckets to announce: held connections outside the accepting set
}

// planTables is the pure core of the reconcile loop: from the rules, the
// accepting set the heartbeat machine converged on, the buckets peers still
// drain, and the buckets this node holds connections in, it computes the
// node's bucket states. A stopped or suspended node, and one whose plug is
// pulled, keeps nothing; a draining node keeps its connections' buckets.
func planTables(cfg *filter.Config, self filter.NodeID, admin rules.AdminState, plugged bool,
	accept, peersDraining, held filter.Set) plan {
	var draining filter.Set
	switch {
	case plugged:
		accept = nil
	case admin == rules.AdminStopped || admin == rules.AdminSuspended:
		// Stop cuts the node's connections at once, as NLB's stop does.
	default:
		draining = held.Minus(accept)
	}
	return plan{
		tables:   filter.NewTables(cfg, self, accept, peersDraining, draining),
		draining: draining,
	}
}

// peersDraining returns the buckets other nodes hold connections in, in
// this node's coordinates (rules applied up to index). A live peer that has
// applied another rules index names its buckets under other mappings, and
// its connections may sit in any bucket here; until it catches up every
// bucket counts as dirty, so none is taken clean from it. So too while a
// peer that died may still serve the connections it holds (MayHold: a
// stalled agent whose XDP program runs on): the buckets taken from it take
// new connections here, and leave its connections to it. Otherwise it is
// the union of the live peers' announcements, built straight into bitmaps
// here, when tables are computed: the machine once built it for every
// status, through sorted lists, and in a rule change that remaps a 32-node
// cluster's buckets it was a tenth of the agents' CPU (perf record).
func peersDraining(cfg *filter.Config, index uint64, peers []heartbeat.PeerStatus) filter.Set {
	for _, p := range peers {
		if p.Live && p.RulesIndex != index || p.MayHold {
			all := filter.Set{}
			for _, id := range cfg.RuleIDs() {
				all[id] = full()
			}
			return all
		}
	}
	out := filter.Set{}
	for _, p := range peers {
		if !p.Live {
			continue
		}
		addBuckets(out, p.Draining)
	}
	return out
}

// addBuckets adds heartbeat's wire form of a bucket set to out. A remap's
// announcements name every bucket of a rule but the sender's own, from
// every peer: the bits are set in each rule's bitmap, not looked up
// bucket by bucket, and once a rule's bitmap is full the next lists for
// it are skipped (the union of 31 such lists was 0.38 ms a push,
// BenchmarkPeersDrainingRemap).
func addBuckets(out filter.Set, b heartbeat.Buckets) {
	for id, bs := range b {
		if len(bs) == 0 {
			continue
		}
		m := out[filter.RuleID(id)]
		if m == nil {
			m = new(filter.Bitmap)
			out[filter.RuleID(id)] = m
		} else if m.Count() == filter.NumBuckets {
			continue
		}
		for _, k := range bs {
			if k < filter.NumBuckets {
				m.Add(k)
			}
		}
	}
}

func full() *filter.Bitmap {
	var m filter.Bitmap
	for i := range m {
		m[i] = ^uint64(0)
	}
	return &m
}

// toHeartbeat converts a bucket set to heartbeat's wire form.
func toHeartbeat(s filter.Set) heartbeat.Buckets {
	out := heartbeat.Buckets{}
	for id, m := range s {
		var bs []uint16
		for b := 0; b < filter.NumBuckets; b++ {
			if m.Has(uint16(b)) {
				bs = append(bs, uint16(b))
			}
		}
		if len(bs) > 0 {
			out[uint32(id)] = bs
		}
	}
	return out
}

// adminToHeartbeat maps the replicated admin state to the one advertised.
func adminToHeartbeat(a rules.AdminState) heartbeat.AdminState {
	switch a {
	case rules.AdminStarted:
		return heartbeat.Started
	case rules.AdminDraining:
		return heartbeat.Draining
	case rules.AdminSuspended:
		return heartbeat.Suspended
	}
	return heartbeat.Stopped
}

// stateCounts returns, per rule, how many buckets are in state st.
func stateCounts(t *filter.Tables, st filter.BucketState) map[filter.RuleID]int {
	out := map[filter.RuleID]int{}
	for id, states := range t.States {
		n := 0
		for _, s := range states {
			if s == st {
				n++
			}
		}
		if n > 0 {
			out[id] = n
		}
	}
	return out
}
