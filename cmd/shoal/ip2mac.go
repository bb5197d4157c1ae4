package main

import (
	"fmt"
	"net/netip"
	"strings"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent"
)

var ip2macCommand = &cli.Command{
	Name:      "ip2mac",
	Usage:     "print a VIP's cluster MAC and the static ARP entries routers need",
	ArgsUsage: "<vip>",
	Description: "Routers that follow RFC 1812 ignore ARP replies that carry a multicast MAC, so\n" +
		"the router in front of the cluster needs a static ARP entry for each VIP. This\nprints it for Linux and common router syntaxes.",
	Action: func(c *cli.Context) error {
		arg, err := oneArg(c, "<vip>")
		if err != nil {
			return err
		}
		vip, err := netip.ParseAddr(arg)
		if err != nil || !vip.Is4() {
			return usageError("ip2mac: %q is not an IPv4 address", arg)
		}
		mac := agent.ClusterMAC(vip)
		dotted := strings.ReplaceAll(mac.String(), ":", "")
		w := c.App.Writer
		fmt.Fprintf(w, "cluster MAC for %s: %s\n\n", vip, mac)
		fmt.Fprintf(w, "Linux:        ip neigh replace %s lladdr %s nud permanent dev <ifname>\n", vip, mac)
		fmt.Fprintf(w, "Cisco IOS:    arp %s %s.%s.%s ARPA\n", vip, dotted[0:4], dotted[4:8], dotted[8:12])
		fmt.Fprintf(w, "Juniper:      set interfaces <ifname> unit 0 family inet address <router-ip/len> arp %s mac %s\n", vip, mac)
		fmt.Fprintf(w, "MikroTik:     /ip arp add address=%s mac-address=%s interface=<ifname>\n", vip, strings.ToUpper(mac.String()))
		return nil
	},
}
