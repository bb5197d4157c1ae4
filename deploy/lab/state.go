package lab

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// DefaultBase is where labs keep their state files and work directories.
const DefaultBase = "/run/shoal-lab"

// Interface is the name of every host's link to the switch, inside its
// namespace.
const Interface = "eth0"

// Bridge is the switch's bridge, inside the switch namespace.
const Bridge = "br0"

// HTTPPort is the port of the node HTTP servers and of the default rule.
const HTTPPort = 80

// Ports of a node's agent, on its own address.
const (
	HeartbeatPort = 7946
	RaftPort      = 7947
	PeerPort      = 7948
	MetricsPort   = 9946
)

// idPattern matches a lab id; namespaces are named id + "-" + role, so a
// leftover namespace can be traced back to its lab.
var idPattern = regexp.MustCompile(`^shl[0-9a-f]{4}$`)

// nsPattern matches the namespaces labs create and captures the lab id.
var nsPattern = regexp.MustCompile(`^(shl[0-9a-f]{4})-(sw|client|bystander|router2?|node[0-9]+)$`)

// ErrBadID is returned for a lab id that is not one of ours.
var ErrBadID = errors.New("lab: not a lab id (want shl + 4 hex digits)")

// State is everything a lab made, written to <base>/<id>.json before each
// step so that Down can remove exactly that, even from another process
// after a crash.
type State struct {
	ID     string `json:"id"`
	Base   string `json:"base"`
	Dir    string `json:"dir"`    // the lab's work directory
	Subnet int    `json:"subnet"` // k in 198.18.k.0/24 (and 2001:db8:0:k::/64)
	// VIP is the VIP traffic goes to: the IPv4 one, or the IPv6 one in a
	// lab of family 6.
	VIP netip.Addr `json:"vip"`
	// Family is the address family of the VIPs ("" is 4); VIP6 is the
	// IPv6 VIP of a lab of family 6 or dual.
	Family Family     `json:"family,omitempty"`
	VIP6   netip.Addr `json:"vip6,omitzero"`
	Switch string     `json:"switch_ns"`
	Client Host       `json:"client"`
	Nodes  []Host     `json:"nodes"`
	// MACMode is the cluster's MAC mode the lab was built for; in igmp
	// mode the switch snoops IGMP and Bystander (no agent, no address)
	// sits on it to count what reaches a port that joined nothing.
	MACMode string `json:"mac_mode,omitempty"`
	// NoForward: routed mode without forwarding (Options.NoForward).
	NoForward bool  `json:"no_forward,omitempty"`
	Bystander *Host `json:"bystander,omitempty"`
	// Router, in routed mode, is the namespace between the client's
	// subnet and the nodes' LAN, running FRR: its Addr is on the LAN,
	// Uplink on the client's subnet (198.19.<subnet>.0/24), where the
	// client then sits instead of on the switch.
	Router  *Host      `json:"router,omitempty"`
	Uplink  netip.Addr `json:"uplink,omitzero"`
	Uplink6 netip.Addr `json:"uplink6,omitzero"` // with IPv6: 2001:db8:1:<subnet>::1
	// Router2, if set, is a second router on the nodes' LAN only (.2),
	// which every node peers with too: a neighbour to flap while traffic
	// goes through the first.
	Router2 *Host  `json:"router2,omitempty"`
	Binary  string `json:"binary"` // the shoal binary the processes run
	// Namespaces lists the namespaces in creation order; a name is recorded
	// before it is created.
	Namespaces []string `json:"namespaces"`
	Procs      []Proc   `json:"processes"`
	KeyFile    string   `json:"key_file,omitempty"`
	// Server is the HTTP server every node runs; WebRoot, if set, is a
	// directory outside Dir that the server's unprivileged processes can
	// read (Apache's document roots).
	Server  Server `json:"server,omitempty"`
	WebRoot string `json:"web_root,omitempty"`
	// Servers, if not zero, is how many nodes (the first ones) run the
	// server; the others are at weight 0 on the VIPs' rules.
	Servers int `json:"servers,omitempty"`
	// BPF is a bpf filesystem mounted for the lab's agents to pin their
	// data planes in across a restart (`shoal restart`): `ip netns exec`
	// gives each process a mount namespace of its own, in which
	// /sys/fs/bpf is not the host's, so pins there would not outlive it.
	BPF string `json:"bpf_dir,omitempty"`
	// KeepLogs: Down copies the processes' logs here (Options.KeepLogs).
	KeepLogs string    `json:"keep_logs,omitempty"`
	Created  time.Time `json:"created"`
}

