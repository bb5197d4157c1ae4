package main

import (
	"errors"
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/announce"
	"github.com/shoalnet/shoal/rules"
)

var ip2macCommand = &cli.Command{
	Name:      "ip2mac",
	Usage:     "print a VIP's cluster MAC and the static ARP or neighbour entries routers need",
	ArgsUsage: "<vip>",
	Description: "Routers that follow RFC 1812 ignore ARP replies that carry a multicast MAC, so\n" +
		"the router in front of the cluster needs a static ARP entry for each VIP (a static\n" +
		"neighbour entry for an IPv6 VIP). This prints it for Linux and common router\n" +
		"syntaxes, in the cluster's MAC mode (--mac-mode; `shoal settings show` says which\n" +
		"the cluster uses). In multicast mode an IPv4 VIP's cluster MAC is 03:bf and its\n" +
		"four bytes, an IPv6 VIP's 03:be and its last four bytes. In igmp mode an IPv4\n" +
		"VIP's is 01:00:5e:7f and its last two bytes, the MAC of the group 239.255.x.y\n" +
		"every node joins; an IPv6 VIP's 33:33:ef:ff and its last two bytes, the MAC of\n" +
		"the MLD group ff05::efff:xxyy.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "mac-mode", Value: "multicast", Usage: "the cluster's MAC mode: multicast or igmp"},
	},
	Action: func(c *cli.Context) error {
		arg, err := oneArg(c, "<vip>")
		if err != nil {
			return err
		}
		vip, err := netip.ParseAddr(arg)
		if err != nil || vip.Zone() != "" || vip.Is4In6() {
			return usageError("ip2mac: %q is not an IPv4 or IPv6 address", arg)
		}
		mode, err := rules.ParseMACMode(c.String("mac-mode"))
		if err == nil && mode == rules.MACRouted {
			err = errors.New("routed mode has no cluster MAC: the routers learn the VIPs over BGP")
		}
		if err != nil {
			return usageError("ip2mac: --mac-mode %q: want multicast or igmp: %v", c.String("mac-mode"), err)
		}
		printIP2MAC(c.App.Writer, vip, mode)
		return nil
	},
}

// printIP2MAC prints vip's cluster MAC in mode and the static ARP or
// neighbour entry for it in Linux and common router syntaxes.
func printIP2MAC(w io.Writer, vip netip.Addr, mode rules.MACMode) {
	mac := announce.ClusterMAC(vip, mode)
	dotted := strings.ReplaceAll(mac.String(), ":", "")
	cisco := dotted[0:4] + "." + dotted[4:8] + "." + dotted[8:12]
	fmt.Fprintf(w, "cluster MAC for %s (%s mode): %s\n", vip, mode, mac)
	if g := rules.IGMPGroup(vip); mode == rules.MACIGMP && g.IsValid() {
		proto := "IGMP"
		if vip.Is6() {
			proto = "MLD"
		}
		fmt.Fprintf(w, "%s group every node joins: %s (the segment needs an %s querier)\n", strings.ToLower(proto), g, proto)
	}
	fmt.Fprintln(w)
	if vip.Is6() {
		fmt.Fprintf(w, "Linux:        ip -6 neigh replace %s lladdr %s nud permanent dev <ifname>\n", vip, mac)
		fmt.Fprintf(w, "Cisco IOS:    ipv6 neighbor %s <interface> %s\n", vip, cisco)
		fmt.Fprintf(w, "Juniper:      set interfaces <ifname> unit 0 family inet6 address <router-ip/len> ndp %s mac %s\n", vip, mac)
		return
	}
	fmt.Fprintf(w, "Linux:        ip neigh replace %s lladdr %s nud permanent dev <ifname>\n", vip, mac)
	fmt.Fprintf(w, "Cisco IOS:    arp %s %s ARPA\n", vip, cisco)
	fmt.Fprintf(w, "Juniper:      set interfaces <ifname> unit 0 family inet address <router-ip/len> arp %s mac %s\n", vip, mac)
	fmt.Fprintf(w, "MikroTik:     /ip arp add address=%s mac-address=%s interface=<ifname>\n", vip, strings.ToUpper(mac.String()))
}
