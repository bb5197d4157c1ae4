package lab

import (
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/shoalnet/shoal/deploy/lab/load"
	"go.yaml.in/yaml/v3"
)

// addrEqual compares netip.Addr values, whose fields are unexported.
var addrEqual = cmp.Comparer(func(a, b netip.Addr) bool { return a == b })

func TestLayout(t *testing.T) {
	s, err := Layout("/run/shoal-lab", "shl00ab", 7, 2)
	if err != nil {
		t.Fatal(err)
	}
	want := &State{
		ID: "shl00ab", Base: "/run/shoal-lab", Dir: "/run/shoal-lab/shl00ab", Subnet: 7,
		VIP:    netip.MustParseAddr("198.18.7.100"),
		Family: Family4,
		Switch: "shl00ab-sw",
		Client: Host{Name: "client", Namespace: "shl00ab-client", Addr: netip.MustParseAddr("198.18.7.1"), BridgePort: "p-client"},
		Nodes: []Host{
			{Name: "node1", Namespace: "shl00ab-node1", Addr: netip.MustParseAddr("198.18.7.11"), BridgePort: "p-node1",
				Socket: "/run/shoal-lab/shl00ab/node1.sock", Config: "/run/shoal-lab/shl00ab/node1.yaml", DataDir: "/run/shoal-lab/shl00ab/node1/data"},
			{Name: "node2", Namespace: "shl00ab-node2", Addr: netip.MustParseAddr("198.18.7.12"), BridgePort: "p-node2",
				Socket: "/run/shoal-lab/shl00ab/node2.sock", Config: "/run/shoal-lab/shl00ab/node2.yaml", DataDir: "/run/shoal-lab/shl00ab/node2/data"},
		},
		KeyFile: "/run/shoal-lab/shl00ab/cluster.key",
	}
	if diff := cmp.Diff(want, s, addrEqual); diff != "" {
		t.Errorf("Layout (-want +got):\n%s", diff)
	}
	for _, h := range append([]Host{s.Client}, s.Nodes...) {
		if len(h.BridgePort) > 15 || len(Interface) > 15 {
			t.Errorf("link name %q longer than 15", h.BridgePort)
		}
		if !netip.MustParsePrefix("198.18.0.0/15").Contains(h.Addr) {
			t.Errorf("%s outside 198.18.0.0/15", h.Addr)
		}
	}
}

// TestLayoutFamily: a lab with IPv6 numbers its hosts in
// 2001:db8:0:<subnet>::/64 as in IPv4; family 6 serves the IPv6 VIP, dual
// both.
func TestLayoutFamily(t *testing.T) {
	a := netip.MustParseAddr
	tests := []struct {
		family Family
		vips   []netip.Addr
	}{
		{Family4, []netip.Addr{a("198.18.7.100")}},
		{Family6, []netip.Addr{a("2001:db8:0:7::100")}},
		{FamilyDual, []netip.Addr{a("198.18.7.100"), a("2001:db8:0:7::100")}},
	}
	for _, tc := range tests {
		t.Run(string(tc.family), func(t *testing.T) {
			s, err := LayoutFamily("/run/shoal-lab", "shl00ab", 7, 2, tc.family)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tc.vips, s.VIPs(), addrEqual); diff != "" {
				t.Errorf("VIPs (-want +got):\n%s", diff)
			}
			if got := s.AgentConfig(1, 0).VIPs; len(got) != len(tc.vips) {
				t.Errorf("agent config vips %v, want %v", got, tc.vips)
			}
			if !tc.family.HasIPv6() {
				if s.Client.Addr6.IsValid() || s.VIP6.IsValid() {
					t.Errorf("ipv4 lab with ipv6 addresses: client %s, vip6 %s", s.Client.Addr6, s.VIP6)
				}
				return
			}
			want := map[string]netip.Addr{"client": a("2001:db8:0:7::1"), "node1": a("2001:db8:0:7::11"), "node2": a("2001:db8:0:7::12")}
			for _, h := range append([]Host{s.Client}, s.Nodes...) {
				if h.Addr6 != want[h.Name] {
					t.Errorf("%s at %s, want %s", h.Name, h.Addr6, want[h.Name])
				}
				if !netip.MustParsePrefix("2001:db8::/32").Contains(h.Addr6) {
					t.Errorf("%s outside 2001:db8::/32", h.Addr6)
				}
			}
			// The nodes' own addresses stay IPv4: heartbeats, Raft, peers.
			if c := s.AgentConfig(0, 0); c.HeartbeatAddr != "198.18.7.11:7946" {
				t.Errorf("heartbeat address %s", c.HeartbeatAddr)
			}
		})
	}
	if _, err := LayoutFamily("/x", "shl00ab", 7, 2, "5"); err == nil {
		t.Error("family 5 accepted")
	}
	if got := URL(a("2001:db8:0:7::100")); got != "http://[2001:db8:0:7::100]:80/" {
		t.Errorf("URL = %s", got)
	}
}

