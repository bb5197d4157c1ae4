package track

import (
	"net/netip"

	"github.com/shoalnet/shoal/filter"
)

// Conn is one TCP connection this host holds on a VIP.
type Conn struct {
	VIP, Client         netip.Addr
	VIPPort, ClientPort uint16
}

// holdings maps this host's connections on the VIPs to (rule, bucket) pairs:
// the buckets it must keep serving until those connections end.
func holdings(c *filter.Config, conns []Conn) filter.Set {
	held := filter.Set{}
	for _, k := range conns {
		if id, b, ok := c.Locate(k.VIP, filter.ProtoTCP, k.Client, k.ClientPort, k.VIPPort); ok {
			held.Add(id, b)
		}
	}
	return held
}
