package main

import (
	"fmt"
	"io"
	"net/netip"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent"
)

var ip2macCommand = &cli.Command{
	Name:      "ip2mac",
	Usage:     "print a VIP's cluster MAC and the static ARP or neighbour entries routers need",
	ArgsUsage: "<vip>",
	Description: "Routers that follow RFC 1812 ignore ARP replies that carry a multicast MAC, so\n" +
		"the router in front of the cluster needs a static ARP entry for each VIP (a static\n" +
		"neighbour entry for an IPv6 VIP). This prints it for Linux and common router\n" +
		"syntaxes. An IPv4 VIP's cluster MAC is 03:bf and its four bytes; an IPv6 VIP's is\n" +
		"03:be and its last four bytes.",
	Action: func(c *cli.Context) error {
		arg, err := oneArg(c, "<vip>")
		if err != nil {
			return err
		}
		vip, err := netip.ParseAddr(arg)
		if err != nil || vip.Zone() != "" || vip.Is4In6() {
			return usageError("ip2mac: %q is not an IPv4 or IPv6 address", arg)
		}
		printIP2MAC(c.App.Writer, vip)
		return nil
	},
}

func printIP2MAC(w io.Writer, vip netip.Addr) {
	mac := agent.ClusterMAC(vip)
	dotted := strings.ReplaceAll(mac.String(), ":", "")
	cisco := dotted[0:4] + "." + dotted[4:8] + "." + dotted[8:12]
	fmt.Fprintf(w, "cluster MAC for %s: %s\n\n", vip, mac)
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
