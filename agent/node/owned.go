package node

import (
	"sync"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
)

// lazySet is a grant (buckets and their mappings) computed when first read. The membership machine
// asks for owned(view) and intersections when views change, and computing
// an owner table takes milliseconds to a tenth of a second (more rules,
// more nodes): far too long for the goroutine that must send heartbeats on
// time. So membership only builds the expression, and the reconciler, which
// needs the set to build tables, computes it. The machine never looks
// inside a set; the nil *lazySet is the empty set.
type lazySet struct {
	once sync.Once
	f    func() filter.Grant // dropped once computed, with what it refers to
	v    filter.Grant
	// within, when set, is a view whose owned set holds this one: the view
	// of owned(view), and of what was intersected with it.
	within *heartbeat.View
}

func (l *lazySet) get() filter.Grant {
	if l == nil {
		return filter.Grant{Buckets: filter.Set{}}
	}
	l.once.Do(func() { l.v, l.f = l.f(), nil })
	return l.v
}

func lazyIntersect(a, b *lazySet) *lazySet {
	out := &lazySet{f: func() filter.Grant { return a.get().Intersect(b.get()) }}
	if b != nil {
		out.within = b.within
	}
	return out
}

// grows reports whether node self owns in view to every bucket it owns in
// view from: to keeps from's rules and seed and self, and only drops
// nodes. The ownership function moves only the buckets of the nodes that
// leave (filter.TestOwnersOnlyGainWhenOthersLeave), so a view that a
// death, a node leaving or a node lagging makes from the last one
// releases nothing here.
func grows(self filter.NodeID, from, to heartbeat.View) bool {
	if from.RulesIndex != to.RulesIndex || from.Seed != to.Seed || !to.Has(uint32(self)) {
		return false
	}
	for _, id := range to.Eligible {
		if !from.Has(id) {
			return false
		}
	}
	return true
}

// sharedAssigner is the node's one filter.Assigner, for the goroutines
// that compute lazy sets and tables (the reconciler; Held, for a restart
// record, once the reconciler stopped; tests). Membership never takes its lock. One,
// because the Assigner remembers the tables of its last call: the
// reconciler's own, for hand-overs, computed every new rule's table a
// second time in each node (perf record of rule changes in a 32-node lab:
// the two halves of the agents' assignment work, equal).
type sharedAssigner struct {
	mu sync.Mutex
	a  filter.Assigner
}

// assign is filter.Assigner.Assign; the owners it returns must not be
// modified.
func (s *sharedAssigner) assign(cfg *filter.Config, eligible []filter.NodeID) *filter.Owners {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.a.Assign(cfg, eligible)
}

func (s *sharedAssigner) owned(cfg *filter.Config, eligible []filter.NodeID, self filter.NodeID) filter.Grant {
	return s.assign(cfg, eligible).Grant(self)
}
