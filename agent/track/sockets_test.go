package track

import (
	"net/netip"
	"testing"

	"github.com/shoalnet/shoal/filter"
)

func TestHoldings(t *testing.T) {
	vip := netip.MustParseAddr("198.18.7.100")
	c := &filter.Config{Seed: 7, VIPs: []netip.Addr{vip},
		Rules: []filter.Rule{{ID: 1, PortLo: 80, PortHi: 80, Proto: filter.ProtoTCP, Affinity: filter.AffinityNone}}}
	client := netip.MustParseAddr("198.18.7.1")
	conns := []Conn{
		{VIP: vip, VIPPort: 80, Client: client, ClientPort: 40000},
		{VIP: vip, VIPPort: 22, Client: client, ClientPort: 40001},                            // default rule
		{VIP: netip.MustParseAddr("198.18.7.11"), VIPPort: 80, Client: client, ClientPort: 1}, // not a VIP
	}
	held := holdings(c, conns)
	b80 := filter.Bucket(7, filter.AffinityNone, 0xc6120701, 40000)
	b22 := filter.Bucket(7, filter.AffinitySingle, 0xc6120701, 0)
	if !held.Has(1, b80) || !held.Has(filter.DefaultRule, b22) || held.Count() != 2 {
		t.Errorf("holdings %v, want rule 1 bucket %d and default bucket %d", held, b80, b22)
	}
	accept := filter.Set{}
	accept.Add(1, b80)
	if d := held.Minus(accept); d.Has(1, b80) || !d.Has(filter.DefaultRule, b22) || d.Count() != 1 {
		t.Errorf("draining = held - accept gives %d pairs", d.Count())
	}
}
