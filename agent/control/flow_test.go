package control

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/shoalnet/shoal/filter"
)

func TestExplainFlow(t *testing.T) {
	vip := netip.MustParseAddr("198.18.0.100")
	c := &filter.Config{
		Seed: 0x5eed,
		VIPs: []netip.Addr{vip, netip.MustParseAddr("2001:db8::100")},
		Rules: []filter.Rule{
			{ID: 1, VIP: vip, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple, Affinity: filter.AffinityNone},
			{ID: 2, PortLo: 443, PortHi: 443, Proto: filter.ProtoBoth, Mode: filter.ModeMultiple, Affinity: filter.AffinityNetwork},
			{ID: 3, VIP: vip, PortLo: 22, PortHi: 22, Proto: filter.ProtoTCP, Mode: filter.ModeSingle, Affinity: filter.AffinitySingle},
			{ID: 4, VIP: vip, PortLo: 25, PortHi: 25, Proto: filter.ProtoTCP, Mode: filter.ModeDisabled, Affinity: filter.AffinitySingle},
		},
		Nodes: []filter.Node{
			{ID: 1, HostPriority: 2, Rules: map[filter.RuleID]filter.NodeRule{3: {Weight: 50, HandlingPriority: 3}}},
			{ID: 2, HostPriority: 1, Rules: map[filter.RuleID]filter.NodeRule{3: {Weight: 50, HandlingPriority: 1}}},
			{ID: 3, HostPriority: 3, Rules: map[filter.RuleID]filter.NodeRule{3: {Weight: 50, HandlingPriority: 2}}},
		},
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	names := map[filter.NodeID]string{1: "web1", 2: "web2", 3: "web3"}
	name := func(id filter.NodeID) string { return names[id] }
	all := []filter.NodeID{1, 2, 3}
	ap := netip.MustParseAddrPort

	for _, tc := range []struct {
		name       string
		client, to string
		proto      filter.Protocol
		view       []filter.NodeID
		rule       filter.RuleID
		key        string
		owner      string            // "*": any node, checked by the properties below
		ifDown     map[string]string // nil: not checked exactly
		err        string
	}{
		{name: "multiple hosts, affinity none", client: "198.18.5.7:51234", to: "198.18.0.100:80", proto: filter.ProtoTCP,
			view: all, rule: 1, key: "198.18.5.7:51234", owner: "*"},
		{name: "affinity network keys the /24", client: "198.18.5.7:51234", to: "198.18.0.100:443", proto: filter.ProtoUDP,
			view: all, rule: 2, key: "198.18.5.0/24", owner: "*"},
		{name: "single host: the lowest handling priority", client: "198.18.5.7:40000", to: "198.18.0.100:22", proto: filter.ProtoTCP,
			view: all, rule: 3, key: "198.18.5.7", owner: "web2", ifDown: map[string]string{"web1": "web2", "web2": "web3", "web3": "web2"}},
		{name: "no rule: the default host", client: "198.18.5.7:40000", to: "198.18.0.100:8080", proto: filter.ProtoTCP,
			view: all, rule: 0, key: "198.18.5.7", owner: "web2", ifDown: map[string]string{"web1": "web2", "web2": "web1", "web3": "web2"}},
		{name: "a view without the default host", client: "198.18.5.7:40000", to: "198.18.0.100:8080", proto: filter.ProtoTCP,
			view: []filter.NodeID{1, 3}, rule: 0, key: "198.18.5.7", owner: "web1", ifDown: map[string]string{"web1": "web3", "web3": "web1"}},
		{name: "disabled rule: nobody", client: "198.18.5.7:40000", to: "198.18.0.100:25", proto: filter.ProtoTCP,
			view: all, rule: 4, key: "198.18.5.7", owner: "", ifDown: map[string]string{"web1": "", "web2": "", "web3": ""}},
		{name: "empty view: nobody", client: "198.18.5.7:40000", to: "198.18.0.100:80", proto: filter.ProtoTCP,
			view: nil, rule: 1, key: "198.18.5.7:40000", owner: "", ifDown: map[string]string{}},
		{name: "not a VIP", client: "198.18.5.7:40000", to: "198.18.0.99:80", proto: filter.ProtoTCP, err: "not a VIP"},
		{name: "IPv6 client of an IPv4 VIP", client: "[2001:db8::1]:40000", to: "198.18.0.100:80", proto: filter.ProtoTCP, err: "different families"},
		{name: "IPv6, affinity network keys the /64", client: "[2001:db8:5::7]:51234", to: "[2001:db8::100]:443", proto: filter.ProtoTCP,
			view: all, rule: 2, key: "2001:db8:5::/64", owner: "*"},
		{name: "IPv6, no rule: the default host", client: "[2001:db8:5::7]:40000", to: "[2001:db8::100]:8080", proto: filter.ProtoUDP,
			view: all, rule: 0, key: "2001:db8:5::7", owner: "web2", ifDown: map[string]string{"web1": "web2", "web2": "web1", "web3": "web2"}},
		{name: "IPv4-mapped client of an IPv4 VIP", client: "[::ffff:198.18.5.7]:51234", to: "198.18.0.100:80", proto: filter.ProtoTCP,
			view: all, rule: 1, key: "198.18.5.7:51234", owner: "*"},
		{name: "both protocols", client: "198.18.5.7:40000", to: "198.18.0.100:80", proto: filter.ProtoBoth, err: "want tcp or udp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, to := ap(tc.client), ap(tc.to)
			f, err := ExplainFlow(c, new(OwnersCache).Owners(c), tc.view, name, client, to, tc.proto)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			k := filter.KeyOf(c.Affinity(tc.rule), client.Addr(), client.Port())
			wantBucket := k.Bucket(c.Seed)
			if f.Rule != tc.rule || f.Key != tc.key || f.Bucket != wantBucket || uint16(f.Hash&filter.BucketMask) != f.Bucket {
				t.Errorf("rule %d key %q bucket %d hash %#x; want rule %d key %q bucket %d (= hash & %d)",
					f.Rule, f.Key, f.Bucket, f.Hash, tc.rule, tc.key, wantBucket, filter.BucketMask)
			}
			if tc.owner != "*" && f.Owner != tc.owner {
				t.Errorf("owner %q, want %q", f.Owner, tc.owner)
			}
			if tc.ifDown != nil {
				if diff := cmp.Diff(tc.ifDown, f.IfDown); diff != "" {
					t.Errorf("if down (-want +got):\n%s", diff)
				}
			}
			if tc.owner == "*" {
				// A node leaving moves only its own buckets, to a survivor.
				if f.Owner == "" {
					t.Fatal("nobody owns a multiple-host bucket in a full view")
				}
				for down, o := range f.IfDown {
					switch {
					case down == f.Owner && (o == "" || o == down):
						t.Errorf("if the owner %s failed, the bucket would go to %q", down, o)
					case down != f.Owner && o != f.Owner:
						t.Errorf("if %s failed, the bucket would move from %s to %s", down, f.Owner, o)
					}
				}
				if len(f.IfDown) != len(tc.view) {
					t.Errorf("if down covers %d nodes, want %d", len(f.IfDown), len(tc.view))
				}
			}
		})
	}
}

