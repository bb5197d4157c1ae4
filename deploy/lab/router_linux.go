package lab

import (
	"bytes"
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"text/template"
	"time"
)

// The routed lab: a router namespace between the client's subnet and the
// nodes' LAN runs FRR (zebra, bfdd, bgpd, Debian's), peers with every node
// over eBGP with BFD, and spreads the VIP's flows over the nodes that
// announce it with the kernel's ECMP and an L4 hash.

//go:embed frr.conf.tmpl
var frrTemplate string

// frrDaemons are the FRR daemons the router runs, in start order.
var frrDaemons = []string{"zebra", "bfdd", "bgpd"}

// frrDir is where FRR keeps a lab router's sockets (vtysh -N finds them
// there), and where the lab puts its config: the daemons run as the frr
// user, which cannot read the lab's own directory.
func (s *State) frrDir(r *Host) string { return filepath.Join("/var/run/frr", s.pathspace(r)) }

// routerNetwork puts the router on the switch and the client behind it,
// with forwarding, an L4 multipath hash and default routes through it.
func (l *Lab) routerNetwork(ctx context.Context) error {
	r := l.Router
	if err := l.addNamespace(ctx, r.Namespace); err != nil {
		return err
	}
	uplink := "eth1"
	steps := [][]string{
		{"-n", l.Switch, "link", "add", r.BridgePort, "type", "veth", "peer", "name", Interface, "netns", r.Namespace},
		{"-n", l.Switch, "link", "set", r.BridgePort, "master", Bridge},
		{"-n", l.Switch, "link", "set", r.BridgePort, "up"},
		{"-n", r.Namespace, "link", "set", Interface, "up"},
		{"-n", r.Namespace, "addr", "add", r.Addr.String() + "/24", "dev", Interface},
		{"-n", r.Namespace, "link", "add", uplink, "type", "veth", "peer", "name", Interface, "netns", l.Client.Namespace},
		{"-n", r.Namespace, "link", "set", uplink, "up"},
		{"-n", r.Namespace, "addr", "add", l.Uplink.String() + "/24", "dev", uplink},
		{"-n", l.Client.Namespace, "link", "set", Interface, "up"},
		{"-n", l.Client.Namespace, "addr", "add", l.Client.Addr.String() + "/24", "dev", Interface},
		{"-n", l.Client.Namespace, "route", "add", "default", "via", l.Uplink.String()},
	}
	for _, n := range l.Nodes {
		steps = append(steps, []string{"-n", n.Namespace, "route", "add", "default", "via", r.Addr.String()})
	}
	if r.Addr6.IsValid() {
		steps = append(steps,
			[]string{"-n", r.Namespace, "addr", "add", r.Addr6.String() + "/64", "dev", Interface, "nodad"},
			[]string{"-n", r.Namespace, "addr", "add", l.Uplink6.String() + "/64", "dev", uplink, "nodad"},
			[]string{"-n", l.Client.Namespace, "addr", "add", l.Client.Addr6.String() + "/64", "dev", Interface, "nodad"},
			[]string{"-n", l.Client.Namespace, "-6", "route", "add", "default", "via", l.Uplink6.String()})
		for _, n := range l.Nodes {
			steps = append(steps, []string{"-n", n.Namespace, "-6", "route", "add", "default", "via", r.Addr6.String()})
		}
	}
	for _, s := range steps {
		if _, err := ip(ctx, s...); err != nil {
			return err
		}
	}
	sysctls := map[string]string{"net/ipv4/ip_forward": "1", "net/ipv4/fib_multipath_hash_policy": "1"}
	if r.Addr6.IsValid() {
		sysctls["net/ipv6/conf/all/forwarding"] = "1"
		sysctls["net/ipv6/fib_multipath_hash_policy"] = "1"
	}
	for key, value := range sysctls {
		if err := sysctlIn(ctx, r.Namespace, key, value); err != nil {
			return err
		}
	}
	if r2 := l.Router2; r2 != nil {
		if err := l.addNamespace(ctx, r2.Namespace); err != nil {
			return err
		}
		for _, s := range [][]string{
			{"-n", l.Switch, "link", "add", r2.BridgePort, "type", "veth", "peer", "name", Interface, "netns", r2.Namespace},
			{"-n", l.Switch, "link", "set", r2.BridgePort, "master", Bridge},
			{"-n", l.Switch, "link", "set", r2.BridgePort, "up"},
			{"-n", r2.Namespace, "link", "set", Interface, "up"},
			{"-n", r2.Namespace, "addr", "add", r2.Addr.String() + "/24", "dev", Interface},
		} {
			if _, err := ip(ctx, s...); err != nil {
				return err
			}
		}
	}
	return nil
}

