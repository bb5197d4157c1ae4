package node

import (
	"sync"

	"github.com/shoalnet/shoal/filter"
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
}

func (l *lazySet) get() filter.Grant {
	if l == nil {
		return filter.Grant{Buckets: filter.Set{}}
	}
	l.once.Do(func() { l.v, l.f = l.f(), nil })
	return l.v
}

func lazyIntersect(a, b *lazySet) *lazySet {
	return &lazySet{f: func() filter.Grant { return a.get().Intersect(b.get()) }}
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
