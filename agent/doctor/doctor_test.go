package doctor

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/rules"
)

// goodEnv is a healthy node with two peers; each case breaks one thing.
func goodEnv() Env {
	peers := []Peer{
		{Name: "node2", HeartbeatAddr: "198.18.1.12:7946", RaftAddr: "198.18.1.12:7947", APIAddr: "198.18.1.12:7948", Live: true, Hears: true},
		{Name: "node3", HeartbeatAddr: "198.18.1.13:7946", RaftAddr: "198.18.1.13:7947", APIAddr: "198.18.1.13:7948", Live: true, Hears: true},
	}
	sysctls := map[string]string{
		"net/ipv4/conf/eth0/arp_ignore": "1", "net/ipv4/conf/eth0/arp_announce": "2",
		"net/ipv4/conf/eth0/drop_unicast_in_l2_multicast": "1",
		"net/ipv4/conf/all/rp_filter":                     "0", "net/ipv4/conf/eth0/rp_filter": "2",
		"net/ipv6/conf/eth0/drop_unicast_in_l2_multicast": "0", // checked only with an IPv6 VIP
	}
	return Env{
		Node: "node1", Interface: "eth0", VIPs: []netip.Addr{netip.MustParseAddr("198.18.1.100")}, Peers: peers,
		Kernel: func() []Feature { return []Feature{{Name: "BTF"}, {Name: "bpf_skc_lookup_tcp"}} },
		XDP:    func() (string, string, string) { return "device", "ixgbe", "native" },
		Sysctl: func(k string) (string, error) {
			if v, ok := sysctls[k]; ok {
				return v, nil
			}
			return "", errors.New("no such file")
		},
		Clock:       func() (bool, error) { return true, nil },
		Dial:        func(context.Context, string) error { return nil },
		FramesFrom:  func(context.Context, Peer) error { return nil },
		FramesTo:    func(context.Context, Peer) error { return nil },
		ARPAnswered: func() uint64 { return 3 },
	}
}

// routed puts env in routed mode with one neighbour's session as given.
func routed(state, bfd string) func(*Env) {
	return func(e *Env) {
		e.Mode = rules.MACRouted
		e.BGP = func() []BGPSession {
			s := BGPSession{Neighbor: "198.18.1.1", State: state, BFD: bfd}
			if state != "established" {
				s.LastError = "connection refused"
			}
			return []BGPSession{s}
		}
		e.Forwarding = func() *Forwarding { return &Forwarding{On: true, Self: "198.18.1.11", Peers: 2} }
	}
}

