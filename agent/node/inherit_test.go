package node

import (
	"net/netip"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/host"
	"github.com/shoalnet/shoal/filter"
)

// TestRestartArm: an armed restart applies to one stop within a minute,
// with the window asked for (default 10 s, 1-10 s accepted).
func TestInheritFrom(t *testing.T) {
	vip := netip.MustParseAddr("198.18.0.100")
	cfg := func(seed uint32, port uint16) *filter.Config {
		return &filter.Config{Seed: seed, VIPs: []netip.Addr{vip}, Rules: []filter.Rule{
			{ID: 1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple},
			{ID: 2, PortLo: port, PortHi: port, Proto: filter.ProtoTCP, Mode: filter.ModeMultiple},
		}}
	}
	old := cfg(7, 443)
	grant := filter.Grant{Buckets: filter.Set{}, Maps: old.Mappings()}
	for _, id := range []filter.RuleID{1, 2} {
		for b := uint16(0); b < 100; b++ {
			grant.Buckets.Add(id, b)
		}
	}
	rr := &host.RestartRecord{Accept: grant}
	until := time.Unix(1_700_000_010, 0)
	for _, tc := range []struct {
		name         string
		now          *filter.Config
		want1, want2 int
	}{
		{"same rules", old, 100, 100},
		{"rule 2 moved to another port", cfg(7, 8443), 100, 0},
		{"another seed", cfg(8, 443), 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			in := InheritFrom(rr, tc.now, until)
			got1, got2 := count(in.accept.Buckets, 1), count(in.accept.Buckets, 2)
			if got1 != tc.want1 || got2 != tc.want2 || !in.until.Equal(until) {
				t.Errorf("inherited %d, %d buckets until %v; want %d, %d until %v", got1, got2, in.until, tc.want1, tc.want2, until)
			}
		})
	}
}

func count(s filter.Set, id filter.RuleID) int {
	n := 0
	for b := range filter.NumBuckets {
		if s.Has(id, uint16(b)) {
			n++
		}
	}
	return n
}
