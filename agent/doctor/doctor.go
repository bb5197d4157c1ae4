package doctor

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"

	"github.com/shoalnet/shoal/rules"
)

// Verdict is a doctor check's result.
type Verdict string

// Verdicts, from good to bad. Only VerdictFail makes `shoal doctor` exit
// non-zero.
const (
	VerdictOK   Verdict = "ok"
	VerdictSkip Verdict = "skip" // nothing to check (a single node has no peers)
	VerdictWarn Verdict = "warn"
	VerdictFail Verdict = "fail"
)

// Check is one check of the network around a node: what was found
// and, unless it passed, what to do.
type Check struct {
	Name    string  `json:"name"`
	Verdict Verdict `json:"verdict"`
	Detail  string  `json:"detail"`
	Fix     string  `json:"fix,omitempty"`
}

// Report is one node's checks.
type Report struct {
	Node   string  `json:"node"`
	Checks []Check `json:"checks"`
}

// Failed reports whether any check failed.
func (r Report) Failed() bool {
	return slices.ContainsFunc(r.Checks, func(c Check) bool { return c.Verdict == VerdictFail })
}

// Feature is one kernel feature the agent needs and whether it is there.
type Feature struct {
	Name string
	Err  error // nil: present
}

// Peer is a registered peer as the doctor checks it.
type Peer struct {
	Name          string
	HeartbeatAddr string // host:port, UDP
	RaftAddr      string // host:port, TCP
	APIAddr       string // host:port, TCP (mutual TLS)
	Live          bool   // its heartbeats arrive here
	Hears         bool   // its heartbeats say it hears this node's
}

// Env is what the checks look at: the node's facts and the probes
// that find the rest. The Linux agent fills it with real probes; tests
// drive the verdicts with fakes.
type Env struct {
	Node      string
	Interface string
	VIPs      []netip.Addr
	Mode      rules.MACMode
	Peers     []Peer

	Kernel func() []Feature
	// XDP returns the cluster interface's link type ("veth", "device"
	// ...), its driver ("" if none) and the mode the program is attached
	// in ("native", "tc", "generic", "" if not attached).
	XDP func() (linkType, driver, mode string)
	// Sysctl reads /proc/sys/<key>.
	Sysctl func(key string) (string, error)
	// Clock says whether the kernel clock is synchronised (adjtimex).
	Clock func() (synced bool, err error)
	// Dial opens and closes a TCP connection to addr.
	Dial func(ctx context.Context, addr string) error
	// FramesFrom has peer p send a probe frame to the cluster MAC and
	// reports whether this node received it; FramesTo sends one from this
	// node and asks p whether it arrived. nil: it arrived.
	FramesFrom func(ctx context.Context, p Peer) error
	FramesTo   func(ctx context.Context, p Peer) error
	// ARPAnswered is how many ARP requests (and Neighbor Solicitations)
	// for the VIPs this node has answered since it started.
	ARPAnswered func() uint64
	// BGP, in routed mode, is the node's BGP sessions, one per configured
	// neighbour; nil when the node has no bgp section.
	BGP func() []BGPSession
	// Forwarding, in routed mode, is the data plane's forwarding as its
	// tables have it; nil: none pushed yet.
	Forwarding func() *Forwarding
}

// Forwarding is what the doctor needs of routed mode's forwarding.
type Forwarding struct {
	On         bool     // the tables forward (off: bgp.no_forward, or no IPv4 address)
	Self       string   // the address it forwards from
	Peers      int      // peers it can forward to
	NoMAC      []string // live peers whose next hop's MAC is not known
	ClampError string   // why the SYN-ACKs' MSS is not clamped; "" when it is
}

// BGPSession is what the doctor needs of a BGP session.
type BGPSession struct {
	Neighbor  string
	State     string // established, active, ...
	BFD       string // up, down, init, ""
	LastError string
}

