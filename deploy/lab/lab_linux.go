package lab

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/big"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Up builds a lab and, unless o.NoAgents, starts every agent and HTTP server
// and waits until the cluster has converged with the default port rule in
// place. On any failure, or when ctx ends, it removes what it made.
func Up(ctx context.Context, o Options) (l *Lab, err error) {
	if o.Nodes == 0 {
		o.Nodes = 3
	}
	server, err := ParseServer(string(o.Server))
	if err != nil {
		return nil, err
	}
	family, err := ParseFamily(string(o.Family))
	if err != nil {
		return nil, err
	}
	switch o.MACMode {
	case "", "multicast":
	case "igmp":
	case "routed":
		if family == Family6 {
			return nil, fmt.Errorf("lab: routed mode: the nodes peer with the router over IPv4: --family 4 or dual (an IPv6 VIP beside the IPv4 one)")
		}
	default:
		return nil, fmt.Errorf("lab: mac mode %q: want multicast, igmp or routed", o.MACMode)
	}
	if o.Servers < 0 || o.Servers > o.Nodes {
		return nil, fmt.Errorf("lab: --servers %d: want 1..%d (the nodes that run a server), or 0 for every node", o.Servers, o.Nodes)
	}
	if o.Servers > 0 && o.MACMode == "routed" {
		return nil, fmt.Errorf("lab: --servers: a routed lab runs a server on every node (the router spreads connections over every node it has a route to)")
	}
	if err := machineFits(o); err != nil {
		return nil, err
	}
	if o.Base == "" {
		o.Base = DefaultBase
	}
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	if o.ReadyTimeout == 0 {
		o.ReadyTimeout = readyTimeout(o.Nodes)
	}
	if o.Binary == "" {
		if o.Binary, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("lab: find the shoal binary: %w", err)
		}
	}
	if err := os.MkdirAll(o.Base, 0o700); err != nil {
		return nil, fmt.Errorf("lab: %w", err)
	}
	st, err := allocate(o.Base, o.Nodes, family)
	if err != nil {
		return nil, err
	}
	st.Binary = o.Binary
	st.Server = server
	st.Servers = o.Servers
	if o.MACMode == "igmp" {
		st.MACMode = o.MACMode
		st.Bystander = &Host{Name: "bystander", Namespace: st.ID + "-bystander", BridgePort: "p-bystander"}
	}
	if o.MACMode == "routed" {
		st.makeRouted(o.Routers)
		st.NoForward = o.NoForward
	}
	st.KeepLogs = o.KeepLogs
	st.Created = time.Now()
	l = &Lab{State: *st, log: o.Log.With("lab", st.ID), ctl: Ctl{Binary: o.Binary}, waits: map[int]chan struct{}{}}
	defer func() {
		if err != nil && o.KeepOnFailure {
			l.log.Warn("lab up failed; left in place for its logs", "dir", l.Dir, "err", err)
			err = fmt.Errorf("%w (lab %s left in place: shoal lab down %s)", err, l.ID, l.ID)
			l = nil
			return
		}
		if err != nil {
			l.log.Warn("lab up failed, removing it", "err", err)
			if derr := l.Down(context.Background()); derr != nil {
				err = errors.Join(err, derr)
			}
			l = nil
		}
	}()
	if err := os.MkdirAll(l.Dir, 0o700); err != nil {
		return l, fmt.Errorf("lab: %w", err)
	}
	l.BPF = filepath.Join(l.Dir, "bpf")
	if err := l.Save(); err != nil {
		return l, err
	}
	if err := mountBPF(l.BPF); err != nil {
		l.log.Warn("no bpf filesystem for the agents' restart pins; `shoal restart` falls back to a graceful stop", "err", err)
		l.BPF = ""
	}
	if err := l.Save(); err != nil {
		return l, err
	}
	if err := l.network(ctx); err != nil {
		return l, err
	}
	for _, r := range l.routers() {
		if err := l.startRouter(ctx, r); err != nil {
			return l, err
		}
	}
	if o.NoAgents {
		return l, nil
	}
	if err := l.startCluster(ctx, o.Period, o.ParallelStart, o.ReadyTimeout); err != nil {
		return l, err
	}
	if err := l.waitReady(ctx, o.ReadyTimeout); err != nil {
		return l, err
	}
	return l, nil
}

