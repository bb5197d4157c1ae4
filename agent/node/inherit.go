package node

import (
	"time"

	"github.com/shoalnet/shoal/agent/host"
	"github.com/shoalnet/shoal/filter"
)

// kernelState is what the tables in the kernel were computed from.
type kernelState struct {
	ok                      bool
	accept                  filter.Grant
	peersDraining, draining filter.Set
	healthy                 bool
}

// Inheritance is what the first membership machine of a restarted agent
// starts from (heartbeat.Machine.Inherit).
type Inheritance struct {
	accept        filter.Grant
	peersDraining filter.Set
	until         time.Time
	healthy       bool // the node was healthy when the previous agent stopped
}

// InheritFrom returns the Inheritance a restart record gives under the
// current rules: only the buckets of rules whose mapping is unchanged (or
// only narrower) mean the same flows; until is when the lease ends.
func InheritFrom(rr *host.RestartRecord, cfg *filter.Config, until time.Time) *Inheritance {
	return &Inheritance{accept: rr.Accept.Intersect(everything(cfg)), peersDraining: rr.PeersDraining, until: until, healthy: rr.Healthy}
}

// everything grants every bucket of every rule of cfg.
func everything(cfg *filter.Config) filter.Grant {
	g := filter.Grant{Buckets: filter.Set{}, Maps: cfg.Mappings()}
	for _, id := range cfg.RuleIDs() {
		g.Buckets[id] = full()
	}
	return g
}

// union returns the buckets in a or b; either may be nil.
func union(a, b filter.Set) filter.Set {
	out := filter.Set{}
	for _, s := range []filter.Set{a, b} {
		for id, m := range s {
			o := out[id]
			if o == nil {
				o = new(filter.Bitmap)
				out[id] = o
			}
			for i := range o {
				o[i] |= m[i]
			}
		}
	}
	return out
}

// Accepting is the accepting set the inherited tables hold.
func (in *Inheritance) Accepting() filter.Grant { return in.accept }

// PeersDraining is the buckets the inherited tables mark dirty.
func (in *Inheritance) PeersDraining() filter.Set { return in.peersDraining }

// Healthy: the node was healthy when the previous agent stopped.
func (in *Inheritance) Healthy() bool { return in.healthy }