// Run runs every check on env. The checks that talk to peers run
// concurrently; the report's order is fixed.
func Run(ctx context.Context, env Env) Report {
	checks := []func(context.Context, Env) Check{
		checkKernel, checkXDP, checkSysctls, checkClock, checkHeartbeats, checkPorts, checkClusterMAC, checkGateway, checkBGP,
		checkForwarding,
	}
	out := make([]Check, len(checks))
	var wg sync.WaitGroup
	for i, c := range checks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = c(ctx, env)
		}()
	}
	wg.Wait()
	return Report{Node: env.Node, Checks: out}
}

func checkKernel(_ context.Context, env Env) Check {
	c := Check{Name: "kernel"}
	var have, missing []string
	for _, f := range env.Kernel() {
		if f.Err != nil {
			missing = append(missing, fmt.Sprintf("%s (%v)", f.Name, f.Err))
		} else {
			have = append(have, f.Name)
		}
	}
	if len(missing) > 0 {
		c.Verdict, c.Detail = VerdictFail, "missing: "+strings.Join(missing, "; ")
		c.Fix = "run a kernel with BPF, XDP and BTF (CONFIG_BPF_SYSCALL, CONFIG_DEBUG_INFO_BTF; Linux 5.10 or later has every helper shoal uses)"
		return c
	}
	c.Verdict, c.Detail = VerdictOK, "present: "+strings.Join(have, ", ")
	return c
}

func checkXDP(_ context.Context, env Env) Check {
	c := Check{Name: "xdp"}
	typ, driver, mode := env.XDP()
	drv := typ
	if driver != "" {
		drv = driver
	}
	switch {
	case mode == "":
		c.Verdict, c.Detail = VerdictFail, fmt.Sprintf("no XDP program attached to %s (driver %s)", env.Interface, drv)
		c.Fix = "the agent attaches it at start and after a link change: see the agent's log (journalctl -u shoal) for the attach error"
	case mode == "native":
		c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("native XDP on %s (driver %s)", env.Interface, drv)
	case mode == "tc" && typ == "veth":
		c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("tc ingress (tcx) on %s (veth: native XDP on veth keeps the multicast packet type after the MAC rewrite and TCP drops the packet; tc ingress costs less than generic XDP)", env.Interface)
	case mode == "tc":
		c.Verdict, c.Detail = VerdictWarn, fmt.Sprintf("tc ingress (tcx) on %s: driver %s has no native XDP", env.Interface, drv)
		c.Fix = "it works, at the cost of an skb for every packet before the verdict; a NIC whose driver supports native XDP (ixgbe, i40e, ice, mlx5, virtio_net, ...) drops unowned packets earlier"
	default:
		c.Verdict, c.Detail = VerdictWarn, fmt.Sprintf("generic XDP on %s (driver %s): this kernel has no tcx, the cheaper fallback", env.Interface, drv)
		c.Fix = "it works; a kernel with tcx (6.6 or later) attaches at tc ingress instead, 25-55 ns a packet cheaper on veth, and a NIC whose driver supports native XDP (ixgbe, i40e, ice, mlx5, virtio_net, ...) drops unowned packets earlier still"
	}
	return c
}

// sysctlWant is what the agent sets on the cluster interface (as the
// sysctls table in vip_linux.go); the IPv6 one is checked when there is an
// IPv6 VIP.
var sysctlWant = []struct {
	name, want, why string
	ipv6            bool
}{
	{"arp_ignore", "1", "else the kernel answers ARP for the VIP (on lo) with the node's own MAC", false},
	{"arp_announce", "2", "else the kernel's ARP requests may carry the VIP as sender", false},
	{"drop_unicast_in_l2_multicast", "1", "the fail-safe: without it a node whose agent died answers the VIP's packets", false},
	{"drop_unicast_in_l2_multicast", "1", "the IPv6 fail-safe: without it a node whose agent died answers the IPv6 VIP's packets", true},
}