func TestDoctorVerdicts(t *testing.T) {
	tests := []struct {
		name    string
		change  func(*Env)
		check   string
		verdict Verdict
		says    []string // in the detail or the fix
	}{
		{"healthy", func(*Env) {}, "", VerdictOK, nil},
		{"missing helper", func(e *Env) {
			e.Kernel = func() []Feature {
				return []Feature{{Name: "BTF"}, {Name: "bpf_tcp_check_syncookie", Err: errors.New("not supported")}}
			}
		}, "kernel", VerdictFail, []string{"bpf_tcp_check_syncookie (not supported)"}},
		{"no program attached", func(e *Env) { e.XDP = func() (string, string, string) { return "device", "e1000", "" } },
			"xdp", VerdictFail, []string{"no XDP program attached to eth0", "agent's log"}},
		{"tc on a real driver", func(e *Env) { e.XDP = func() (string, string, string) { return "device", "e1000", "tc" } },
			"xdp", VerdictWarn, []string{"driver e1000 has no native XDP"}},
		{"tc on veth is the choice", func(e *Env) { e.XDP = func() (string, string, string) { return "veth", "", "tc" } },
			"xdp", VerdictOK, []string{"tc ingress", "veth"}},
		{"generic without tcx", func(e *Env) { e.XDP = func() (string, string, string) { return "veth", "", "generic" } },
			"xdp", VerdictWarn, []string{"no tcx", "6.6"}},
		{"arp_ignore reset", func(e *Env) {
			old := e.Sysctl
			e.Sysctl = func(k string) (string, error) {
				if strings.HasSuffix(k, "arp_ignore") {
					return "0", nil
				}
				return old(k)
			}
		}, "sysctls", VerdictFail, []string{"arp_ignore=0, want 1", "sysctl -w net.ipv4.conf.eth0.arp_ignore=1"}},
		{"ipv6 fail-safe off with an IPv6 VIP", func(e *Env) { e.VIPs = append(e.VIPs, netip.MustParseAddr("2001:db8:0:1::100")) },
			"sysctls", VerdictFail, []string{"ipv6 drop_unicast_in_l2_multicast=0, want 1", "net.ipv6.conf.eth0.drop_unicast_in_l2_multicast=1"}},
		{"clock unsynchronised", func(e *Env) { e.Clock = func() (bool, error) { return false, nil } },
			"clock", VerdictWarn, []string{"STA_UNSYNC", "chrony"}},
		{"heartbeats blocked inbound", func(e *Env) { e.Peers[1].Live = false },
			"heartbeats", VerdictFail, []string{"no heartbeat arrives here from node3 (from 198.18.1.13:7946)", "UDP heartbeat_addr"}},
		{"heartbeats blocked outbound", func(e *Env) { e.Peers[0].Hears = false },
			"heartbeats", VerdictFail, []string{"do not reach node2 (to 198.18.1.12:7946)"}},
		{"raft port closed", func(e *Env) {
			e.Dial = func(_ context.Context, addr string) error {
				if addr == "198.18.1.13:7947" {
					return errors.New("connection refused")
				}
				return nil
			}
		}, "ports", VerdictFail, []string{"node3 raft 198.18.1.13:7947: connection refused"}},
		{"cluster mac dropped towards this node", func(e *Env) {
			e.FramesFrom = func(_ context.Context, p Peer) error { return errors.New("none arrived") }
		}, "cluster_mac", VerdictFail, []string{"frames to 03:bf:c6:12:01:64 from node2 (none arrived), node3 (none arrived) do not reach this node", "flood", "MAC address spoofing", "forged transmits"}},
		{"cluster mac dropped from this node, igmp", func(e *Env) {
			e.Mode = rules.MACIGMP
			e.FramesTo = func(_ context.Context, p Peer) error {
				if p.Name == "node2" {
					return errors.New("none arrived")
				}
				return nil
			}
		}, "cluster_mac", VerdictFail, []string{"frames to 01:00:5e:7f:01:64 do not reach node2", "querier"}},
		{"no arp seen", func(e *Env) { e.ARPAnswered = func() uint64 { return 0 } },
			"gateway", VerdictWarn, []string{"no ARP request", "ip neigh replace 198.18.1.100 lladdr 03:bf:c6:12:01:64 nud permanent"}},
		{"single node", func(e *Env) { e.Peers = nil }, "cluster_mac", VerdictSkip, nil},
		{"routed, sessions up", routed("established", "up"), "bgp", VerdictOK, []string{"198.18.1.1"}},
		{"routed, session down", routed("active", ""), "bgp", VerdictFail, []string{"198.18.1.1: session active (connection refused)", "TCP 179"}},
		{"routed, bfd down", routed("established", "down"), "bgp", VerdictFail, []string{"bfd down"}},
		{"routed, no bgp section", func(e *Env) { routed("", "")(e); e.BGP = nil }, "bgp", VerdictFail, []string{"no bgp section"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := goodEnv()
			tt.change(&env)
			rep := Run(context.Background(), env)
			if len(rep.Checks) != 10 || rep.Node != "node1" {
				t.Fatalf("report %+v: want 10 checks of node1", rep)
			}
			// Routed mode has no cluster MAC; the other modes no BGP.
			skipped := map[string]bool{"bgp": true, "forwarding": true}
			if env.Mode == rules.MACRouted {
				skipped = map[string]bool{"cluster_mac": true, "gateway": true}
			}
			for _, c := range rep.Checks {
				want := VerdictOK
				if skipped[c.Name] {
					want = VerdictSkip
				}
				if c.Name == tt.check {
					want = tt.verdict
				}
				if tt.name == "single node" && (c.Name == "heartbeats" || c.Name == "ports") {
					want = VerdictSkip
				}
				if c.Verdict != want {
					t.Errorf("%s: %s (%s), want %s", c.Name, c.Verdict, c.Detail, want)
				}
				if c.Name == tt.check {
					for _, s := range tt.says {
						if !strings.Contains(c.Detail+" | "+c.Fix, s) {
							t.Errorf("%s says %q | %q, want it to say %q", c.Name, c.Detail, c.Fix, s)
						}
					}
				}
			}
			if got, want := rep.Failed(), tt.verdict == VerdictFail; got != want {
				t.Errorf("Failed() = %v, want %v", got, want)
			}
		})
	}
}

