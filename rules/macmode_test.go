package rules

import (
	"errors"
	"net/netip"
	"testing"
)

func TestClusterMAC(t *testing.T) {
	tests := []struct {
		mode  MACMode
		vip   string
		mac   string
		group string
	}{
		{"", "198.18.3.100", "03:bf:c6:12:03:64", "239.255.3.100"},
		{MACMulticast, "10.1.2.3", "03:bf:0a:01:02:03", "239.255.2.3"},
		{MACIGMP, "198.18.3.100", "01:00:5e:7f:03:64", "239.255.3.100"},
		{MACIGMP, "192.0.2.255", "01:00:5e:7f:02:ff", "239.255.2.255"},
		{MACIGMP, "2001:db8::c612:364", "33:33:ef:ff:03:64", "ff05::efff:364"},
		{"", "2001:db8::10", "03:be:00:00:00:10", "ff05::efff:10"},
	}
	for _, tt := range tests {
		t.Run(tt.mode.String()+" "+tt.vip, func(t *testing.T) {
			vip := netip.MustParseAddr(tt.vip)
			if got := tt.mode.ClusterMAC(vip).String(); got != tt.mac {
				t.Errorf("ClusterMAC = %s, want %s", got, tt.mac)
			}
			if got := IGMPGroup(vip).String(); got != tt.group {
				t.Errorf("IGMPGroup = %s, want %s", got, tt.group)
			}
		})
	}
}

func TestParseMACMode(t *testing.T) {
	for _, s := range []string{"multicast", "igmp"} {
		if m, err := ParseMACMode(s); err != nil || m.String() != s {
			t.Errorf("ParseMACMode(%q) = %q, %v", s, m, err)
		}
	}
	for _, s := range []string{"", "unicast", "IGMP"} {
		if _, err := ParseMACMode(s); !errors.Is(err, ErrInvalid) {
			t.Errorf("ParseMACMode(%q): %v, want ErrInvalid", s, err)
		}
	}
}