// Served returns the nodes that run the HTTP server and take connections.
func (s *State) Served() []Host {
	if s.Servers <= 0 || s.Servers > len(s.Nodes) {
		return s.Nodes
	}
	return s.Nodes[:s.Servers]
}

// Host is one namespace on the switch: a node or the client.
type Host struct {
	Name       string     `json:"name"` // node1, node2, ..., client
	Namespace  string     `json:"namespace"`
	Addr       netip.Addr `json:"addr"`
	Addr6      netip.Addr `json:"addr6,omitzero"` // in a lab with IPv6
	BridgePort string     `json:"bridge_port"`    // its veth end in the switch namespace
	Socket     string     `json:"socket,omitempty"`
	Config     string     `json:"config,omitempty"`
	DataDir    string     `json:"data_dir,omitempty"`
}

// Proc is a process the lab started.
type Proc struct {
	PID int `json:"pid"`
	// Start is the process start time from /proc/<pid>/stat, so a recycled
	// PID is never signalled.
	Start uint64 `json:"start"`
	Role  string `json:"role"` // agent, serve
	Host  string `json:"host"`
	Log   string `json:"log"`
}

// newID returns a random lab id.
func newID() (string, error) {
	var b [2]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	return "shl" + hex.EncodeToString(b[:]), nil
}

// Family is the address family of a lab's VIPs.
type Family string

// The lab's families. The nodes' own addresses (heartbeats, Raft, the
// peer API) are IPv4 in every family; with IPv6, every host also gets an
// IPv6 address and the VIPs are served over it.
const (
	Family4    Family = "4"    // an IPv4 VIP
	Family6    Family = "6"    // an IPv6 VIP
	FamilyDual Family = "dual" // an IPv4 and an IPv6 VIP at once
)

// ParseFamily returns the family called s ("" is 4).
func ParseFamily(s string) (Family, error) {
	switch Family(s) {
	case "", Family4:
		return Family4, nil
	case Family6, FamilyDual:
		return Family(s), nil
	}
	return "", fmt.Errorf("lab: unknown family %q (want 4, 6 or dual)", s)
}

// HasIPv6 reports whether a lab of family f serves an IPv6 VIP.
func (f Family) HasIPv6() bool { return f == Family6 || f == FamilyDual }

// Layout is LayoutFamily for an IPv4 lab.
func Layout(base, id string, subnet, nodes int) (*State, error) {
	return LayoutFamily(base, id, subnet, nodes, Family4)
}