func TestLayoutRejects(t *testing.T) {
	tests := []struct {
		name          string
		id            string
		subnet, nodes int
	}{
		{"id without prefix", "lab0001", 7, 3},
		{"id with a dash", "shl-001", 7, 3},
		{"subnet too big", "shl0001", 256, 3},
		{"no nodes", "shl0001", 7, 0},
		{"nodes run into the VIP", "shl0001", 7, 90},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Layout("/x", tt.id, tt.subnet, tt.nodes); err == nil {
				t.Error("Layout accepted it")
			}
		})
	}
}

func TestAgentConfig(t *testing.T) {
	s, err := Layout("/run/shoal-lab", "shl00ab", 7, 3)
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name   string
		node   int
		period time.Duration
		want   string
	}{
		{"node1 bootstraps", 0, 200 * time.Millisecond, `node_name: node1
interface: eth0
vips:
    - 198.18.7.100
data_dir: /run/shoal-lab/shl00ab/node1/data
key_file: /run/shoal-lab/shl00ab/cluster.key
heartbeat_addr: 198.18.7.11:7946
raft_addr: 198.18.7.11:7947
peer_addr: 198.18.7.11:7948
socket: /run/shoal-lab/shl00ab/node1.sock
metrics_addr: 198.18.7.11:9946
bootstrap: true
heartbeat_period: 200ms
drills: true
`},
		{"node3 joins through node1, default period", 2, 0, `node_name: node3
interface: eth0
vips:
    - 198.18.7.100
data_dir: /run/shoal-lab/shl00ab/node3/data
key_file: /run/shoal-lab/shl00ab/cluster.key
heartbeat_addr: 198.18.7.13:7946
raft_addr: 198.18.7.13:7947
peer_addr: 198.18.7.13:7948
socket: /run/shoal-lab/shl00ab/node3.sock
metrics_addr: 198.18.7.13:9946
join:
    - 198.18.7.11:7948
drills: true
`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := s.AgentConfig(tt.node, tt.period).Marshal()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, string(b)); diff != "" {
				t.Errorf("config (-want +got):\n%s", diff)
			}
			// The agent decodes heartbeat_period as a time.Duration.
			var back struct {
				Period time.Duration `yaml:"heartbeat_period"`
			}
			if err := yaml.Unmarshal(b, &back); err != nil || back.Period != tt.period {
				t.Errorf("heartbeat_period decodes to %v (%v), want %v", back.Period, err, tt.period)
			}
		})
	}
}

func TestStateSaveLoad(t *testing.T) {
	base := t.TempDir()
	s, err := Layout(base, "shl0f0f", 9, 3)
	if err != nil {
		t.Fatal(err)
	}
	s.Namespaces = []string{"shl0f0f-sw", "shl0f0f-client"}
	s.Procs = []Proc{{PID: 42, Start: 7, Role: "agent", Host: "node1", Log: "/x"}}
	s.Created = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := s.Save(); err != nil {
		t.Fatal(err)
	}
	got, err := LoadState(base, "shl0f0f")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(s, got, addrEqual); diff != "" {
		t.Errorf("round trip (-want +got):\n%s", diff)
	}
	if _, err := LoadState(base, "../etc"); !errors.Is(err, ErrBadID) {
		t.Errorf("LoadState(../etc) = %v, want ErrBadID", err)
	}
	if p := StatePath(base, "shl0f0f"); p != filepath.Join(base, "shl0f0f.json") {
		t.Errorf("StatePath = %s", p)
	}
}

func TestClusterMAC(t *testing.T) {
	if got := ClusterMAC(netip.MustParseAddr("198.18.7.100")); got != "03:bf:c6:12:07:64" {
		t.Errorf("ClusterMAC = %s", got)
	}
	if got := ClusterMAC(netip.MustParseAddr("2001:db8:0:7::100")); got != "03:be:00:00:01:00" {
		t.Errorf("ClusterMAC of an IPv6 VIP = %s", got)
	}
}

func TestLabOfNamespace(t *testing.T) {
	tests := []struct {
		ns     string
		want   string
		wantOK bool
	}{
		{"shl0a1b-sw", "shl0a1b", true},
		{"shl0a1b-client", "shl0a1b", true},
		{"shl0a1b-node12", "shl0a1b", true},
		{"shl0a1b-other", "", false},
		{"shl0a1-sw", "", false},
		{"myshl0a1b-sw", "", false},
		{"shl0A1B-sw", "", false},
	}
	for _, tt := range tests {
		t.Run(tt.ns, func(t *testing.T) {
			got, ok := labOfNamespace(tt.ns)
			if got != tt.want || ok != tt.wantOK {
				t.Errorf("labOfNamespace = %q %v, want %q %v", got, ok, tt.want, tt.wantOK)
			}
		})
	}
}

func TestParseNetnsList(t *testing.T) {
	out := "shl0a1b-node1 (id: 3)\nshl0a1b-sw (id: 0)\nplain\n\n"
	if diff := cmp.Diff([]string{"shl0a1b-node1", "shl0a1b-sw", "plain"}, parseNetnsList(out)); diff != "" {
		t.Errorf("(-want +got):\n%s", diff)
	}
}

