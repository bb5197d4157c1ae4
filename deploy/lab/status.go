package lab

import (
	"fmt"
	"slices"
	"sort"
	"time"
)

// NumBuckets is the number of buckets of every rule (filter.NumBuckets).
const NumBuckets = 4096

// NodeStatus is a node's `shoal status --json`.
type NodeStatus struct {
	NodeID     uint32         `json:"node_id"`
	NodeName   string         `json:"node_name"`
	Admin      string         `json:"admin"`
	Healthy    bool           `json:"healthy"`
	Converged  bool           `json:"converged"`
	RulesIndex uint64         `json:"rules_index"`
	View       View           `json:"view"`
	Accepting  map[string]int `json:"accepting"` // buckets accepted per rule id
	Draining   map[string]int `json:"draining"`  // buckets held only for connections, per rule id
	Dirty      map[string]int `json:"dirty"`     // accepted buckets another node still drains
	Live       []uint32       `json:"live"`
	// TablesAt is when the node's data-plane tables last changed: what
	// Accepting counts took effect then.
	TablesAt time.Time `json:"tables_at"`
}

// Settled returns nil when no node of st drains a bucket or accepts one
// another still drains: every packet of a connection that is gone is then
// taken by the bucket's owner, as every other packet. Otherwise the error
// names a node that does.
func Settled(st []NodeStatus) error {
	for _, s := range st {
		for r, n := range s.Draining {
			if n > 0 {
				return fmt.Errorf("%s drains %d buckets of rule %s", s.NodeName, n, r)
			}
		}
		for r, n := range s.Dirty {
			if n > 0 {
				return fmt.Errorf("%s takes %d buckets of rule %s dirty", s.NodeName, n, r)
			}
		}
	}
	return nil
}

// View is the membership view a node holds.
type View struct {
	Eligible   []uint32 `json:"eligible"`
	RulesIndex uint64   `json:"rules_index"`
	Seed       uint64   `json:"seed"`
}

// Ready returns nil when every node of st is converged on one view with want
// eligible nodes and the same rules index, or an error saying what is
// missing.
func Ready(st []NodeStatus, want int) error {
	if len(st) == 0 {
		return fmt.Errorf("no node answered")
	}
	first := sortedIDs(st[0].View.Eligible)
	for _, s := range st {
		switch {
		case !s.Converged:
			return fmt.Errorf("%s not converged", s.NodeName)
		case len(s.View.Eligible) != want:
			return fmt.Errorf("%s sees %d eligible nodes %v, want %d", s.NodeName, len(s.View.Eligible), s.View.Eligible, want)
		case !slices.Equal(sortedIDs(s.View.Eligible), first):
			return fmt.Errorf("%s sees eligible %v, %s sees %v", s.NodeName, s.View.Eligible, st[0].NodeName, st[0].View.Eligible)
		case s.RulesIndex != st[0].RulesIndex:
			return fmt.Errorf("%s at rules index %d, %s at %d", s.NodeName, s.RulesIndex, st[0].NodeName, st[0].RulesIndex)
		}
	}
	return nil
}

// RulesAt returns nil when every node has applied at least rules index idx.
func RulesAt(st []NodeStatus, idx uint64) error {
	for _, s := range st {
		if s.RulesIndex < idx {
			return fmt.Errorf("%s at rules index %d, want %d", s.NodeName, s.RulesIndex, idx)
		}
	}
	return nil
}

// RuleIDs returns the rule ids any node accepts buckets of, sorted.
func RuleIDs(st []NodeStatus) []string {
	set := map[string]bool{}
	for _, s := range st {
		for r := range s.Accepting {
			set[r] = true
		}
	}
	ids := make([]string, 0, len(set))
	for r := range set {
		ids = append(ids, r)
	}
	sort.Strings(ids)
	return ids
}

// Covered returns nil when the survivors st, without node dead, again own
// every bucket of every rule in rules: all converged, no survivor's view
// holds the dead node, and for each rule the survivors' accepted buckets sum
// to NumBuckets. Otherwise the error says what is missing.
func Covered(st []NodeStatus, rules []string, dead uint32) error {
	sum := map[string]int{}
	for _, s := range st {
		if !s.Converged {
			return fmt.Errorf("%s not converged", s.NodeName)
		}
		if slices.Contains(s.View.Eligible, dead) {
			return fmt.Errorf("%s still holds node %d in its view", s.NodeName, dead)
		}
		for r, n := range s.Accepting {
			sum[r] += n
		}
	}
	for _, r := range rules {
		if sum[r] != NumBuckets {
			return fmt.Errorf("rule %s: survivors accept %d of %d buckets", r, sum[r], NumBuckets)
		}
	}
	return nil
}

// CoveredSince is when the tables of st, which cover what Covered asks,
// were all in force: the latest of the nodes' TablesAt, or seen (when st
// was read) if a node does not say or says later. A failover is timed to
// it rather than to the poll that saw it, which came up to a poll's
// interval (and the round of status requests) later; a node whose tables
// changed again after they covered makes it later, never earlier, than
// the moment they covered.
func CoveredSince(st []NodeStatus, seen time.Time) time.Time {
	var latest time.Time
	for _, s := range st {
		if s.TablesAt.IsZero() {
			return seen
		}
		if s.TablesAt.After(latest) {
			latest = s.TablesAt
		}
	}
	if latest.IsZero() || latest.After(seen) {
		return seen
	}
	return latest
}

// Balance is, over the rules of rules that several nodes of st share, the
// most buckets one node accepts over the mean of st's nodes (1 is even);
// 0 if no rule is shared.
func Balance(st []NodeStatus, rules []string) float64 {
	worst := 0.0
	for _, r := range rules {
		most, sharing := 0, 0
		for _, s := range st {
			if n := s.Accepting[r]; n > 0 {
				most, sharing = max(most, n), sharing+1
			}
		}
		if sharing < 2 {
			continue // a single-host rule
		}
		worst = max(worst, float64(most)*float64(len(st))/NumBuckets)
	}
	return worst
}

// CoverFull returns nil when the nodes together accept exactly NumBuckets
// of each rule in rules (no gap, no bucket twice).
func CoverFull(st []NodeStatus, rules []string) error {
	return Covered(st, rules, 0)
}

func sortedIDs(ids []uint32) []uint32 {
	c := slices.Clone(ids)
	slices.Sort(c)
	return c
}
