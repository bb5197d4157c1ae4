package filter

import (
	"encoding/binary"
	"net/netip"
)

// Locate returns the rule and bucket of the TCP or UDP flow from clientIP:
// clientPort to vip:vipPort, as the data plane computes them for the
// flow's (unfragmented) packets. ok is false when vip is not a VIP or the
// client is not IPv4. The agent's socket scan uses it to name the buckets
// it holds connections in.
func (c *Config) Locate(vip netip.Addr, proto Protocol, clientIP netip.Addr, clientPort, vipPort uint16) (RuleID, uint16, bool) {
	if !clientIP.Is4() {
		return DefaultRule, 0, false
	}
	id, ok := c.Lookup(vip, proto, vipPort)
	if !ok {
		return DefaultRule, 0, false
	}
	ip4 := clientIP.As4()
	return id, Bucket(c.Seed, c.Affinity(id), binary.BigEndian.Uint32(ip4[:]), clientPort), true
}