// Flows from one /24 share a bucket under network affinity; under none,
// ports spread a client over every node.
func TestExplainFlowSpreads(t *testing.T) {
	vip := netip.MustParseAddr("198.18.0.100")
	c := &filter.Config{Seed: 7, VIPs: []netip.Addr{vip},
		Rules: []filter.Rule{{ID: 1, VIP: vip, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinityNone},
			{ID: 2, VIP: vip, PortLo: 81, PortHi: 81, Proto: filter.ProtoTCP, Affinity: filter.AffinityNetwork}},
		Nodes: []filter.Node{{ID: 1, HostPriority: 1}, {ID: 2, HostPriority: 2}, {ID: 3, HostPriority: 3}}}
	name := func(id filter.NodeID) string { return string(rune('a' + id - 1)) }
	owners := map[string]int{}
	net := map[uint16]bool{}
	cache := new(OwnersCache).Owners(c)
	for port := 20000; port < 20300; port++ {
		f, err := ExplainFlow(c, cache, []filter.NodeID{1, 2, 3}, name, netip.AddrPortFrom(netip.MustParseAddr("198.18.5.7"), uint16(port)), netip.MustParseAddrPort("198.18.0.100:80"), filter.ProtoTCP)
		if err != nil {
			t.Fatal(err)
		}
		owners[f.Owner]++
		g, _ := ExplainFlow(c, cache, []filter.NodeID{1, 2, 3}, name, netip.AddrPortFrom(netip.AddrFrom4([4]byte{198, 18, 5, byte(port)}), uint16(port)), netip.MustParseAddrPort("198.18.0.100:81"), filter.ProtoTCP)
		net[g.Bucket] = true
	}
	if len(owners) != 3 || owners[""] != 0 {
		t.Errorf("300 ports of one client went to %v, want all three nodes", owners)
	}
	if len(net) != 1 {
		t.Errorf("one /24 under network affinity fell into %d buckets, want 1", len(net))
	}
}

func TestParseFlowTarget(t *testing.T) {
	for _, tc := range []struct {
		in    string
		to    string
		proto filter.Protocol
		ok    bool
	}{
		{"198.18.0.100:80", "198.18.0.100:80", filter.ProtoTCP, true},
		{"198.18.0.100:80/tcp", "198.18.0.100:80", filter.ProtoTCP, true},
		{"198.18.0.100:53/udp", "198.18.0.100:53", filter.ProtoUDP, true},
		{"198.18.0.100:53/both", "", 0, false},
		{"198.18.0.100/tcp", "", 0, false},
		{"", "", 0, false},
	} {
		to, p, err := parseFlowTarget(tc.in)
		if (err == nil) != tc.ok || (tc.ok && (to.String() != tc.to || p != tc.proto)) {
			t.Errorf("parseFlowTarget(%q) = %v, %v, %v", tc.in, to, p, err)
		}
	}
}
