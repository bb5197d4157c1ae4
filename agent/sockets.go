package agent

import (
	"net/netip"

	"github.com/shoalnet/shoal/filter"
)

// conn is one TCP connection this host holds on a VIP.
type conn struct {
	VIP, Client         netip.Addr
	VIPPort, ClientPort uint16
}

// holdings maps this host's connections on the VIPs to (rule, bucket) pairs:
// the buckets it must keep serving until those connections end.
func holdings(c *filter.Config, conns []conn) filter.Set {
	held := filter.Set{}
	for _, k := range conns {
		if id, b, ok := c.Locate(k.VIP, filter.ProtoTCP, k.Client, k.ClientPort, k.VIPPort); ok {
			held.Add(id, b)
		}
	}
	return held
}

// minus returns the pairs of s that are not in o.
func minus(s, o filter.Set) filter.Set {
	out := filter.Set{}
	for id, m := range s {
		om := o[id]
		for b := 0; b < filter.NumBuckets; b++ {
			if m.Has(uint16(b)) && (om == nil || !om.Has(uint16(b))) {
				out.Add(id, uint16(b))
			}
		}
	}
	return out
}