func checkSysctls(_ context.Context, env Env) Check {
	c := Check{Name: "sysctls"}
	var bad, fixes, good []string
	hasV6 := slices.ContainsFunc(env.VIPs, func(v netip.Addr) bool { return v.Is6() && !v.Is4In6() })
	for _, s := range sysctlWant {
		if s.ipv6 && !hasV6 {
			continue
		}
		fam := "ipv4"
		if s.ipv6 {
			fam = "ipv6"
		}
		key, name := "net/"+fam+"/conf/"+env.Interface+"/"+s.name, s.name
		if s.ipv6 {
			name = "ipv6 " + s.name
		}
		v, err := env.Sysctl(key)
		switch {
		case err != nil:
			bad = append(bad, fmt.Sprintf("%s: %v", name, err))
		case v != s.want:
			bad = append(bad, fmt.Sprintf("%s=%s, want %s (%s)", name, v, s.want, s.why))
			fixes = append(fixes, fmt.Sprintf("net.%s.conf.%s.%s=%s", fam, env.Interface, s.name, s.want))
		default:
			good = append(good, name+"="+v)
		}
	}
	// rp_filter is the larger of all's and the interface's; strict (1)
	// drops what arrives on an interface the route back does not use,
	// which asymmetric paths to the clients trip over. Only reported.
	rp := "?"
	if a, err := env.Sysctl("net/ipv4/conf/all/rp_filter"); err == nil {
		if i, err := env.Sysctl("net/ipv4/conf/" + env.Interface + "/rp_filter"); err == nil {
			rp = max(a, i)
		}
	}
	good = append(good, "rp_filter="+rp)
	if len(bad) > 0 {
		c.Verdict, c.Detail = VerdictFail, strings.Join(bad, "; ")
		c.Fix = "the agent sets them at start and after a link change; something reset them: sysctl -w " + strings.Join(fixes, " ")
		return c
	}
	c.Verdict, c.Detail = VerdictOK, strings.Join(good, ", ")
	return c
}

func checkClock(_ context.Context, env Env) Check {
	c := Check{Name: "clock"}
	synced, err := env.Clock()
	switch {
	case err != nil:
		c.Verdict, c.Detail = VerdictWarn, fmt.Sprintf("cannot read the clock's state: %v", err)
	case !synced:
		c.Verdict, c.Detail = VerdictWarn, "the kernel clock is not synchronised (adjtimex reports STA_UNSYNC)"
		c.Fix = "run chrony or systemd-timesyncd (timedatectl set-ntp true): membership never reads the clock, but logs, certificates and failover times compared across nodes do"
	default:
		c.Verdict, c.Detail = VerdictOK, "synchronised (adjtimex)"
	}
	return c
}

func checkHeartbeats(_ context.Context, env Env) Check {
	c := Check{Name: "heartbeats"}
	if len(env.Peers) == 0 {
		c.Verdict, c.Detail = VerdictSkip, "no peers registered"
		return c
	}
	var deaf, unheard, ok []string
	for _, p := range env.Peers {
		switch {
		case !p.Live:
			deaf = append(deaf, fmt.Sprintf("%s (from %s)", p.Name, p.HeartbeatAddr))
		case !p.Hears:
			unheard = append(unheard, fmt.Sprintf("%s (to %s)", p.Name, p.HeartbeatAddr))
		default:
			ok = append(ok, p.Name)
		}
	}
	var problems []string
	if len(deaf) > 0 {
		problems = append(problems, "no heartbeat arrives here from "+strings.Join(deaf, ", "))
	}
	if len(unheard) > 0 {
		problems = append(problems, "this node's heartbeats do not reach "+strings.Join(unheard, ", "))
	}
	if len(problems) > 0 {
		c.Verdict, c.Detail = VerdictFail, strings.Join(problems, "; ")
		c.Fix = "let UDP heartbeat_addr through between every pair of nodes, both ways (firewall, nftables, security group); check the peer runs (shoal query)"
		return c
	}
	c.Verdict, c.Detail = VerdictOK, "heartbeats both ways with "+strings.Join(ok, ", ")
	return c
}