// frrConfig renders router r's FRR configuration.
func (l *Lab) frrConfig(r *Host) ([]byte, error) {
	t, err := template.New("frr").Parse(frrTemplate)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	err = t.Execute(&b, map[string]any{
		"Name": r.Namespace, "Dir": l.frrDir(r), "ASN": RouterASN, "RouterID": r.Addr,
		"MaxPaths":    64,
		"BFDInterval": BFDInterval.Milliseconds(), "BFDMultiplier": 3, "Nodes": l.NodeAddrs(), "IPv6": l.Family.HasIPv6(),
	})
	return b.Bytes(), err
}

// startRouter writes FRR's config and starts its daemons in router r's
// namespace, in the foreground as the lab's processes (Down stops them).
func (l *Lab) startRouter(ctx context.Context, r *Host) error {
	for _, d := range frrDaemons {
		if _, err := os.Stat(filepath.Join("/usr/lib/frr", d)); err != nil {
			return fmt.Errorf("lab: routed mode needs FRR (apt-get install frr): %w", err)
		}
	}
	frr, err := user.Lookup("frr")
	if err != nil {
		return fmt.Errorf("lab: routed mode needs FRR's user (apt-get install frr): %w", err)
	}
	uid, _ := strconv.Atoi(frr.Uid)
	gid, _ := strconv.Atoi(frr.Gid)
	dir := l.frrDir(r)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("lab: %w", err)
	}
	conf, err := l.frrConfig(r)
	if err != nil {
		return fmt.Errorf("lab: frr config: %w", err)
	}
	path := filepath.Join(dir, "frr.conf")
	if err := os.WriteFile(path, conf, 0o644); err != nil {
		return fmt.Errorf("lab: frr config: %w", err)
	}
	for _, p := range []string{dir, path} {
		if err := os.Chown(p, uid, gid); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
	}
	for _, d := range frrDaemons {
		if err := l.restartDaemon(ctx, r, d); err != nil {
			return err
		}
		// Each daemon connects to zebra; vtysh finds them by their sockets.
		if err := Poll(ctx, 10*time.Second, 20*time.Millisecond, func() error {
			_, err := os.Stat(filepath.Join(dir, d+".vty"))
			return err
		}); err != nil {
			return fmt.Errorf("lab: frr %s did not start: %w", d, err)
		}
	}
	return nil
}

// restartDaemon starts an FRR daemon of router r (again, after it died or
// was killed).
func (l *Lab) restartDaemon(ctx context.Context, r *Host, d string) error {
	dir := l.frrDir(r)
	args := []string{"-N", l.pathspace(r), "-f", filepath.Join(dir, "frr.conf"), "-i", filepath.Join(dir, d+".pid"), "--log", "stdout"}
	_, err := l.StartProgram(r.Name, "frr-"+d, filepath.Join("/usr/lib/frr", d), args...)
	return err
}

// Vtysh runs an FRR command on the lab's router and returns its output.
func (l *Lab) Vtysh(ctx context.Context, command string) ([]byte, error) {
	return l.VtyshOn(ctx, l.Router, command)
}

// VtyshOn runs an FRR command on router r.
func (l *Lab) VtyshOn(ctx context.Context, r *Host, command string) ([]byte, error) {
	if r == nil {
		return nil, errors.New("lab: no such router (not a routed lab?)")
	}
	cmd := exec.CommandContext(ctx, "vtysh", "-N", l.pathspace(r), "-c", command)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		return nil, fmt.Errorf("lab: vtysh -c %q: %w: %s", command, err, strings.TrimSpace(errOut.String()))
	}
	return out.Bytes(), nil
}