// readyTimeout is the default bound on a wait for n agents to converge:
// a cluster converges in about a round trip per view, but a bigger one
// shares the machine's cores among more agents.
func readyTimeout(n int) time.Duration {
	return max(30*time.Second, time.Duration(n)*time.Second)
}

// allocate picks an unused lab id and subnet. The state file is the claim:
// it is created exclusively.
func allocate(base string, nodes int, family Family) (*State, error) {
	used := map[int]bool{}
	ids, _ := List(base)
	for _, id := range ids {
		if s, err := LoadState(base, id); err == nil {
			used[s.Subnet] = true
		}
	}
	for range 100 {
		id, err := newID()
		if err != nil {
			return nil, err
		}
		if slices.Contains(ids, id) {
			continue
		}
		n, err := rand.Int(rand.Reader, big.NewInt(254))
		if err != nil {
			return nil, err
		}
		subnet := int(n.Int64()) + 1
		if used[subnet] {
			continue
		}
		st, err := LayoutFamily(base, id, subnet, nodes, family)
		if err != nil {
			return nil, err
		}
		f, err := os.OpenFile(StatePath(base, id), os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if errors.Is(err, os.ErrExist) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lab: claim %s: %w", id, err)
		}
		f.Close()
		return st, nil
	}
	return nil, errors.New("lab: no free lab id; remove old labs with `shoal lab down`")
}

