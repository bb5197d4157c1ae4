package drill

import (
	"fmt"
	"strings"
)

// Scenario is the event a drill applies to one node while traffic flows.
type Scenario string

// The scenarios a drill knows.
const (
	// Plug makes the node look like a pulled cable: in the lab its switch
	// port goes down; on a real cluster its agent is told over the peer API
	// to stop heartbeating and drop every VIP packet.
	Plug Scenario = "plug"
	// Kill sends SIGKILL to the node's agent (lab only).
	Kill Scenario = "kill"
	// Drainstop drains the node: its connections finish, new ones go to
	// the others.
	Drainstop Scenario = "drainstop"
	// Join starts a node that was stopped before the traffic began.
	Join Scenario = "join"
	// Weight sets the node's weight on the VIP's port rule.
	Weight Scenario = "weight"
	// Rule changes the VIP's port rule in place (lab only): its port range
	// grows from 80 to 80-81, so its mapping changes and every node
	// releases and re-acquires its buckets.
	Rule Scenario = "rule"
	// SIGTERM stops the node's agent gracefully, as `systemctl stop`
	// does (lab only).
	SIGTERM Scenario = "sigterm"
	// Restart restarts the node's agent hitlessly, as `systemctl restart
	// shoal` does (lab only): `shoal restart`, SIGTERM, the agent started
	// again, which adopts the data plane the old one left.
	Restart Scenario = "restart"
	// Rehash takes the node's next hop out of the lab router's route to
	// the VIP and puts it back once the route has changed (routed lab
	// only): the router's ECMP hashes flows over the other next hops and
	// back again, as when one of its links goes away and returns.
	Rehash Scenario = "rehash"
)

// Scenarios lists every scenario, in the order the CLI shows them.
var Scenarios = []Scenario{Plug, Kill, Drainstop, Join, Weight, Rule, SIGTERM, Restart, Rehash}

// ParseScenario returns the scenario called s.
func ParseScenario(s string) (Scenario, error) {
	for _, sc := range Scenarios {
		if string(sc) == s {
			return sc, nil
		}
	}
	names := make([]string, len(Scenarios))
	for i, sc := range Scenarios {
		names[i] = string(sc)
	}
	return "", fmt.Errorf("drill: unknown scenario %q (want %s)", s, strings.Join(names, ", "))
}

// verb says what happened to the node, for reports and plot labels.
func (s Scenario) verb() string {
	switch s {
	case Plug:
		return "plug pulled on"
	case Kill:
		return "agent killed on"
	case Drainstop:
		return "drainstop of"
	case Join:
		return "join of"
	case Weight:
		return "weight change of"
	case Rule:
		return "port rule changed through"
	case SIGTERM:
		return "agent stopped (SIGTERM) on"
	case Restart:
		return "agent restarted on"
	case Rehash:
		return "router's next hop removed and re-added for"
	}
	return string(s) + " of"
}

// LosesNode reports whether the scenario takes the node out of the cluster
// (its buckets must move to the others).
func (s Scenario) LosesNode() bool { return s == Plug || s == Kill || s == Drainstop || s == SIGTERM }

// LabOnly reports whether only a lab can run the scenario: a drill does
// not signal agents or rewrite rules on a real cluster.
func (s Scenario) LabOnly() bool {
	return s == Kill || s == SIGTERM || s == Rule || s == Restart || s == Rehash
}
