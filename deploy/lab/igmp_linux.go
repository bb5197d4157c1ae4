package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"slices"
	"strings"
)

// snoopingBridge is the bridge of igmp mode: IGMP snooping and the
// bridge's own querier, with short intervals (a query every 2 s, the
// querier counted after 1 s, a membership held for 7 s without a report)
// so a node that stops answering queries drops out of the group within
// seconds, as the querier requirement says.
var snoopingBridge = []string{
	"mcast_snooping", "1", "mcast_querier", "1",
	"mcast_query_interval", "200", "mcast_query_response_interval", "100",
	"mcast_startup_query_interval", "50", "mcast_membership_interval", "700",
}

// snoopTable is the nftables table (bridge family, in the switch
// namespace) that forwards the igmp cluster MAC by group membership.
const snoopTable = "shoal_lab_snoop"

// SnoopByMAC makes the lab's switch forward the igmp mode's cluster MAC as
// a switch that snoops IGMP and forwards by MAC does (NLB's igmp mode
// relies on that): only to the ports that joined the VIP's group. A Linux
// bridge keys its snooping on the IP destination, and the VIP's frames
// carry the group's MAC but the VIP as destination, so with a querier
// present it sends them to its multicast-router ports only (without one it
// floods them). The lab therefore makes every port a router port and drops
// the cluster MAC on the ports that are not members of the group in the
// bridge's own table, which it learned from the nodes' real IGMP (and, for
// an IPv6 VIP, MLD) reports. The membership is read once, here: it fails
// (and changes nothing) until every node's port has joined every VIP's
// group.
func (l *Lab) SnoopByMAC(ctx context.Context) error {
	var drops []string
	for _, vip := range l.VIPs() {
		group := IGMPGroup(vip).String()
		members, err := l.groupPorts(ctx, group)
		if err != nil {
			return err
		}
		var missing []string
		for _, n := range l.Nodes {
			if !slices.Contains(members, n.BridgePort) {
				missing = append(missing, n.Name)
			}
		}
		if len(missing) > 0 {
			return fmt.Errorf("the switch has not seen %v join %s (members: %v)", missing, group, members)
		}
		quoted := make([]string, len(members))
		for i, m := range members {
			quoted[i] = `"` + m + `"`
		}
		drops = append(drops, fmt.Sprintf("\t\tether daddr %s oifname != { %s } counter drop\n", ClusterMACIn("igmp", vip), strings.Join(quoted, ", ")))
	}
	rules := fmt.Sprintf("table bridge %[1]s\ndelete table bridge %[1]s\n"+
		"table bridge %[1]s {\n\tchain forward {\n\t\ttype filter hook forward priority 0; policy accept;\n%[2]s\t}\n}\n",
		snoopTable, strings.Join(drops, ""))
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.Switch, "nft", "-f", "-")
	cmd.Stdin = strings.NewReader(rules)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("nft in %s: %w: %s", l.Switch, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// groupPorts returns the bridge ports the switch's snooping table lists as
// members of group.
func (l *Lab) groupPorts(ctx context.Context, group string) ([]string, error) {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.Switch, "bridge", "-j", "mdb", "show", "dev", Bridge)
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("bridge mdb show: %w", err)
	}
	return parseMDB(out, group)
}

// parseMDB returns the ports of group in `bridge -j mdb show` output.
func parseMDB(out []byte, group string) ([]string, error) {
	var tables []struct {
		MDB []struct {
			Port string `json:"port"`
			Grp  string `json:"grp"`
		} `json:"mdb"`
	}
	if err := json.Unmarshal(out, &tables); err != nil {
		return nil, fmt.Errorf("bridge mdb show: %w", err)
	}
	var ports []string
	for _, t := range tables {
		for _, e := range t.MDB {
			if e.Grp == group && !slices.Contains(ports, e.Port) {
				ports = append(ports, e.Port)
			}
		}
	}
	slices.Sort(ports)
	return ports, nil
}