func checkPorts(ctx context.Context, env Env) Check {
	c := Check{Name: "ports"}
	if len(env.Peers) == 0 {
		c.Verdict, c.Detail = VerdictSkip, "no peers registered"
		return c
	}
	type target struct{ peer, what, addr string }
	var ts []target
	for _, p := range env.Peers {
		ts = append(ts, target{p.Name, "raft", p.RaftAddr}, target{p.Name, "peer api", p.APIAddr})
	}
	errs := make([]error, len(ts))
	var wg sync.WaitGroup
	for i, t := range ts {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = env.Dial(ctx, t.addr)
		}()
	}
	wg.Wait()
	var bad []string
	for i, t := range ts {
		if errs[i] != nil {
			bad = append(bad, fmt.Sprintf("%s %s %s: %v", t.peer, t.what, t.addr, errs[i]))
		}
	}
	if len(bad) > 0 {
		c.Verdict, c.Detail = VerdictFail, "cannot connect to "+strings.Join(bad, "; ")
		c.Fix = "let TCP raft_addr and peer_addr through between every pair of nodes (firewall, nftables, security group)"
		return c
	}
	c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("TCP raft and peer API ports of %d peers reachable", len(env.Peers))
	return c
}

// hypervisorHints is what to look at when frames to the cluster MAC do
// not arrive.
const hypervisorHints = "on a virtual machine the hypervisor's switch must pass frames to a MAC the vNIC does not own: " +
	"Hyper-V: enable MAC address spoofing on the vNIC; VMware vSwitch: security policy promiscuous mode and forged transmits accept; " +
	"KVM/libvirt: trustGuestRxFilters='yes' on the interface (or a bridge without MAC filtering); " +
	"public clouds usually deliver no L2 multicast at all"

func checkClusterMAC(ctx context.Context, env Env) Check {
	c := Check{Name: "cluster_mac"}
	if env.Mode == rules.MACRouted {
		c.Verdict, c.Detail = VerdictSkip, "routed mode: no cluster MAC"
		return c
	}
	if len(env.Peers) == 0 {
		c.Verdict, c.Detail = VerdictSkip, "no peers registered"
		return c
	}
	mac := "the cluster MAC"
	if v := firstIPv4(env.VIPs); v.IsValid() {
		mac = env.Mode.ClusterMAC(v).String()
	}
	from := make([]error, len(env.Peers))
	to := make([]error, len(env.Peers))
	var wg sync.WaitGroup
	for i, p := range env.Peers {
		wg.Add(2)
		go func() { defer wg.Done(); from[i] = env.FramesFrom(ctx, p) }()
		go func() { defer wg.Done(); to[i] = env.FramesTo(ctx, p) }()
	}
	wg.Wait()
	var in, out, ok []string
	for i, p := range env.Peers {
		if from[i] != nil {
			in = append(in, fmt.Sprintf("%s (%v)", p.Name, from[i]))
		}
		if to[i] != nil {
			out = append(out, fmt.Sprintf("%s (%v)", p.Name, to[i]))
		}
		if from[i] == nil && to[i] == nil {
			ok = append(ok, p.Name)
		}
	}
	var problems []string
	if len(in) > 0 {
		problems = append(problems, fmt.Sprintf("frames to %s from %s do not reach this node", mac, strings.Join(in, ", ")))
	}
	if len(out) > 0 {
		problems = append(problems, fmt.Sprintf("this node's frames to %s do not reach %s", mac, strings.Join(out, ", ")))
	}
	if len(problems) > 0 {
		c.Verdict, c.Detail = VerdictFail, strings.Join(problems, "; ")
		c.Fix = "every node must receive every frame sent to the cluster MAC: "
		if env.Mode == rules.MACIGMP {
			c.Fix += "in igmp mode the switch must snoop IGMP, forward the group's MAC to the members, and see a querier (else the group ages out); "
		} else {
			c.Fix += "in multicast mode the switch must flood it (no filter or storm control on multicast for these ports); "
		}
		c.Fix += hypervisorHints
		return c
	}
	c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("frames to %s reach every peer and arrive from every peer (%s)", mac, strings.Join(ok, ", "))
	return c
}