// LayoutFamily fills in a lab's names and addresses (nothing is created):
// the switch, the client at .1, nodes at .11, .12, ..., the VIP at .100 of
// 198.18.<subnet>.0/24; with IPv6, the same host numbers in
// 2001:db8:0:<subnet>::/64 (the VIP 2001:db8:0:<subnet>::100).
func LayoutFamily(base, id string, subnet, nodes int, family Family) (*State, error) {
	family, err := ParseFamily(string(family))
	if err != nil {
		return nil, err
	}
	if !idPattern.MatchString(id) {
		return nil, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	if subnet < 0 || subnet > 255 {
		return nil, fmt.Errorf("lab: subnet %d outside 0..255", subnet)
	}
	if nodes < 1 || nodes > 89 { // .11 .. .99, below the VIP
		return nil, fmt.Errorf("lab: %d nodes; want 1..89", nodes)
	}
	addr := func(last int) netip.Addr { return netip.AddrFrom4([4]byte{198, 18, byte(subnet), byte(last)}) }
	addr6 := func(last int) netip.Addr {
		if !family.HasIPv6() {
			return netip.Addr{}
		}
		// 2001:db8:0:<subnet>::<last>, the host number read as hex digits
		// written in decimal (::11 for .11, ::100 for .100).
		b := [16]byte{0x20, 0x01, 0x0d, 0xb8, 6: 0, 7: byte(subnet)}
		v, _ := strconv.ParseUint(strconv.Itoa(last), 16, 16)
		b[14], b[15] = byte(v>>8), byte(v)
		return netip.AddrFrom16(b)
	}
	dir := filepath.Join(base, id)
	s := &State{
		ID:     id,
		Base:   base,
		Dir:    dir,
		Subnet: subnet,
		VIP:    addr(100),
		Family: family,
		VIP6:   addr6(100),
		Switch: id + "-sw",
		Client: Host{Name: "client", Namespace: id + "-client", Addr: addr(1), Addr6: addr6(1), BridgePort: "p-client"},
	}
	if family == Family6 {
		s.VIP = s.VIP6
	}
	for i := 1; i <= nodes; i++ {
		name := fmt.Sprintf("node%d", i)
		s.Nodes = append(s.Nodes, Host{
			Name:       name,
			Namespace:  id + "-" + name,
			Addr:       addr(10 + i),
			Addr6:      addr6(10 + i),
			BridgePort: "p-" + name,
			Socket:     filepath.Join(dir, name+".sock"),
			Config:     filepath.Join(dir, name+".yaml"),
			DataDir:    filepath.Join(dir, name, "data"),
		})
	}
	s.KeyFile = filepath.Join(dir, "cluster.key")
	return s, nil
}

// VIPs returns every VIP the lab serves: VIP, and VIP6 in a dual lab.
func (s *State) VIPs() []netip.Addr {
	if s.Family == FamilyDual {
		return []netip.Addr{s.VIP, s.VIP6}
	}
	return []netip.Addr{s.VIP}
}

// URL is the address of the HTTP servers behind vip.
func URL(vip netip.Addr) string {
	return fmt.Sprintf("http://%s/", netip.AddrPortFrom(vip, HTTPPort))
}

// StatePath is where the state of lab id is kept.
func StatePath(base, id string) string { return filepath.Join(base, id+".json") }

// Save writes the state file atomically.
func (s *State) Save() error {
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		return err
	}
	p := StatePath(s.Base, s.ID)
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("lab: write state: %w", err)
	}
	if err := os.Rename(tmp, p); err != nil {
		return fmt.Errorf("lab: write state: %w", err)
	}
	return nil
}

