package control

import (
	"net/netip"
	"time"

	"github.com/shoalnet/shoal/agent/announce"
	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// Status is one node's own view of itself, as `shoal status` prints it.
type Status struct {
	NodeID      filter.NodeID `json:"node_id"`
	NodeName    string        `json:"node_name"`
	Admin       string        `json:"admin"`
	Healthy     bool          `json:"healthy"`
	HealthError string        `json:"health_error,omitempty"`
	Converged   bool          `json:"converged"`
	RulesIndex  uint64        `json:"rules_index"`
	TablesIndex uint64        `json:"tables_index"` // rules index of the tables in the data plane
	// TablesAt is when the data plane's tables last changed (a push that
	// changed them): what Accepting, Draining and Dirty count took effect
	// then, which `shoal lab run` uses to time a failover to the push
	// that completed it rather than to its next poll.
	TablesAt    time.Time             `json:"tables_at,omitzero"`
	View        ViewInfo              `json:"view"`
	Live        []filter.NodeID       `json:"live"`
	Accepting   map[filter.RuleID]int `json:"accepting"`   // buckets taking new connections, per rule
	Draining    map[filter.RuleID]int `json:"draining"`    // buckets held only for existing connections
	Dirty       map[filter.RuleID]int `json:"dirty"`       // accepting buckets another node still drains
	Connections int                   `json:"connections"` // TCP connections held on the VIPs
	Plugged     bool                  `json:"plugged,omitempty"`
	Leader      string                `json:"leader"`
	// RulesStopped says why this node stopped applying the rules log (an
	// entry its shoal cannot apply); the data plane keeps the rules of
	// RulesIndex. Empty: applying.
	RulesStopped string `json:"rules_stopped,omitempty"`
	// DataplaneHealthy is false after the data plane refused a table push,
	// until a push succeeds and a hold-down passes; meanwhile the node is
	// not eligible. UpdateFailures counts refused pushes since start.
	DataplaneHealthy bool   `json:"dataplane_healthy"`
	DataplaneError   string `json:"dataplane_error,omitempty"`
	UpdateFailures   uint64 `json:"update_failures"`
	Leaving          bool   `json:"leaving,omitempty"` // a graceful stop is handing off
	// HeartbeatPeriod and HeartbeatTolerance are the heartbeat timing this
	// node uses now: changed settings take effect once the cluster has
	// converged on the rules that carry them.
	HeartbeatPeriod    string `json:"heartbeat_period"`
	HeartbeatTolerance int    `json:"heartbeat_tolerance"`
	PeerDeaths         uint64 `json:"peer_deaths"` // peers declared dead since membership (re)started
	// Stalls counts the times this node's membership found it had sent no
	// heartbeat for longer than its data-plane lease (SIGSTOP, a paused
	// VM, starved of CPU) and released everything to rejoin.
	Stalls uint64 `json:"stalls"`
	// BGP is this node's speaker (routed mode); nil without one.
	BGP *BGPInfo `json:"bgp,omitempty"`
	// Raft is this node's place in Raft and, on the leader, the voters'
	// health as its autopilot sees it.
	Raft RaftInfo `json:"raft"`
}

// RaftInfo is a node's place in Raft. The leader runs the autopilot that
// keeps five voters (rules.VoterPolicy) and adds what it knows: the
// members' health, how many voters may fail with the rules still
// writable, and the last vote it gave or took.
type RaftInfo struct {
	Role      string `json:"role"` // leader, voter, non-voter, or none (not in the configuration)
	Voters    int    `json:"voters"`
	NonVoters int    `json:"non_voters"`
	// Leader only (Autopilot false elsewhere).
	Autopilot        bool             `json:"autopilot"`
	Healthy          bool             `json:"healthy,omitempty"` // every member healthy
	FailureTolerance int              `json:"failure_tolerance,omitempty"`
	Unhealthy        []string         `json:"unhealthy,omitempty"` // members the autopilot finds unhealthy
	VoterChanges     uint64           `json:"voter_changes,omitempty"`
	LastChange       *rules.Promotion `json:"last_change,omitempty"`
}

// ViewInfo is the membership view a node acts on.
type ViewInfo struct {
	Eligible   []filter.NodeID `json:"eligible"`
	RulesIndex uint64          `json:"rules_index"`
	Seed       uint32          `json:"seed"`
}

// Query is the cluster as one node sees it, as `shoal query` prints it.
type Query struct {
	Self       string      `json:"self"`
	Converged  bool        `json:"converged"`
	RulesIndex uint64      `json:"rules_index"`
	Leader     string      `json:"leader"`
	Nodes      []NodeInfo  `json:"nodes"`
	Rules      []RuleInfo  `json:"rules"`
	VIPs       []string    `json:"vips"`
	Settings   SettingInfo `json:"settings"`
	// BGP is the asked node's speaker (routed mode); nil without one.
	BGP *BGPInfo `json:"bgp,omitempty"`
	// Raft is the asked node's place in Raft (and, asked of the leader,
	// the voters' health).
	Raft RaftInfo `json:"raft"`
	// Forwarding is what the asked node forwarded to and received from
	// each peer (routed mode); nil in the other modes.
	Forwarding *ForwardInfo `json:"forwarding,omitempty"`
}

// ForwardInfo is a node's routed-mode forwarding: per peer, the packets it
// forwarded there as the bucket's owner, those it forwarded there as a
// previous owner that may hold the connection (the second chance), and
// those it received from there; and what it dropped instead of forwarding.
type ForwardInfo struct {
	On    bool          `json:"on"` // false: plain ECMP (bgp.no_forward)
	Peers []ForwardPeer `json:"peers"`
	// Foreign: packets forwarded here by an address that is no member's
	// (or carrying no VIP traffic). NoRoute: not forwarded for want of
	// the next hop's MAC. HopLimit: not taken after the most hops. TooBig:
	// over the MTU once encapsulated.
	Foreign  uint64 `json:"foreign"`
	NoRoute  uint64 `json:"no_route"`
	HopLimit uint64 `json:"hop_limit"`
	TooBig   uint64 `json:"too_big"`
	// ClampError: why SYN-ACKs leave without the MSS clamp the forwarding
	// needs (full-size segments forwarded here are then dropped as too big).
	ClampError string `json:"clamp_error,omitempty"`
}

// ForwardPeer is one peer's forwarding counters.
type ForwardPeer struct {
	Node         string     `json:"node"`
	Addr         netip.Addr `json:"addr"`
	Forwarded    uint64     `json:"forwarded"`
	SecondChance uint64     `json:"second_chance"`
	Received     uint64     `json:"received"`
}

// BGPInfo is a node's BGP speaker: its sessions, one per neighbour, and
// the VIPs it announces now, with when each was announced.
type BGPInfo struct {
	Sessions  []announce.Session       `json:"sessions"`
	Announced map[netip.Addr]time.Time `json:"announced"`
}

// SettingInfo shows the cluster settings.
type SettingInfo struct {
	ClusterID          uint32 `json:"cluster_id"`
	HashSeed           uint32 `json:"hash_seed"`
	HeartbeatPeriod    string `json:"heartbeat_period"`
	HeartbeatTolerance int    `json:"heartbeat_tolerance"`
	MACMode            string `json:"mac_mode"` // multicast, igmp or routed
}

// NodeInfo is one registered node in a Query.
type NodeInfo struct {
	ID           filter.NodeID `json:"id"`
	Name         string        `json:"name"`
	HostPriority int           `json:"host_priority"`
	Admin        string        `json:"admin"`
	Live         bool          `json:"live"`
	Healthy      bool          `json:"healthy"`
	Eligible     bool          `json:"eligible"`
	// RulesIndex is the rules index the node has applied: this node's
	// own, a peer's as its last heartbeat advertised it (0 if unheard).
	RulesIndex uint64 `json:"rules_index"`
	// Share is the fraction of each rule's buckets the node owns in the
	// current view (the default rule is "0").
	Share         map[filter.RuleID]float64 `json:"share"`
	HeartbeatAddr string                    `json:"heartbeat_addr"`
	APIAddr       string                    `json:"api_addr"`
	// Raft: leader, voter, non-voter, or none (not in the configuration);
	// Zone: where it is, as registered.
	Raft string `json:"raft"`
	Zone string `json:"zone,omitempty"`
}

// RuleInfo is one port rule with every node's settings for it.
type RuleInfo struct {
	ID       filter.RuleID           `json:"id"`
	VIP      string                  `json:"vip"` // "all" for every VIP
	Ports    string                  `json:"ports"`
	Proto    string                  `json:"proto"`
	Mode     string                  `json:"mode"`
	Affinity string                  `json:"affinity"`
	State    string                  `json:"state"`
	Nodes    map[string]NodeRuleInfo `json:"nodes"`
}

// NodeRuleInfo is a node's settings for one rule.
type NodeRuleInfo struct {
	Weight           int    `json:"weight"`
	HandlingPriority int    `json:"handling_priority"`
	State            string `json:"state"`
}

// Params is a node's configuration and live counters, for `shoal display`.
type Params struct {
	Config    config.Config                    `json:"config"`
	Settings  SettingInfo                      `json:"settings"`
	Packets   map[filter.RuleID]PacketCounters `json:"packets"`
	Heartbeat map[string]uint64                `json:"heartbeat"`
	ARP       map[string]uint64                `json:"arp"`
	BGP       map[string]uint64                `json:"bgp,omitempty"` // the BGP speaker's counters (routed mode)
	// Forwarding: routed mode's forwarding counters (Query.Forwarding).
	Forwarding *ForwardInfo      `json:"forwarding,omitempty"`
	NDP        map[string]uint64 `json:"ndp"` // Neighbor Solicitations for the IPv6 VIPs, by outcome
}

// PacketCounters are one rule's data-plane counters.
type PacketCounters struct {
	Accepted uint64            `json:"accepted"`
	Dropped  map[string]uint64 `json:"dropped"`
	// Hand-overs of SYNs in buckets moving between nodes: "out" handed
	// over to the new owner, "in" handed to this node and taken,
	// "refused" handed to this node and dropped (it took the SYN already).
	// Not in Accepted or Dropped: every node judges each frame the
	// clients send once, in Accepted, Dropped or "out".
	Handed map[string]uint64 `json:"handed,omitempty"`
	// Forwarded: packets forwarded to another node (routed mode), in
	// neither Accepted nor Dropped.
	Forwarded uint64 `json:"forwarded,omitempty"`
}

// Requests of the control API.
type (
	// AdminRequest sets a node's admin state; Node "" means this node.
	AdminRequest struct {
		Node  string `json:"node"`
		State string `json:"state"`
	}
	// RuleRequest adds a port rule.
	RuleRequest struct {
		VIP      string `json:"vip"` // "" or "all" for every VIP
		Ports    string `json:"ports"`
		Proto    string `json:"proto"`
		Mode     string `json:"mode"`
		Affinity string `json:"affinity"`
	}
	// RuleEditRequest changes a port rule in place (`shoal rules set`):
	// the fields given replace the rule's; the others, its state and every
	// node's settings for it are kept.
	RuleEditRequest struct {
		VIP      string `json:"vip,omitempty"` // "all" for every VIP
		Ports    string `json:"ports,omitempty"`
		Proto    string `json:"proto,omitempty"`
		Mode     string `json:"mode,omitempty"`
		Affinity string `json:"affinity,omitempty"`
	}
	// SettingsRequest changes the cluster settings that are given.
	SettingsRequest struct {
		HashSeed           *uint32 `json:"hash_seed,omitempty"`
		HeartbeatPeriod    string  `json:"heartbeat_period,omitempty"` // a Go duration: 75ms
		HeartbeatTolerance *int    `json:"heartbeat_tolerance,omitempty"`
		MACMode            string  `json:"mac_mode,omitempty"` // multicast or igmp
	}
	// RuleStateRequest enables, disables or drains a rule ("vip:port", an
	// id, or "all"), on one node or, with AllNodes, cluster-wide.
	RuleStateRequest struct {
		Target   string `json:"target"`
		State    string `json:"state"`
		Node     string `json:"node"`
		AllNodes bool   `json:"all_nodes"`
	}
	// WeightRequest sets a node's load weight on a rule: 0-100 or "equal".
	// Node may list several nodes, comma-separated ("node3,node4"); every
	// pair of rule and node changes in one write. Empty: this node.
	WeightRequest struct {
		Rule   string `json:"rule"`
		Node   string `json:"node"`
		Weight string `json:"weight"`
	}
	// PriorityRequest sets a node's host priority, or with Rule its
	// handling priority for a single-host rule.
	PriorityRequest struct {
		Rule     string `json:"rule"`
		Node     string `json:"node"`
		Priority int    `json:"priority"`
	}
	// PlugRequest pulls (or puts back) this node's virtual plug: it stops
	// heartbeating and drops every VIP packet, as if its cable were cut.
	// A pull restores itself after RestoreAfter, at most (and by default)
	// MaxPlugPull.
	PlugRequest struct {
		Pulled       bool          `json:"pulled"`
		RestoreAfter time.Duration `json:"restore_after,omitempty"`
	}
	// RestartRequest arms a hitless restart: the agent's next stop (within
	// a minute) keeps its data plane and announces a restart window of
	// Window (default and at most 10 s) instead of handing off.
	RestartRequest struct {
		Window time.Duration `json:"window,omitempty"`
	}
	// RestartArmed answers a RestartRequest.
	RestartArmed struct {
		Window time.Duration `json:"window"`
		Until  time.Time     `json:"until"` // a stop after this is a graceful stop again
	}
	// APIError is the body of every error response.
	APIError struct {
		Error string `json:"error"`
	}
)

// Simulation says which node takes a flow, as `shoal simulate` prints it.
type Simulation struct {
	Rule   filter.RuleID     `json:"rule"`
	Bucket uint16            `json:"bucket"`
	Owner  string            `json:"owner"`   // in the current view; "" when nobody takes it
	Here   string            `json:"here"`    // this node's state for the bucket
	IfDown map[string]string `json:"if_down"` // owner if that node failed
}

// DefaultRestartWindow is the restart window `shoal restart` asks for
// unless told otherwise.
const DefaultRestartWindow = heartbeat.MaxRestartWindow

// SettingsOf is the cluster settings s as the API shows them.
func SettingsOf(s rules.Settings) SettingInfo {
	return SettingInfo{ClusterID: s.ClusterID, HashSeed: s.HashSeed, HeartbeatPeriod: s.HeartbeatPeriod.String(), HeartbeatTolerance: s.HeartbeatTolerance, MACMode: s.MACMode.String()}
}
