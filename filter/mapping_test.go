package filter

import (
	"math/rand/v2"
	"net/netip"
	"slices"
	"testing"
)

var (
	vipA = netip.MustParseAddr("198.18.0.1")
	vipB = netip.MustParseAddr("198.18.0.2")
	vipC = netip.MustParseAddr("198.18.0.3")
)

func mappingBase() *Config {
	return &Config{Seed: 7, VIPs: []netip.Addr{vipA, vipB}, Rules: []Rule{
		{ID: 1, VIP: vipA, PortLo: 80, PortHi: 80, Proto: ProtoTCP, Affinity: AffinityNone},
		{ID: 2, PortLo: 80, PortHi: 90, Proto: ProtoTCP, Affinity: AffinitySingle},
		{ID: 3, PortLo: 53, PortHi: 53, Proto: ProtoUDP, Affinity: AffinityNone},
	}}
}

// TestMappingChanges edits a configuration the ways an operator does and
// checks, per rule, whether its mapping (and so its fingerprint) changed
// and whether its buckets may be kept (the new mapping lies within the old).
func TestMappingChanges(t *testing.T) {
	type want struct{ changed, kept []RuleID } // rules not listed in changed are unchanged
	tests := []struct {
		name string
		edit func(c *Config)
		want want
	}{
		{"nothing", func(c *Config) {}, want{}},
		{"mode and state change no mapping", func(c *Config) {
			c.Rules[1].Mode, c.Rules[2].State = ModeSingle, RuleDisabled
		}, want{}},
		{"vip order", func(c *Config) { c.VIPs[0], c.VIPs[1] = c.VIPs[1], c.VIPs[0] }, want{}},
		{"seed", func(c *Config) { c.Seed++ }, want{changed: []RuleID{0, 1, 2, 3}}},
		{"affinity", func(c *Config) { c.Rules[0].Affinity = AffinityNetwork }, want{changed: []RuleID{1}}},
		{"wider ports take from the rule for every vip", func(c *Config) { c.Rules[0].PortHi = 81 },
			want{changed: []RuleID{1, 2}, kept: []RuleID{2}}},
		{"narrower ports give to the default rule", func(c *Config) { c.Rules[1].PortHi = 85 },
			want{changed: []RuleID{2, 0}, kept: []RuleID{2}}},
		{"removed rule falls to the rule for every vip", func(c *Config) { c.Rules = slices.Delete(c.Rules, 0, 1) },
			want{changed: []RuleID{1, 2}, kept: []RuleID{1}}}, // rule 1 maps nothing now
		{"removed rule falls to the default rule", func(c *Config) { c.Rules = slices.Delete(c.Rules, 2, 3) },
			want{changed: []RuleID{3, 0}, kept: []RuleID{3}}},
		{"rule for one vip over a rule for every vip", func(c *Config) {
			c.Rules = append(c.Rules, Rule{ID: 4, VIP: vipB, PortLo: 85, PortHi: 85, Proto: ProtoTCP})
		}, want{changed: []RuleID{2, 4}, kept: []RuleID{2}}},
		{"new rule over the default rule", func(c *Config) {
			c.Rules = append(c.Rules, Rule{ID: 5, PortLo: 1000, PortHi: 1000, Proto: ProtoTCP})
		}, want{changed: []RuleID{0, 5}, kept: []RuleID{0}}},
		{"protocol udp to both", func(c *Config) { c.Rules[2].Proto = ProtoBoth },
			want{changed: []RuleID{3, 0}, kept: []RuleID{0}}},
		{"rule moved to another vip", func(c *Config) { c.Rules[0].VIP = vipB }, want{changed: []RuleID{1, 2}}},
		{"new vip", func(c *Config) { c.VIPs = append(c.VIPs, vipC) }, want{changed: []RuleID{0, 2, 3}}},
		{"removed vip", func(c *Config) { c.VIPs = c.VIPs[:1] }, want{changed: []RuleID{0, 2, 3}, kept: []RuleID{0, 2, 3}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			old := mappingBase()
			cur := mappingBase()
			tt.edit(cur)
			if err := cur.Validate(); err != nil {
				t.Fatalf("edited config: %v", err)
			}
			om, nm := old.Mappings(), cur.Mappings()
			for id := RuleID(0); id <= 5; id++ {
				o, n := om[id], nm[id]
				changed := !n.Equal(o)
				if wantChanged := slices.Contains(tt.want.changed, id); changed != wantChanged {
					t.Errorf("rule %d: changed %v, want %v (old %+v, new %+v)", id, changed, wantChanged, o, n)
				}
				if o != nil && n != nil && changed == (o.Fingerprint() == n.Fingerprint()) {
					t.Errorf("rule %d: changed %v but fingerprints %x, %x", id, changed, o.Fingerprint(), n.Fingerprint())
				}
				if !changed {
					continue
				}
				if kept, wantKept := n.Within(o), slices.Contains(tt.want.kept, id); kept != wantKept {
					t.Errorf("rule %d: kept %v, want %v (old %+v, new %+v)", id, kept, wantKept, o, n)
				}
			}
		})
	}
}

type flowSpot struct {
	vip   netip.Addr
	proto Protocol // 0: neither TCP nor UDP
	port  uint16
}

// spotPorts bounds the ports the coverage tests look at: the random rules
// lie below it, and every port above belongs to DefaultRule alike.
const spotPorts = 256

