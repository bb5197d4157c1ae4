package filter

import "net/netip"

// Locate returns the rule and bucket of the TCP or UDP flow from clientIP:
// clientPort to vip:vipPort, as the data plane computes them for the
// flow's (unfragmented) packets. ok is false when vip is not a VIP or the
// client is not of the VIP's family (an IPv4-mapped client counts as
// IPv4). The agent's socket scan uses it to name the buckets it holds
// connections in.
func (c *Config) Locate(vip netip.Addr, proto Protocol, clientIP netip.Addr, clientPort, vipPort uint16) (RuleID, uint16, bool) {
	clientIP = clientIP.Unmap()
	if clientIP.Is4() != vip.Is4() {
		return DefaultRule, 0, false
	}
	id, ok := c.Lookup(vip, proto, vipPort)
	if !ok {
		return DefaultRule, 0, false
	}
	k := keyFor(c.Affinity(id), clientIP, clientPort)
	return id, k.Bucket(c.Seed), true
}