// LoadState reads the state file of lab id.
func LoadState(base, id string) (*State, error) {
	if !idPattern.MatchString(id) {
		return nil, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	b, err := os.ReadFile(StatePath(base, id))
	if err != nil {
		return nil, fmt.Errorf("lab: read state: %w", err)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("lab: state file %s: %w", StatePath(base, id), err)
	}
	return &s, nil
}

// HostByName returns the node, client or bystander called name.
func (s *State) HostByName(name string) (Host, bool) {
	if name == s.Client.Name {
		return s.Client, true
	}
	for _, r := range s.routers() {
		if name == r.Name {
			return *r, true
		}
	}
	if s.Bystander != nil && name == s.Bystander.Name {
		return *s.Bystander, true
	}
	for _, n := range s.Nodes {
		if n.Name == name {
			return n, true
		}
	}
	return Host{}, false
}

// AgentConfig is the agent's configuration file as the lab writes it; the
// field names are the agent's.
type AgentConfig struct {
	NodeName        string   `yaml:"node_name"`
	Interface       string   `yaml:"interface"`
	VIPs            []string `yaml:"vips"`
	DataDir         string   `yaml:"data_dir"`
	KeyFile         string   `yaml:"key_file"`
	AcceptKeyFiles  []string `yaml:"accept_key_files,omitempty"`
	HeartbeatAddr   string   `yaml:"heartbeat_addr"`
	RaftAddr        string   `yaml:"raft_addr"`
	PeerAddr        string   `yaml:"peer_addr"`
	Socket          string   `yaml:"socket"`
	MetricsAddr     string   `yaml:"metrics_addr"`
	Bootstrap       bool     `yaml:"bootstrap,omitempty"`
	Join            []string `yaml:"join,omitempty"`
	HeartbeatPeriod string   `yaml:"heartbeat_period,omitempty"`
	Drills          bool     `yaml:"drills"` // the lab is for drills: `shoal drill plug` over the peer API
	BGP             *BGP     `yaml:"bgp,omitempty"`
}

// BGP is the agent config's bgp section, for routed mode.
type BGP struct {
	ASN       uint32        `yaml:"asn"`
	NextHop6  string        `yaml:"next_hop6,omitempty"`
	Neighbors []BGPNeighbor `yaml:"neighbors"`
	NoForward bool          `yaml:"no_forward,omitempty"`
}

// BGPNeighbor is one router of a node.
type BGPNeighbor struct {
	Address string `yaml:"address"`
	ASN     uint32 `yaml:"asn"`
	BFD     struct {
		Enabled  bool   `yaml:"enabled"`
		Interval string `yaml:"interval"`
	} `yaml:"bfd"`
}

// The routed lab's AS numbers: the router's, and node i's is NodeASN+i
// (each node its own, as servers in a data centre often are).
const (
	RouterASN = 65000
	NodeASN   = 65001
)

// BFDInterval is the lab's BFD interval on both sides (3 missed: 300 ms).
const BFDInterval = 100 * time.Millisecond

// makeRouted lays the lab out for routed mode: the router takes .1 on the
// LAN, and the client moves behind it, to 198.19.<subnet>.10; with two
// routers, the second takes .2.
func (s *State) makeRouted(routers int) {
	s.MACMode = "routed"
	s.Router = &Host{Name: "router", Namespace: s.ID + "-router", Addr: s.Client.Addr, Addr6: s.Client.Addr6, BridgePort: "p-router"}
	if s.Client.Addr6.IsValid() {
		b := s.Client.Addr6.As16()
		b[5] = 1 // 2001:db8:1:<subnet>::
		s.Uplink6 = netip.AddrFrom16(b)
		b[15] = 0x10
		s.Client.Addr6 = netip.AddrFrom16(b)
	}
	if routers > 1 {
		s.Router2 = &Host{Name: "router2", Namespace: s.ID + "-router2", Addr: s.Client.Addr.Next(), BridgePort: "p-router2"}
	}
	s.Uplink = netip.AddrFrom4([4]byte{198, 19, byte(s.Subnet), 1})
	s.Client.Addr = netip.AddrFrom4([4]byte{198, 19, byte(s.Subnet), 10})
	s.Client.BridgePort = ""
}

// AgentConfig returns the configuration of node i (0-based): node 0
// bootstraps the cluster, the others join through it.
func (s *State) AgentConfig(i int, period time.Duration) AgentConfig {
	n := s.Nodes[i]
	at := func(port int) string { return netip.AddrPortFrom(n.Addr, uint16(port)).String() }
	c := AgentConfig{
		NodeName:      n.Name,
		Interface:     Interface,
		VIPs:          vipStrings(s.VIPs()),
		DataDir:       n.DataDir,
		KeyFile:       s.KeyFile,
		HeartbeatAddr: at(HeartbeatPort),
		RaftAddr:      at(RaftPort),
		PeerAddr:      at(PeerPort),
		Socket:        n.Socket,
		MetricsAddr:   at(MetricsPort),
		Drills:        true,
	}
	if i == 0 {
		c.Bootstrap = true
	} else {
		c.Join = []string{netip.AddrPortFrom(s.Nodes[0].Addr, PeerPort).String()}
	}
	if period > 0 {
		c.HeartbeatPeriod = period.String()
	}
	if s.Router != nil {
		c.BGP = &BGP{ASN: NodeASN + uint32(i), NoForward: s.NoForward}
		if n.Addr6.IsValid() {
			c.BGP.NextHop6 = n.Addr6.String()
		}
		for _, r := range s.routers() {
			n := BGPNeighbor{Address: r.Addr.String(), ASN: RouterASN}
			n.BFD.Enabled = true
			n.BFD.Interval = BFDInterval.String()
			c.BGP.Neighbors = append(c.BGP.Neighbors, n)
		}
	}
	return c
}

func vipStrings(vips []netip.Addr) []string {
	out := make([]string, len(vips))
	for i, v := range vips {
		out[i] = v.String()
	}
	return out
}

// Marshal renders the configuration as YAML.
func (c AgentConfig) Marshal() ([]byte, error) { return yaml.Marshal(c) }

// ClusterMAC is the multicast MAC a VIP resolves to: 03:bf and the VIP's
// four bytes, for an IPv6 VIP 03:be and its last four (as agent.ClusterMAC).
func ClusterMAC(vip netip.Addr) string {
	if vip.Is4() {
		b := vip.As4()
		return fmt.Sprintf("03:bf:%02x:%02x:%02x:%02x", b[0], b[1], b[2], b[3])
	}
	b := vip.As16()
	return fmt.Sprintf("03:be:%02x:%02x:%02x:%02x", b[12], b[13], b[14], b[15])
}

// ClusterMACIn is the MAC a VIP resolves to in the cluster's MAC mode: in
// igmp mode the MAC of the group the nodes join (IGMPGroup): 01:00:5e:7f
// and an IPv4 VIP's last two bytes, 33:33:ef:ff and an IPv6 VIP's.
func ClusterMACIn(mode string, vip netip.Addr) string {
	if mode != "igmp" {
		return ClusterMAC(vip)
	}
	b := vip.As16()
	if vip.Is4() {
		return fmt.Sprintf("01:00:5e:7f:%02x:%02x", b[14], b[15])
	}
	return fmt.Sprintf("33:33:ef:ff:%02x:%02x", b[14], b[15])
}

// IGMPGroup is the group the nodes join for vip in igmp mode:
// 239.255.x.y for an IPv4 VIP, the MLD group ff05::efff:xxyy for an IPv6
// one (x.y its last two bytes).
func IGMPGroup(vip netip.Addr) netip.Addr {
	b := vip.As16()
	if vip.Is4() {
		return netip.AddrFrom4([4]byte{239, 255, b[14], b[15]})
	}
	return netip.AddrFrom16([16]byte{0: 0xff, 1: 0x05, 12: 0xef, 13: 0xff, 14: b[14], 15: b[15]})
}

// ClusterMAC returns the MAC the lab's VIP resolves to in its MAC mode.
func (s *State) ClusterMAC() string { return ClusterMACIn(s.MACMode, s.VIP) }

// labOfNamespace returns the lab id a namespace name belongs to, if any.
func labOfNamespace(ns string) (string, bool) {
	m := nsPattern.FindStringSubmatch(ns)
	if m == nil {
		return "", false
	}
	return m[1], true
}

// parseNetnsList parses `ip netns list` output into names.
func parseNetnsList(out string) []string {
	var names []string
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			names = append(names, f[0])
		}
	}
	return names
}

// routers returns the lab's routers: the one between the client and the
// nodes, and the second one, on the nodes' LAN only, if there is one.
func (s *State) routers() []*Host {
	var out []*Host
	for _, r := range []*Host{s.Router, s.Router2} {
		if r != nil {
			out = append(out, r)
		}
	}
	return out
}

// pathspace is a router's FRR instance name (vtysh -N): the lab id, and
// for the second router the lab id and "b".
func (s *State) pathspace(r *Host) string {
	if r == s.Router2 {
		return s.ID + "b"
	}
	return s.ID
}