// coverage lists, by rule, every (VIP, protocol, port below spotPorts)
// Lookup gives it, over the VIPs of pool.
func coverage(c *Config, pool []netip.Addr) map[RuleID]map[flowSpot]bool {
	out := map[RuleID]map[flowSpot]bool{}
	add := func(id RuleID, s flowSpot) {
		if out[id] == nil {
			out[id] = map[flowSpot]bool{}
		}
		out[id][s] = true
	}
	for _, vip := range pool {
		if _, ok := c.Lookup(vip, ProtoTCP, 0); !ok {
			continue
		}
		add(DefaultRule, flowSpot{vip, 0, 0})
		for _, p := range []Protocol{ProtoTCP, ProtoUDP} {
			for port := 0; port < spotPorts; port++ {
				id, _ := c.Lookup(vip, p, uint16(port))
				add(id, flowSpot{vip, p, uint16(port)})
			}
		}
	}
	return out
}

func (m *Mapping) spots() map[flowSpot]bool {
	out := map[flowSpot]bool{}
	for _, s := range m.Cover {
		for p := int(s.Lo); p <= min(int(s.Hi), spotPorts-1); p++ {
			out[flowSpot{s.VIP, s.Proto, uint16(p)}] = true
		}
	}
	return out
}

func randomRules(rng *rand.Rand, pool []netip.Addr) *Config {
	c := &Config{Seed: 1}
	for _, v := range pool {
		if rng.IntN(3) > 0 {
			c.VIPs = append(c.VIPs, v)
		}
	}
	for id := RuleID(1); id <= 6; id++ {
		lo := uint16(70 + rng.IntN(30))
		r := Rule{ID: id, PortLo: lo, PortHi: lo + uint16(rng.IntN(10)), Proto: Protocol(1 + rng.IntN(3)), Affinity: Affinity(rng.IntN(2))}
		if rng.IntN(2) == 0 {
			r.VIP = pool[rng.IntN(len(pool))]
		}
		if !slices.ContainsFunc(c.Rules, func(o Rule) bool { return o.Overlaps(&r) }) {
			c.Rules = append(c.Rules, r)
		}
	}
	return c
}

// TestMappingsMatchLookup checks, port by port, that the mappings cover
// exactly what Lookup (and so the data plane) gives each rule, and that
// Within between two random configurations is the subset relation of
// those coverages.
func TestMappingsMatchLookup(t *testing.T) {
	rng := rand.New(rand.NewPCG(11, 12))
	pool := []netip.Addr{vipA, vipB, vipC}
	for i := 0; i < 200; i++ {
		a, b := randomRules(rng, pool), randomRules(rng, pool)
		ca, cb := coverage(a, pool), coverage(b, pool)
		ma, mb := a.Mappings(), b.Mappings()
		for id, m := range ma {
			got, want := m.spots(), ca[id]
			if len(got) != len(want) {
				t.Fatalf("config %d rule %d: mapping covers %d spots, Lookup %d\nconfig %+v\nmapping %+v", i, id, len(got), len(want), a, m)
			}
			for s := range want {
				if !got[s] {
					t.Fatalf("config %d rule %d: mapping misses %+v", i, id, s)
				}
			}
		}
		for id := RuleID(0); id <= 6; id++ {
			subset := true
			for s := range cb[id] {
				subset = subset && ca[id][s]
			}
			if nb, na := mb[id], ma[id]; nb != nil && na != nil && nb.Affinity == na.Affinity {
				if got := nb.Within(na); got != subset {
					t.Errorf("config %d rule %d: Within %v, coverage subset %v", i, id, got, subset)
				}
			}
		}
	}
}

// TestGrantIntersect checks that the accepting set keeps a rule's buckets
// across a configuration change exactly when the rule's mapping allows it.
func TestGrantIntersect(t *testing.T) {
	old := mappingBase()
	narrowed := mappingBase()
	narrowed.Rules[1].PortHi = 85 // rule 2 kept, the default rule released
	nodes := []Node{{ID: 1, HostPriority: 1}, {ID: 2, HostPriority: 2}}
	old.Nodes, narrowed.Nodes = nodes, nodes
	g := Assign(old, []NodeID{1, 2}).Grant(1)
	now := Assign(narrowed, []NodeID{1, 2}).Grant(1)
	got := g.Intersect(now)
	if got.Buckets[DefaultRule] != nil {
		t.Errorf("default rule kept although its coverage grew: %d buckets", got.Buckets[DefaultRule].Count())
	}
	for _, id := range []RuleID{1, 2, 3} {
		if want := g.Buckets.Intersect(now.Buckets)[id]; want == nil || got.Buckets[id] == nil || *got.Buckets[id] != *want {
			t.Errorf("rule %d: kept %v, want the plain intersection", id, got.Buckets[id] != nil)
		}
	}
	if got.Maps[2] != now.Maps[2] {
		t.Error("intersection does not carry the new mappings")
	}
	// Once released, the rule comes back only with a new grant.
	if back := got.Intersect(now); back.Buckets[DefaultRule] != nil {
		t.Error("released rule came back by intersection")
	}
	if (Grant{}).Intersect(now).Buckets.Count() != 0 {
		t.Error("the empty grant intersects to something")
	}
	reseeded := mappingBase()
	reseeded.Seed++
	reseeded.Nodes = nodes
	if n := g.Intersect(Assign(reseeded, []NodeID{1, 2}).Grant(1)).Buckets.Count(); n != 0 {
		t.Errorf("a new seed kept %d buckets", n)
	}
}