// SetNextHop takes node addr out of the router's next hops (down) or puts
// it back, by shutting its BGP session down or bringing it up: the
// router's ECMP then hashes the flows over the other next hops (a rehash,
// as a router's link or line card going away does).
func (l *Lab) SetNextHop(ctx context.Context, addr netip.Addr, down bool) error {
	if l.Router == nil {
		return errors.New("lab: no router (not a routed lab?)")
	}
	cmd := "neighbor " + addr.String() + " shutdown"
	if !down {
		cmd = "no " + cmd
	}
	c := exec.CommandContext(ctx, "vtysh", "-N", l.pathspace(l.Router), "-c", "configure terminal",
		"-c", fmt.Sprintf("router bgp %d", RouterASN), "-c", cmd)
	if out, err := c.CombinedOutput(); err != nil {
		return fmt.Errorf("lab: next hop %s down=%v: %w: %s", addr, down, err, bytes.TrimSpace(out))
	}
	return nil
}

// NextHops returns the next hops of the router's route to vip in the
// kernel (FRR's view of what zebra installed), sorted; none when it has
// no route.
func (l *Lab) NextHops(ctx context.Context, vip netip.Addr) ([]netip.Addr, error) {
	show := "show ip route "
	if vip.Is6() {
		show = "show ipv6 route "
	}
	out, err := l.Vtysh(ctx, show+netip.PrefixFrom(vip, vip.BitLen()).String()+" json")
	if err != nil {
		return nil, err
	}
	return parseNextHops(out, vip)
}

// parseNextHops reads `show ip route PREFIX json`: the active next hops of
// the installed route to vip.
func parseNextHops(b []byte, vip netip.Addr) ([]netip.Addr, error) {
	var routes map[string][]struct {
		Installed bool `json:"installed"`
		Nexthops  []struct {
			IP     string `json:"ip"`
			Active bool   `json:"active"`
			FIB    bool   `json:"fib"`
		} `json:"nexthops"`
	}
	if err := json.Unmarshal(b, &routes); err != nil {
		return nil, fmt.Errorf("lab: show ip route: %w", err)
	}
	var hops []netip.Addr
	for _, r := range routes[netip.PrefixFrom(vip, vip.BitLen()).String()] {
		if !r.Installed {
			continue
		}
		for _, h := range r.Nexthops {
			if a, err := netip.ParseAddr(h.IP); err == nil && h.Active && h.FIB {
				hops = append(hops, a)
			}
		}
	}
	slices.SortFunc(hops, netip.Addr.Compare)
	return hops, nil
}

// warmNeighbors has the router reach every node's IPv6 address once (one
// HTTP request each, from its namespace). A Linux router's IPv6 ECMP
// skips a next hop whose neighbour entry is not resolved yet, so the first
// packets of a flow, before every node's entry is, can go to two nodes: a
// SYN to one and its ACK to another, which resets it. Real routers meet
// this on first contact too; the lab starts from resolved entries.
func (l *Lab) warmNeighbors(ctx context.Context) error {
	for _, n := range l.Nodes {
		if !n.Addr6.IsValid() {
			continue
		}
		url := "http://" + netip.AddrPortFrom(n.Addr6, HTTPPort).String() + "/"
		cmd := exec.CommandContext(ctx, "ip", "netns", "exec", l.Router.Namespace, l.Binary, "lab", "load", "--url", url, "--requests", "1", "--concurrency", "1")
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("lab: reach %s from the router: %w: %s", n.Addr6, err, strings.TrimSpace(string(out)))
		}
	}
	return nil
}

// removeFRRDir removes the router's FRR directory (its sockets, pid files
// and config), once its daemons have stopped.
func (s *State) removeFRRDir() error {
	if !idPattern.MatchString(s.ID) {
		return nil
	}
	for _, r := range s.routers() {
		if err := os.RemoveAll(s.frrDir(r)); err != nil {
			return fmt.Errorf("lab: %w", err)
		}
	}
	return nil
}

// NodeAddrs returns the nodes' addresses, sorted: the next hops a router
// should have for the VIP while every node is eligible.
func (s *State) NodeAddrs() []netip.Addr { return s.NodeAddrsFor(s.VIP) }

// NodeAddrsFor returns the nodes' addresses of vip's family, sorted.
func (s *State) NodeAddrsFor(vip netip.Addr) []netip.Addr {
	var out []netip.Addr
	for _, n := range s.Nodes {
		if vip.Is6() {
			out = append(out, n.Addr6)
		} else {
			out = append(out, n.Addr)
		}
	}
	slices.SortFunc(out, netip.Addr.Compare)
	return out
}