func TestJudgeNeighbour(t *testing.T) {
	vip := netip.MustParseAddr("198.18.1.100")
	cmac := rules.MACMulticast.ClusterMAC(vip)
	wrong, _ := net.ParseMAC("02:00:00:00:00:99")
	tests := []struct {
		name    string
		mode    rules.MACMode
		entries []Neighbour
		verdict Verdict
		says    string
	}{
		{"right", "", []Neighbour{{"eth0", cmac, "REACHABLE"}}, VerdictOK, "resolves to the cluster MAC"},
		{"wrong permanent", "", []Neighbour{{"eth0", wrong, "PERMANENT"}}, VerdictFail, "eth0: 02:00:00:00:00:99 (PERMANENT), want the cluster MAC 03:bf:c6:12:01:64"},
		{"mode mismatch", rules.MACIGMP, []Neighbour{{"eth0", cmac, "STALE"}}, VerdictFail, "want the cluster MAC 01:00:5e:7f:01:64"},
		{"unresolved", "", []Neighbour{{"eth0", nil, "FAILED"}}, VerdictFail, "unresolved (FAILED)"},
		{"none", "", nil, VerdictWarn, "no neighbour entry"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := judgeNeighbour(vip, tt.mode, tt.entries)
			if c.Verdict != tt.verdict || !strings.Contains(c.Detail, tt.says) {
				t.Errorf("%s: %q (fix %q), want %s saying %q", c.Verdict, c.Detail, c.Fix, tt.verdict, tt.says)
			}
			if c.Verdict == VerdictFail && !strings.Contains(c.Fix, "ip neigh replace 198.18.1.100 lladdr "+tt.mode.ClusterMAC(vip).String()) {
				t.Errorf("fix %q does not give the static entry", c.Fix)
			}
		})
	}
}

// TestForwardingCheck: routed mode's forwarding check passes only when the
// data plane forwards, with every live peer's next hop known and the MSS
// clamped; it says why otherwise, and skips the other modes.
func TestForwardingCheck(t *testing.T) {
	for _, tt := range []struct {
		name string
		mode rules.MACMode
		f    *Forwarding
		want Verdict
		says string
	}{
		{"multicast", rules.MACMulticast, nil, VerdictSkip, "not in routed mode"},
		{"no tables", rules.MACRouted, nil, VerdictWarn, "no tables"},
		{"off", rules.MACRouted, &Forwarding{}, VerdictWarn, "plain ECMP"},
		{"no clamp", rules.MACRouted, &Forwarding{On: true, ClampError: "tcx not supported"}, VerdictFail, "tcx not supported"},
		{"no mac", rules.MACRouted, &Forwarding{On: true, Peers: 2, NoMAC: []string{"node2"}}, VerdictFail, "node2"},
		{"ok", rules.MACRouted, &Forwarding{On: true, Self: "198.18.1.11", Peers: 2}, VerdictOK, "to 2 peers"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			env := Env{Mode: tt.mode}
			if tt.f != nil || tt.name == "no tables" {
				env.Forwarding = func() *Forwarding { return tt.f }
			}
			c := checkForwarding(context.Background(), env)
			if c.Verdict != tt.want || !strings.Contains(c.Detail, tt.says) {
				t.Errorf("%s: %+v; want %s saying %q", tt.name, c, tt.want, tt.says)
			}
			if c.Verdict != VerdictOK && c.Verdict != VerdictSkip && tt.name != "no tables" && c.Fix == "" {
				t.Errorf("%s: no fix given", tt.name)
			}
		})
	}
}