func TestParseStat(t *testing.T) {
	// comm may hold spaces and parentheses.
	line := "1234 (sh (x) y) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 200 18446744073709551615"
	st, start, err := parseStat(line)
	if err != nil || st != 'S' || start != 987654 {
		t.Errorf("parseStat = %c %d %v, want S 987654", st, start, err)
	}
	if _, _, err := parseStat("garbage"); err == nil {
		t.Error("parseStat accepted garbage")
	}
}

func TestParseNeigh(t *testing.T) {
	tests := []struct{ out, want string }{
		{"198.18.7.100 lladdr 03:bf:c6:12:07:64 REACHABLE\n", "03:bf:c6:12:07:64"},
		{"198.18.7.100 dev eth0 lladdr 03:bf:c6:12:07:64 STALE\n", "03:bf:c6:12:07:64"},
		{"198.18.7.100 INCOMPLETE\n", ""},
		{"", ""},
	}
	for _, tt := range tests {
		if got := parseNeigh(tt.out); got != tt.want {
			t.Errorf("parseNeigh(%q) = %q, want %q", strings.TrimSpace(tt.out), got, tt.want)
		}
	}
}

func TestReportText(t *testing.T) {
	tests := []struct {
		name string
		rep  Report
		want []string // lines the text must hold
	}{
		{"aborted before the pull", Report{Lab: "shl0001", Nodes: 3, VIP: "198.18.1.100", ClusterMAC: "03:bf:c6:12:01:64", FailoverMS: -1},
			[]string{"before  -", "no plug was pulled", "client resolved the VIP to - (WRONG, want 03:bf:c6:12:01:64)"}},
		{"failover measured", Report{Lab: "shl0001", Nodes: 3, VIP: "198.18.1.100", ClusterMAC: "03:bf:c6:12:01:64",
			ClientARP: "03:bf:c6:12:01:64", Victim: "node3", PullAtMS: 1001, FailoverMS: 1234},
			[]string{"(as it should)", "plug pulled on node3 at 1001 ms: every bucket owned again after 1234 ms"}},
		{"failures around the pull", Report{Lab: "shl0001", Victim: "node3", PullAtMS: 1000, FailoverMS: 1400,
			During: load.Result{Requests: 10, Failures: 2, FailureList: []load.Failure{{AtMS: 1200, Class: load.ErrTimeout}, {AtMS: 990, Class: load.ErrReset}}}},
			[]string{"failed requests started -10 to +200 ms from the pull"}},
		{"failover missed", Report{Lab: "shl0001", Victim: "node3", FailoverMS: -1},
			[]string{"the survivors did NOT cover every bucket in time"}},
		{"dual", Report{Lab: "shl0001", Nodes: 3, VIP: "198.18.1.100", ClusterMAC: "03:bf:c6:12:01:64", ClientARP: "03:bf:c6:12:01:64", FailoverMS: -1,
			Also: []VIPReport{{VIP: "2001:db8:0:1::100", ClusterMAC: "03:be:00:00:01:00", ClientNeighbor: "03:be:00:00:01:00",
				Before: load.Result{Requests: 3000, RatePerSec: 1000, Share: map[string]float64{"node1": 0.5, "node2": 0.5}}}}},
			[]string{"and at the same time, VIP 2001:db8:0:1::100 (client resolved it to 03:be:00:00:01:00 (as it should))",
				"before    3000 requests     0 failed     1000 req/s", "node1 50.0%  node2 50.0%"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			tt.rep.WriteText(&b)
			for _, w := range tt.want {
				if !strings.Contains(b.String(), w) {
					t.Errorf("report lacks %q:\n%s", w, b.String())
				}
			}
		})
	}
}

func TestLineWatch(t *testing.T) {
	calls := 0
	w := &lineWatch{line: LoadStarted, then: func() { calls++ }}
	for _, chunk := range []string{"noise\nlab lo", "ad: started\n", "lab load: started\n", "more\n"} {
		w.Write([]byte(chunk))
	}
	if calls != 1 {
		t.Errorf("then called %d times, want once", calls)
	}
	w2 := &lineWatch{line: LoadStarted, then: func() { t.Error("called for a prefix") }}
	w2.Write([]byte("lab load: started later\n"))
}

func TestParseMDB(t *testing.T) {
	out := []byte(`[{"mdb":[{"index":3,"dev":"br0","port":"p-node2","grp":"239.255.7.100","state":"temp"},` +
		`{"index":2,"dev":"br0","port":"p-node1","grp":"239.255.7.100","state":"temp"},` +
		`{"index":4,"dev":"br0","port":"p-client","grp":"ff02::1:ff00:1","state":"temp"}],"router":{}}]`)
	ports, err := parseMDB(out, "239.255.7.100")
	if err != nil || strings.Join(ports, ",") != "p-node1,p-node2" {
		t.Errorf("parseMDB = %v, %v", ports, err)
	}
	if _, err := parseMDB([]byte("not json"), "239.255.7.100"); err == nil {
		t.Error("parseMDB accepted junk")
	}
	if got := ClusterMACIn("igmp", netip.MustParseAddr("198.18.7.100")); got != "01:00:5e:7f:07:64" {
		t.Errorf("ClusterMACIn(igmp) = %s", got)
	}
}