// checkBGP, in routed mode, checks that every configured neighbour's
// session is established (and its BFD session up, where it runs).
func checkBGP(_ context.Context, env Env) Check {
	c := Check{Name: "bgp"}
	if env.Mode != rules.MACRouted {
		c.Verdict, c.Detail = VerdictSkip, "not in routed mode"
		return c
	}
	if env.BGP == nil {
		c.Verdict, c.Detail = VerdictFail, "the cluster is in routed mode and this node has no bgp section: it announces nothing"
		c.Fix = "add a bgp section (asn, neighbors) to this node's config (docs/ROUTED.md) and restart the agent"
		return c
	}
	var down, up []string
	for _, s := range env.BGP() {
		switch {
		case s.State != "established":
			down = append(down, fmt.Sprintf("%s: session %s%s", s.Neighbor, s.State, orLastError(s.LastError)))
		case s.BFD != "" && s.BFD != "up":
			down = append(down, fmt.Sprintf("%s: bfd %s", s.Neighbor, s.BFD))
		default:
			up = append(up, s.Neighbor)
		}
	}
	if len(down) > 0 {
		c.Verdict, c.Detail = VerdictFail, strings.Join(down, "; ")
		c.Fix = "check the router's config (the neighbour's address and AS, BFD), that TCP 179 and UDP 3784 pass between them, and the agent's log (docs/ROUTED.md)"
		return c
	}
	c.Verdict, c.Detail = VerdictOK, "sessions established with "+strings.Join(up, ", ")
	return c
}

// checkForwarding, in routed mode, checks that the data plane forwards
// what it does not own: on, with every live peer's next hop known and the
// SYN-ACKs' MSS clamped for the encapsulation.
func checkForwarding(_ context.Context, env Env) Check {
	c := Check{Name: "forwarding"}
	var f *Forwarding
	if env.Forwarding != nil {
		f = env.Forwarding()
	}
	switch {
	case env.Mode != rules.MACRouted:
		c.Verdict, c.Detail = VerdictSkip, "not in routed mode"
	case f == nil:
		c.Verdict, c.Detail = VerdictWarn, "no tables pushed yet"
	case !f.On:
		c.Verdict, c.Detail = VerdictWarn, "off: this node keeps every packet the routers send it (plain ECMP), so a change of the routers' next hops breaks the connections it moves"
		c.Fix = "remove bgp.no_forward from every node's config, and give the node an IPv4 heartbeat address (docs/ROUTED.md)"
	case f.ClampError != "":
		c.Verdict, c.Detail = VerdictFail, "SYN-ACKs leave without the MSS clamp ("+f.ClampError+"): full-size segments forwarded to this node are dropped as too big"
		c.Fix = "run a kernel with tcx (Linux 6.6 or later), or raise the MTU between the nodes by 20 bytes (docs/ROUTED.md, MTU)"
	case len(f.NoMAC) > 0:
		c.Verdict, c.Detail = VerdictFail, "no next hop's MAC for "+strings.Join(f.NoMAC, ", ")+": packets their buckets own are dropped here"
		c.Fix = "check that the peers are reachable out of the cluster interface (the neighbour table: ip neigh), directly or through one gateway"
	default:
		c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("forwarding from %s to %d peers, MSS clamped", f.Self, f.Peers)
	}
	return c
}

func orLastError(e string) string {
	if e == "" {
		return ""
	}
	return " (" + e + ")"
}

