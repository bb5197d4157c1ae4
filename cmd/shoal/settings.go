package main

import (
	"fmt"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/rules"
)

var settingsCommand = &cli.Command{
	Name:  "settings",
	Usage: "show and change the cluster settings",
	Description: "The cluster settings are replicated with the rules: the hash seed of the\n" +
		"ownership function, the heartbeat period and tolerance, and the MAC mode.",
	Subcommands: []*cli.Command{
		{
			Name:        "show",
			Usage:       "show the cluster settings",
			Description: "Prints the cluster id, the hash seed, the heartbeat settings and the MAC mode.",
			Flags:       []cli.Flag{jsonFlag},
			Action: func(c *cli.Context) error {
				var q control.Query
				if err := client(c).Do(c.Context, "GET", "/v1/query", nil, &q); err != nil {
					return err
				}
				if c.Bool("json") {
					return printJSON(c.App.Writer, q.Settings)
				}
				printSettings(c, q.Settings)
				return nil
			},
		},
		{
			Name:  "set",
			Usage: "change cluster settings",
			Description: "Changes the settings given, in one replicated command (the MAC mode in\n" +
				"one of its own, after it). A new hash seed maps every flow afresh: every\n" +
				"node releases its buckets and their connections drain where they are, as\n" +
				"for any move.\n\n" +
				"--mac-mode picks the cluster MAC every VIP resolves to, as NLB's modes:\n" +
				"multicast (03:bf and the VIP's four bytes; switches flood it to every\n" +
				"port) or igmp (01:00:5e:7f and the VIP's last two bytes, the MAC of the\n" +
				"group 239.255.x.y that every node joins, for an IPv6 VIP 33:33:ef:ff and\n" +
				"its last two bytes, of the MLD group ff05::efff:xxyy; so an IGMP-snooping switch\n" +
				"forwards the VIP's frames only to the nodes; the switch, or a router on\n" +
				"the segment, must run an IGMP querier, or it ages the group out). Every\n" +
				"node applies a change at once and re-announces the VIPs by gratuitous ARP;\n" +
				"routers with static ARP entries need the new MAC (shoal ip2mac). Or routed:\n" +
				"no cluster MAC; every eligible node announces the VIPs over BGP to the\n" +
				"routers in its config's bgp section, which spread the flows over the nodes\n" +
				"with ECMP (every member must run a shoal that knows routed mode).",
			Flags: []cli.Flag{
				&cli.Uint64Flag{Name: "hash-seed", Usage: "the ownership hash's seed (0-4294967295)"},
				&cli.DurationFlag{Name: "heartbeat-period", Usage: "one heartbeat per period (10ms-10s)"},
				&cli.IntFlag{Name: "heartbeat-tolerance", Usage: "periods without a heartbeat before a peer is dead (2-100)"},
				&cli.StringFlag{Name: "mac-mode", Usage: "how the VIPs are claimed: multicast, igmp or routed (BGP)"},
			},
			Action: func(c *cli.Context) error {
				var req control.SettingsRequest
				if c.IsSet("hash-seed") {
					v := c.Uint64("hash-seed")
					if v > 1<<32-1 {
						return usageError("settings set: --hash-seed %d is over 4294967295", v)
					}
					seed := uint32(v)
					req.HashSeed = &seed
				}
				if c.IsSet("heartbeat-period") {
					req.HeartbeatPeriod = c.Duration("heartbeat-period").String()
				}
				if c.IsSet("heartbeat-tolerance") {
					tol := c.Int("heartbeat-tolerance")
					req.HeartbeatTolerance = &tol
				}
				if c.IsSet("mac-mode") {
					m, err := rules.ParseMACMode(c.String("mac-mode"))
					if err != nil {
						return usageError("settings set: --mac-mode %q: want multicast, igmp or routed", c.String("mac-mode"))
					}
					req.MACMode = m.String()
				}
				if req.HashSeed == nil && req.HeartbeatPeriod == "" && req.HeartbeatTolerance == nil && req.MACMode == "" {
					return usageError("settings set: nothing to change; give --hash-seed, --heartbeat-period, --heartbeat-tolerance or --mac-mode")
				}
				cl := client(c)
				if err := cl.Do(c.Context, "POST", "/v1/settings", req, nil); err != nil {
					return err
				}
				var q control.Query
				if err := cl.Do(c.Context, "GET", "/v1/query", nil, &q); err != nil {
					return err
				}
				printSettings(c, q.Settings)
				return nil
			},
		},
	},
}

func printSettings(c *cli.Context, s control.SettingInfo) {
	fmt.Fprintf(c.App.Writer, "cluster id %08x\nhash seed %d\nheartbeat period %s, tolerance %d\nmac mode %s\n",
		s.ClusterID, s.HashSeed, s.HeartbeatPeriod, s.HeartbeatTolerance, s.MACMode)
}