// ip runs iproute2.
func ip(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "ip", args...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("ip %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// testHookNamespace, if set, runs before each namespace is made; a test
// uses it to fail Up halfway.
var testHookNamespace func(ns string) error

// addNamespace records ns in the state file, then creates it, so a crash
// in between leaves nothing Down does not know of.
func (l *Lab) addNamespace(ctx context.Context, ns string) error {
	if testHookNamespace != nil {
		if err := testHookNamespace(ns); err != nil {
			return err
		}
	}
	l.mu.Lock()
	l.Namespaces = append(l.Namespaces, ns)
	err := l.Save()
	l.mu.Unlock()
	if err != nil {
		return err
	}
	if err := l.createNamespace(ctx, ns); err != nil {
		// Not made by us (it may be another lab's that drew the same id):
		// forget it so Down does not delete it.
		l.mu.Lock()
		l.Namespaces = slices.DeleteFunc(l.Namespaces, func(n string) bool { return n == ns })
		serr := l.Save()
		l.mu.Unlock()
		return errors.Join(err, serr)
	}
	if l.Family.HasIPv6() {
		// No duplicate address detection in the lab's namespaces: every
		// IPv6 address, link-local ones too, is usable at once.
		if err := sysctlIn(ctx, ns, "net/ipv6/conf/all/accept_dad", "0"); err != nil {
			return err
		}
		if err := sysctlIn(ctx, ns, "net/ipv6/conf/default/accept_dad", "0"); err != nil {
			return err
		}
	}
	_, err = ip(ctx, "-n", ns, "link", "set", "lo", "up")
	return err
}

// childEhash is the size of the TCP established-socket hash table each
// node and client namespace gets. Without one of its own, a namespace
// shares the host's (262,144 buckets on this kind of machine), and every
// socket scan of an agent (sock_diag, at each view change and every 100 ms
// while buckets drain) walks all of it: with 32 agents on one machine the
// scans were 15% of the CPU of a view-change storm. A real node has one
// agent per host and table; the lab's agents no longer share theirs.
const childEhash = "1024"

// createNamespace makes ns. Hosts' namespaces are made from the switch's
// namespace, whose net.ipv4.tcp_child_ehash_entries gives them a TCP hash
// table of their own (Linux 6.1 and later; elsewhere, or for the switch
// itself, `ip netns add` as before).
func (l *Lab) createNamespace(ctx context.Context, ns string) error {
	if ns == l.Switch || !l.childEhash {
		_, err := ip(ctx, "netns", "add", ns)
		return err
	}
	errc := make(chan error, 1)
	go func() {
		// The thread enters the switch's namespace, makes ns there and
		// leaves: it is not handed back to the runtime meanwhile.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		sw, err := netns.GetFromName(l.Switch)
		if err != nil {
			errc <- err
			return
		}
		defer sw.Close()
		if err := netns.Set(sw); err != nil {
			errc <- err
			return
		}
		made, err := netns.NewNamed(ns)
		if err == nil {
			made.Close()
		}
		if serr := netns.Set(orig); serr != nil {
			// The thread is in the wrong namespace: it must not run
			// anything else; leaving it locked ends it with the goroutine.
			runtime.LockOSThread()
			errc <- errors.Join(err, serr)
			return
		}
		errc <- err
	}()
	if err := <-errc; err != nil {
		return fmt.Errorf("lab: namespace %s: %w", ns, err)
	}
	return nil
}

// sysctlIn sets /proc/sys/<key> in namespace ns.
func sysctlIn(ctx context.Context, ns, key, value string) error {
	cmd := exec.CommandContext(ctx, "ip", "netns", "exec", ns, "sh", "-c", `echo "$1" > "/proc/sys/$2"`, "sh", value, key)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("lab: set %s=%s in %s: %w: %s", key, value, ns, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// network builds the namespaces, the bridge and the veth pairs.
func (l *Lab) network(ctx context.Context) error {
	if err := l.addNamespace(ctx, l.Switch); err != nil {
		return err
	}
	l.childEhash = sysctlIn(ctx, l.Switch, "net/ipv4/tcp_child_ehash_entries", childEhash) == nil
	// Multicast mode: snooping off, the bridge floods frames to the cluster
	// MAC to every port, whatever it learned of multicast groups. Igmp
	// mode: snooping and a querier on (see snoopingBridge).
	bridge := []string{"-n", l.Switch, "link", "add", Bridge, "type", "bridge", "mcast_snooping", "0"}
	if l.MACMode == "igmp" {
		bridge = append(bridge[:len(bridge)-2], snoopingBridge...)
	}
	if _, err := ip(ctx, bridge...); err != nil {
		return err
	}
	if _, err := ip(ctx, "-n", l.Switch, "link", "set", Bridge, "up"); err != nil {
		return err
	}
	// Where br_netfilter is loaded (Docker loads it), every frame the
	// bridge forwards also runs the iptables, ip6tables and arptables
	// hooks, in every namespace: nothing here filters there (the lab's
	// own rules are nftables bridge tables), so the switch skips them.
	if err := exec.CommandContext(ctx, "ip", "netns", "exec", l.Switch, "sh", "-c",
		"for f in /proc/sys/net/bridge/bridge-nf-call-*; do [ -w \"$f\" ] && echo 0 > \"$f\"; done; true").Run(); err != nil {
		return fmt.Errorf("lab: the switch's bridge netfilter hooks: %w", err)
	}
	hosts := append([]Host{l.Client}, l.Nodes...)
	if l.Bystander != nil {
		hosts = append(hosts, *l.Bystander)
	}
	for _, h := range hosts {
		if err := l.addNamespace(ctx, h.Namespace); err != nil {
			return err
		}
		if h.BridgePort == "" {
			continue // the routed lab's client: behind the router
		}
		steps := [][]string{
			// Both ends are born in namespaces the lab owns: nothing ever
			// appears in the root namespace.
			{"-n", l.Switch, "link", "add", h.BridgePort, "type", "veth", "peer", "name", Interface, "netns", h.Namespace},
			{"-n", l.Switch, "link", "set", h.BridgePort, "master", Bridge},
			{"-n", l.Switch, "link", "set", h.BridgePort, "up"},
			{"-n", h.Namespace, "link", "set", Interface, "up"},
		}
		if h.Addr.IsValid() { // the bystander has none: it sends nothing
			steps = append(steps, []string{"-n", h.Namespace, "addr", "add", h.Addr.String() + "/24", "dev", Interface})
		}
		if l.MACMode == "igmp" {
			steps = append(steps, []string{"-n", l.Switch, "link", "set", h.BridgePort, "type", "bridge_slave", "mcast_router", "2"})
		}
		if h.Addr6.IsValid() {
			steps = append(steps, []string{"-n", h.Namespace, "addr", "add", h.Addr6.String() + "/64", "dev", Interface, "nodad"})
		}
		for _, s := range steps {
			if _, err := ip(ctx, s...); err != nil {
				return err
			}
		}
	}
	if err := l.staticNeighbors(ctx, hosts); err != nil {
		return err
	}
	if l.Router != nil {
		return l.routerNetwork(ctx)
	}
	return nil
}

// staticNeighbors gives every host on the LAN a permanent neighbour entry
// for every other one. The kernel's neighbour table is one for all
// namespaces, and its dynamic entries stop at gc_thresh3 (1,024 by
// default) for the whole machine: in a 32-node lab every node resolving
// every other made about 1,056, and a node that could not add one for the
// client dropped its SYN-ACK (perf's skb:kfree_skb said NEIGH_CREATEFAIL;
// 7-18% of new connections failed). Permanent entries do not count
// against it. A real node has a kernel of its own; only the lab shares one.
// The VIPs stay resolved by ARP and NDP, as the lab is there to test.
func (l *Lab) staticNeighbors(ctx context.Context, hosts []Host) error {
	type nb struct {
		h   Host
		mac string
	}
	var lan []nb
	for _, h := range hosts {
		if h.BridgePort == "" || !h.Addr.IsValid() {
			continue
		}
		out, err := ip(ctx, "-n", h.Namespace, "-br", "link", "show", "dev", Interface)
		if err != nil {
			return err
		}
		f := strings.Fields(out)
		if len(f) < 3 {
			return fmt.Errorf("lab: no mac for %s in %q", h.Name, out)
		}
		lan = append(lan, nb{h, f[2]})
	}
	for _, self := range lan {
		var batch strings.Builder
		for _, o := range lan {
			if o.h.Name == self.h.Name {
				continue
			}
			fmt.Fprintf(&batch, "neigh replace %s lladdr %s dev %s nud permanent\n", o.h.Addr, o.mac, Interface)
			if o.h.Addr6.IsValid() && self.h.Addr6.IsValid() {
				fmt.Fprintf(&batch, "neigh replace %s lladdr %s dev %s nud permanent\n", o.h.Addr6, o.mac, Interface)
			}
		}
		cmd := exec.CommandContext(ctx, "ip", "-n", self.h.Namespace, "-batch", "-")
		cmd.Stdin = strings.NewReader(batch.String())
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: neighbours of %s: %w: %s", self.h.Name, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// startCluster writes the key and the configs and starts every agent and
// HTTP server: one node after the other, each once the previous ones have
// converged, unless parallel.
func (l *Lab) startCluster(ctx context.Context, period time.Duration, parallel bool, timeout time.Duration) error {
	var key [32]byte
	if _, err := rand.Read(key[:]); err != nil {
		return err
	}
	if err := os.WriteFile(l.KeyFile, []byte(hex.EncodeToString(key[:])+"\n"), 0o600); err != nil {
		return fmt.Errorf("lab: cluster key: %w", err)
	}
	for i, n := range l.Nodes {
		if err := os.MkdirAll(n.DataDir, 0o700); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
		b, err := l.AgentConfig(i, period).Marshal()
		if err != nil {
			return err
		}
		if err := os.WriteFile(n.Config, b, 0o600); err != nil {
			return fmt.Errorf("lab: agent config: %w", err)
		}
	}
	for i, n := range l.Nodes {
		if _, err := l.Start(n.Name, "agent", "agent", "--config", n.Config); err != nil {
			return err
		}
		if i < len(l.Served()) {
			if _, err := l.StartServer(ctx, n.Name); err != nil {
				return err
			}
		}
		if parallel || i == len(l.Nodes)-1 {
			continue // waitReady waits for the whole cluster
		}
		// One node at a time, as an operator adds them: each joins a cluster
		// that has converged.
		if err := l.waitConverged(ctx, l.Nodes[:i+1], timeout); err != nil {
			return err
		}
	}
	return nil
}

// pollEvery is how often the lab asks every agent for its status while it
// waits: 50 ms, and 10 ms more per node past five, so that the asking (an
// HTTP request to every agent) stays a small part of a big lab's work
// instead of hundreds of requests a second on the cores the agents share.
func (l *Lab) pollEvery() time.Duration {
	return 50*time.Millisecond + time.Duration(max(0, len(l.Nodes)-5))*10*time.Millisecond
}

// waitConverged waits until nodes have converged on a view of them all.
func (l *Lab) waitConverged(ctx context.Context, nodes []Host, timeout time.Duration) error {
	if err := Poll(ctx, timeout, l.pollEvery(), func() error {
		if err := l.agentsAlive(); err != nil {
			return err
		}
		st, err := l.Statuses(ctx, nodes)
		if err != nil {
			return err
		}
		return Ready(st, len(nodes))
	}); err != nil {
		last := nodes[len(nodes)-1]
		return fmt.Errorf("lab: %d nodes did not converge: %w; %s's agent log ends: %s%s", len(nodes), err,
			last.Name, strings.ReplaceAll(lastLines(tail(filepath.Join(l.Dir, last.Name+".agent.log"), 4096), 3), "\n", " | "), overloaded())
	}
	l.log.Info("converged", "nodes", len(nodes))
	return nil
}

// Start runs the shoal binary with args in host's namespace, as a process of
// its own session (a Ctrl-C on the terminal reaches only the lab), logging
// to <dir>/<host>.<role>.log, and records it for Down.
func (l *Lab) Start(host, role string, args ...string) (Proc, error) {
	return l.StartProgram(host, role, l.Binary, args...)
}

// StartProgram is Start for another program: path runs with args in
// host's namespace.
func (l *Lab) StartProgram(host, role, path string, args ...string) (Proc, error) {
	h, ok := l.HostByName(host)
	if !ok {
		return Proc{}, fmt.Errorf("lab: no host %q", host)
	}
	logPath := filepath.Join(l.Dir, host+"."+role+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return Proc{}, fmt.Errorf("lab: %w", err)
	}
	defer f.Close()
	cmd := exec.Command("ip", append([]string{"netns", "exec", h.Namespace, path}, args...)...)
	cmd.Stdout, cmd.Stderr = f, f
	if role == "agent" && l.BPF != "" {
		cmd.Env = append(os.Environ(), "SHOAL_PIN_DIR="+filepath.Join(l.BPF, host))
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return Proc{}, fmt.Errorf("lab: start %s on %s: %w", role, host, err)
	}
	p := Proc{PID: cmd.Process.Pid, Role: role, Host: host, Log: logPath}
	_, p.Start, _ = procStat(p.PID)
	done := make(chan struct{})
	go func() {
		cmd.Wait()
		close(done)
	}()
	l.mu.Lock()
	l.waits[p.PID] = done
	l.Procs = append(l.Procs, p)
	err = l.Save()
	l.mu.Unlock()
	l.log.Debug("started", "host", host, "role", role, "pid", p.PID)
	return p, err
}

// Exited returns a channel closed when a process this Lab started exits,
// or nil for processes it did not start.
func (l *Lab) Exited(p Proc) <-chan struct{} {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.waits[p.PID]
}

// Statuses returns every node's status, in node order.
func (l *Lab) Statuses(ctx context.Context, nodes []Host) ([]NodeStatus, error) {
	out := make([]NodeStatus, len(nodes))
	errs := make([]error, len(nodes))
	var wg sync.WaitGroup
	for i, n := range nodes {
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i], errs[i] = l.ctl.Status(ctx, n.Socket)
		}()
	}
	wg.Wait()
	return out, errors.Join(errs...)
}

// WaitSettled waits until no node drains a bucket or takes one dirty
// (Settled): the steady state, in which every packet is taken by its
// bucket's owner.
func (l *Lab) WaitSettled(ctx context.Context, timeout time.Duration) error {
	return Poll(ctx, timeout, l.pollEvery(), func() error {
		st, err := l.Statuses(ctx, l.Nodes)
		if err != nil {
			return err
		}
		return Settled(st)
	})
}

// Poll calls check every interval until it returns nil, the deadline passes
// or ctx ends; the error then carries check's last answer.
func Poll(ctx context.Context, timeout, interval time.Duration, check func() error) error {
	deadline := time.Now().Add(timeout)
	for {
		err := check()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("after %v: %w", timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		case <-time.After(interval):
		}
	}
}

// waitReady waits for convergence, adds the default rule of each VIP
// through node1 and waits for every node to apply them and cover their
// buckets.
func (l *Lab) waitReady(ctx context.Context, timeout time.Duration) error {
	if err := l.waitConverged(ctx, l.Nodes, timeout); err != nil {
		return err
	}
	if l.MACMode == "routed" {
		if _, err := l.ctl.Run(ctx, l.Nodes[0].Socket, "settings", "set", "--mac-mode", "routed"); err != nil {
			return fmt.Errorf("lab: routed mode: %w", err)
		}
	}
	if l.MACMode == "igmp" {
		if _, err := l.ctl.Run(ctx, l.Nodes[0].Socket, "settings", "set", "--mac-mode", "igmp"); err != nil {
			return fmt.Errorf("lab: igmp mode: %w", err)
		}
		if err := Poll(ctx, timeout, l.pollEvery(), func() error { return l.SnoopByMAC(ctx) }); err != nil {
			return fmt.Errorf("lab: igmp mode: %w", err)
		}
	}
	for _, vip := range l.VIPs() {
		if err := l.ctl.AddRule(ctx, l.Nodes[0].Socket, vip.String(), HTTPPort); err != nil {
			return fmt.Errorf("lab: add the default rule for %s: %w", vip, err)
		}
		// The nodes without a server take nothing: one write, one view
		// change, for all of them.
		if idle := l.Nodes[len(l.Served()):]; len(idle) > 0 {
			names := make([]string, len(idle))
			for i, n := range idle {
				names[i] = n.Name
			}
			if _, err := l.ctl.Run(ctx, l.Nodes[0].Socket, "weight", "set", vip.String(), strings.Join(names, ","), "0"); err != nil {
				return fmt.Errorf("lab: the nodes without a server: weight 0 on %s: %w", vip, err)
			}
		}
	}
	first, err := l.ctl.Status(ctx, l.Nodes[0].Socket)
	if err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	if err := Poll(ctx, timeout, l.pollEvery(), func() error {
		st, err := l.Statuses(ctx, l.Nodes)
		if err != nil {
			return err
		}
		if err := RulesAt(st, first.RulesIndex); err != nil {
			return err
		}
		if err := Ready(st, len(l.Nodes)); err != nil {
			return err
		}
		if len(RuleIDs(st)) < 1+len(l.VIPs()) { // the default host's rule and ours
			return fmt.Errorf("rules accepted %v, want the port rules too", RuleIDs(st))
		}
		if l.Router != nil {
			return nil // every node keeps what the router sends it: next hops below
		}
		return CoverFull(st, RuleIDs(st))
	}); err != nil {
		return fmt.Errorf("lab: the default rule did not reach every node: %w%s", err, overloaded())
	}
	if l.Router != nil {
		// Stable for 2 s: a node's first BGP session can flap once as its
		// BFD session comes up (GoBGP resets BGP on the router's first
		// down or admin-down), and is back after the 3 s connect retry.
		var since time.Time
		if err := Poll(ctx, timeout, l.pollEvery(), func() error {
			for _, vip := range l.VIPs() {
				want := l.NodeAddrsFor(vip)
				hops, err := l.NextHops(ctx, vip)
				if err == nil && !slices.Equal(hops, want) {
					err = fmt.Errorf("the router's next hops for %s are %v, want every node %v", vip, hops, want)
				}
				if err != nil {
					since = time.Time{}
					return err
				}
			}
			if since.IsZero() {
				since = time.Now()
			}
			if time.Since(since) < 2*time.Second {
				return fmt.Errorf("the router's routes are right, for %v so far", time.Since(since).Round(time.Millisecond))
			}
			return nil
		}); err != nil {
			return fmt.Errorf("lab: routed mode: %w", err)
		}
		if err := l.warmNeighbors(ctx); err != nil {
			return err
		}
	}
	l.log.Info("lab ready", "vips", l.VIPs())
	return nil
}

// agentsAlive returns an error naming the first agent that exited, with the
// tail of its log.
func (l *Lab) agentsAlive() error {
	l.mu.Lock()
	procs := slices.Clone(l.Procs)
	l.mu.Unlock()
	for _, p := range procs {
		if !alive(p) {
			return fmt.Errorf("%s %s exited: %s", p.Host, p.Role, tail(p.Log, 800))
		}
	}
	return nil
}

// overloaded reads the machine's load for loadNote.
func overloaded() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return ""
	}
	load, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return ""
	}
	return loadNote(load, runtime.NumCPU())
}

// loadNote says, when the load is past four runnable threads a CPU, that
// the agents are starved of CPU: heartbeats then go out late, and peers
// take a node that is only slow for dead (a view change is every agent's
// work at once, so one brings on the next). "" otherwise.
func loadNote(load float64, cpus int) string {
	if load <= 4*float64(cpus) {
		return ""
	}
	return fmt.Sprintf("; the machine's load is %.0f on %d CPUs: the agents are starved of CPU (heartbeats late, peers taken for dead); try fewer nodes", load, cpus)
}

// tail returns the last n bytes of a file.
func tail(path string, n int64) string {
	f, err := os.Open(path)
	if err != nil {
		return err.Error()
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > n {
		f.Seek(-n, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return strings.TrimSpace(string(b))
}

// Down stops the lab's processes (SIGTERM, SIGKILL after 5 s), deletes its
// namespaces (with their links) and its files. It is safe to call twice and
// on a lab that was only half built.
func (l *Lab) Down(ctx context.Context) error {
	l.mu.Lock()
	procs := slices.Clone(l.Procs)
	l.mu.Unlock()
	var errs []error
	for _, p := range stopProcs(procs, 5*time.Second) {
		l.log.Warn("process did not stop within 5 s of SIGTERM, killed", "host", p.Host, "role", p.Role, "pid", p.PID)
	}
	for _, p := range procs {
		if ch := l.Exited(p); ch != nil {
			select {
			case <-ch:
			case <-time.After(2 * time.Second):
			}
		}
	}
	if l.KeepLogs != "" {
		if err := keepLogs(procs, l.KeepLogs); err != nil {
			errs = append(errs, err)
		}
	}
	nss := slices.Clone(l.Namespaces)
	// Every namespace is recorded before it is made, so the state file is
	// the whole truth; only a lab whose state file is lost is found by its
	// prefix.
	if out, err := ip(ctx, "netns", "list"); err == nil && l.orphan {
		for _, ns := range parseNetnsList(out) {
			if id, ok := labOfNamespace(ns); ok && id == l.ID && !slices.Contains(nss, ns) {
				nss = append(nss, ns)
			}
		}
	}
	for _, ns := range slices.Backward(nss) {
		if err := deleteNamespace(ctx, ns); err != nil {
			errs = append(errs, err)
		}
	}
	// Pins still there (an agent stopped for a restart) go with the lab's
	// bpf filesystem. A lab found by its namespaces has lost its state
	// file, so its mount is looked for where Up puts it.
	bpf := l.BPF
	if bpf == "" && l.Dir != "" {
		bpf = filepath.Join(l.Dir, "bpf")
	}
	if bpf != "" {
		if err := unix.Unmount(bpf, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("lab: unmount %s: %w", bpf, err))
		}
	}
	if err := l.removeFRRDir(); err != nil {
		errs = append(errs, err)
	}
	if len(errs) == 0 {
		if l.WebRoot != "" {
			if err := os.RemoveAll(l.WebRoot); err != nil {
				errs = append(errs, fmt.Errorf("lab: %w", err))
			}
		}
		if err := os.RemoveAll(l.Dir); err != nil {
			errs = append(errs, fmt.Errorf("lab: %w", err))
		}
		if err := os.Remove(StatePath(l.Base, l.ID)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, fmt.Errorf("lab: %w", err))
		}
	}
	l.mu.Lock()
	l.Procs = nil
	l.mu.Unlock()
	return errors.Join(errs...)
}

// keepLogs copies the processes' logs into dir, named as in the lab.
func keepLogs(procs []Proc, dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("lab: keep logs: %w", err)
	}
	done := map[string]bool{}
	for _, p := range procs {
		if p.Log == "" || done[p.Log] {
			continue
		}
		done[p.Log] = true
		b, err := os.ReadFile(p.Log)
		if err != nil {
			return fmt.Errorf("lab: keep logs: %w", err)
		}
		if err := os.WriteFile(filepath.Join(dir, filepath.Base(p.Log)), b, 0o600); err != nil {
			return fmt.Errorf("lab: keep logs: %w", err)
		}
	}
	return nil
}

// deleteNamespace kills whatever still runs in ns (it is the lab's own
// namespace, so only the lab's processes) and deletes it.
func deleteNamespace(ctx context.Context, ns string) error {
	if _, err := os.Stat(filepath.Join("/run/netns", ns)); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if out, err := ip(ctx, "netns", "pids", ns); err == nil {
		for _, f := range strings.Fields(out) {
			var pid int
			if _, err := fmt.Sscan(f, &pid); err == nil && pid > 1 {
				syscall.Kill(pid, syscall.SIGKILL)
			}
		}
	}
	_, err := ip(ctx, "netns", "del", ns)
	return err
}

// List returns the ids of the labs under base and of leftover namespaces
// that carry a lab's prefix, sorted.
func List(base string) ([]string, error) {
	set := map[string]bool{}
	files, _ := filepath.Glob(filepath.Join(base, "shl*.json"))
	for _, f := range files {
		id := strings.TrimSuffix(filepath.Base(f), ".json")
		if idPattern.MatchString(id) {
			set[id] = true
		}
	}
	out, err := ip(context.Background(), "netns", "list")
	if err != nil {
		return nil, err
	}
	for _, ns := range parseNetnsList(out) {
		if id, ok := labOfNamespace(ns); ok {
			set[id] = true
		}
	}
	ids := make([]string, 0, len(set))
	for id := range set {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids, nil
}

// Open returns the lab id from its state file; a lab whose state file is
// gone (a crash before the first save) is rebuilt from its namespaces, so
// Down can still remove it.
func Open(base, id string, log *slog.Logger) (*Lab, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if !idPattern.MatchString(id) {
		return nil, fmt.Errorf("%w: %q", ErrBadID, id)
	}
	st, err := LoadState(base, id)
	if err != nil {
		// A crash right after the id was claimed leaves an empty state file.
		log.Warn("no usable state file, removing the lab by its namespaces", "lab", id, "err", err)
		st = &State{ID: id, Base: base, Dir: filepath.Join(base, id)}
	}
	return &Lab{State: *st, orphan: err != nil, log: log.With("lab", id), ctl: Ctl{Binary: st.Binary}, waits: map[int]chan struct{}{}}, nil
}

// DownAll removes every lab under base and every leftover lab namespace.
func DownAll(ctx context.Context, base string, log *slog.Logger) ([]string, error) {
	ids, err := List(base)
	if err != nil {
		return nil, err
	}
	var errs []error
	for _, id := range ids {
		l, err := Open(base, id, log)
		if err == nil {
			err = l.Down(ctx)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("lab %s: %w", id, err))
		}
	}
	return ids, errors.Join(errs...)
}

// CLI runs `shoal --socket <node's socket> args...` (the lab's binary, in
// the caller's namespace) and returns its stdout.
func (l *Lab) CLI(ctx context.Context, node string, args ...string) ([]byte, error) {
	h, ok := l.HostByName(node)
	if !ok || h.Socket == "" {
		return nil, fmt.Errorf("lab: no node %q", node)
	}
	return l.ctl.Run(ctx, h.Socket, args...)
}

// NodeStatus returns one node's status.
func (l *Lab) NodeStatus(ctx context.Context, node string) (NodeStatus, error) {
	h, ok := l.HostByName(node)
	if !ok || h.Socket == "" {
		return NodeStatus{}, fmt.Errorf("lab: no node %q", node)
	}
	return l.ctl.Status(ctx, h.Socket)
}

// Newest returns the lab's newest process of role on host, e.g. the agent
// a restart started.
func (l *Lab) Newest(host, role string) (Proc, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, p := range slices.Backward(l.Procs) {
		if p.Host == host && p.Role == role {
			return p, true
		}
	}
	return Proc{}, false
}

// Signal sends sig to the lab's live process of role ("agent", "serve") on
// host, e.g. SIGKILL to an agent for a kill drill.
func (l *Lab) Signal(host, role string, sig syscall.Signal) error {
	l.mu.Lock()
	procs := slices.Clone(l.Procs)
	l.mu.Unlock()
	for _, p := range procs {
		if p.Host == host && p.Role == role && alive(p) {
			return syscall.Kill(p.PID, sig)
		}
	}
	return fmt.Errorf("lab: no running %s on %s", role, host)
}

// mountBPF mounts a bpf filesystem at dir.
func mountBPF(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := unix.Mount("bpf", dir, "bpf", 0, "mode=0700"); err != nil {
		return fmt.Errorf("mount bpf at %s: %w", dir, err)
	}
	return nil
}
