package config

import (
	"net/netip"
	"strings"
	"testing"
	"time"
)

const goodBGP = `bgp:
  asn: 65001
  communities: ["65000:100"]
  neighbors:
    - address: 198.18.7.1
      asn: 65000
      bfd: {enabled: true}
`

func TestBGPDefaults(t *testing.T) {
	c, err := Load(writeConfig(t, goodConfig+goodBGP))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid bgp section rejected: %v", err)
	}
	self := netip.MustParseAddr("198.18.7.11") // heartbeat_addr's
	b := c.BGP
	n := b.Neighbors[0]
	if b.RouterID != self || b.NextHop != self || b.NextHop6.IsValid() {
		t.Errorf("router id %s, next hops %s / %s; want the heartbeat address, none for IPv6", b.RouterID, b.NextHop, b.NextHop6)
	}
	if n.HoldTime != 9*time.Second || n.Keepalive != 3*time.Second || n.BFD.Interval != 300*time.Millisecond || n.BFD.Multiplier != 3 {
		t.Errorf("neighbour defaults %+v", n)
	}
	if v, err := ParseCommunity(b.Communities[0]); err != nil || v != 65000<<16|100 {
		t.Errorf("community %q = %#x, %v", b.Communities[0], v, err)
	}
}

func TestBGPErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name, replace, with, want string
	}{
		{"no asn", "  asn: 65001\n", "", "bgp.asn"},
		{"no neighbour asn", "      asn: 65000\n", "", "bgp.neighbors[0].asn"},
		{"no neighbour address", "address: 198.18.7.1", "address: 0.0.0.0", "bgp.neighbors[0].address"},
		{"bad community", `["65000:100"]`, `["65000:100000"]`, "bgp.communities[0]"},
		{"short hold time", "      asn: 65000\n", "      asn: 65000\n      hold_time: 1s\n", "bgp.neighbors[0].hold_time"},
		{"long keepalive", "      asn: 65000\n", "      asn: 65000\n      keepalive: 5s\n", "bgp.neighbors[0].keepalive"},
		{"fast bfd", "{enabled: true}", "{enabled: true, interval: 1ms}", "bgp.neighbors[0].bfd.interval"},
		{"multihop bfd", "      asn: 65000\n", "      asn: 65000\n      multihop_ttl: 3\n", "bgp.neighbors[0].bfd"},
		{"ipv6 router id", "asn: 65001\n", "asn: 65001\n  router_id: '2001:db8::1'\n", "bgp.router_id"},
		{"ipv4 next hop6", "asn: 65001\n", "asn: 65001\n  next_hop6: 198.18.7.11\n", "bgp.next_hop6"},
		{"no neighbour", "  neighbors:\n    - address: 198.18.7.1\n      asn: 65000\n      bfd: {enabled: true}\n", "", "bgp.neighbors"},
		{"twice", "      bfd: {enabled: true}\n", "      bfd: {enabled: true}\n    - address: 198.18.7.1\n      asn: 65000\n", "bgp.neighbors[1].address"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			bgp := strings.Replace(goodBGP, tc.replace, tc.with, 1)
			if bgp == goodBGP {
				t.Fatalf("the case changes nothing")
			}
			c, err := Load(writeConfig(t, goodConfig+bgp))
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

// TestBGPFromEnvAndFlags: the single-router case without YAML.
func TestBGPFromEnvAndFlags(t *testing.T) {
	c, err := Load(writeConfig(t, goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SHOAL_BGP_ASN": "65001", "SHOAL_BGP_NEIGHBORS": "198.18.7.1@65000, 198.18.7.2@65000", "SHOAL_BGP_BFD": "true"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	if c.BGP.ASN != 65001 || len(c.BGP.Neighbors) != 2 || !c.BGP.Neighbors[1].BFD.Enabled || c.BGP.Neighbors[1].ASN != 65000 {
		t.Errorf("bgp from the environment: %+v", c.BGP)
	}
	if err := c.Set("bgp_neighbors", "198.18.7.1"); err == nil || !strings.Contains(err.Error(), "ADDRESS@ASN") {
		t.Errorf("a neighbour without its ASN: %v", err)
	}
}