func checkGateway(_ context.Context, env Env) Check {
	c := Check{Name: "gateway"}
	if env.Mode == rules.MACRouted {
		c.Verdict, c.Detail = VerdictSkip, "routed mode: the routers learn the VIPs over BGP"
		return c
	}
	if len(env.VIPs) == 0 {
		c.Verdict, c.Detail = VerdictSkip, "no VIPs"
		return c
	}
	var entries []string
	for _, v := range env.VIPs {
		ip := "ip"
		if v.Is6() {
			ip = "ip -6"
		}
		entries = append(entries, fmt.Sprintf("%s neigh replace %s lladdr %s nud permanent dev <ifname>", ip, v, env.Mode.ClusterMAC(v)))
	}
	n := env.ARPAnswered()
	c.Fix = "this node cannot see the router's table. A router that follows RFC 1812 ignores ARP replies with a multicast MAC and needs a static entry: " +
		strings.Join(entries, "; ") + " (shoal ip2mac --mac-mode " + env.Mode.String() + " <vip> for other syntaxes); " +
		"on a Linux router or client, `shoal doctor --neighbor <vip>` compares its entry with the cluster MAC"
	if n == 0 {
		c.Verdict, c.Detail = VerdictWarn, "no ARP request or Neighbor Solicitation for the VIPs answered since the agent started: no client or router has asked (a static entry, a cached one, or no traffic yet)"
		return c
	}
	c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("%d ARP requests and Neighbor Solicitations for the VIPs answered with the cluster MAC since the agent started", n)
	return c
}

func firstIPv4(vips []netip.Addr) netip.Addr {
	for _, v := range vips {
		if v.Is4() {
			return v
		}
	}
	return netip.Addr{}
}

// Neighbour is one entry of a host's neighbour table.
type Neighbour struct {
	Interface string
	MAC       net.HardwareAddr
	State     string // PERMANENT, REACHABLE, STALE, ...
}

// judgeNeighbour checks a client's or router's neighbour entries for vip
// against its cluster MAC in mode.
func judgeNeighbour(vip netip.Addr, mode rules.MACMode, entries []Neighbour) Check {
	want := mode.ClusterMAC(vip)
	c := Check{Name: "neighbour"}
	if len(entries) == 0 {
		c.Verdict, c.Detail = VerdictWarn, fmt.Sprintf("no neighbour entry for %s here (it resolves when traffic first goes to it)", vip)
		c.Fix = fmt.Sprintf("send traffic to %s and run this again; if it never resolves, a static entry: ip neigh replace %s lladdr %s nud permanent dev <ifname>", vip, vip, want)
		return c
	}
	var bad, good []string
	var fixes []string
	for _, e := range entries {
		if len(e.MAC) == 0 {
			bad = append(bad, fmt.Sprintf("%s: unresolved (%s): nobody answered for it", e.Interface, e.State))
			fixes = append(fixes, fmt.Sprintf("ip neigh replace %s lladdr %s nud permanent dev %s", vip, want, e.Interface))
			continue
		}
		if !strings.EqualFold(e.MAC.String(), want.String()) {
			bad = append(bad, fmt.Sprintf("%s: %s (%s), want the cluster MAC %s", e.Interface, e.MAC, e.State, want))
			fixes = append(fixes, fmt.Sprintf("ip neigh replace %s lladdr %s nud permanent dev %s", vip, want, e.Interface))
			continue
		}
		good = append(good, fmt.Sprintf("%s: %s (%s)", e.Interface, e.MAC, e.State))
	}
	if len(bad) > 0 {
		c.Verdict, c.Detail = VerdictFail, fmt.Sprintf("%s resolves wrongly: %s", vip, strings.Join(bad, "; "))
		c.Fix = strings.Join(fixes, "; ") + " (or delete a wrong dynamic entry: ip neigh del " + vip.String() + " dev <ifname>; check --mac-mode is the cluster's)"
		return c
	}
	c.Verdict, c.Detail = VerdictOK, fmt.Sprintf("%s resolves to the cluster MAC: %s", vip, strings.Join(good, "; "))
	return c
}
