package lab

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// routedServer is Apache where Debian's is installed (CI installs it), the
// built-in server elsewhere.
func routedServer(t *testing.T) Server {
	if _, err := os.Stat("/usr/sbin/apache2"); err != nil {
		t.Log("no /usr/sbin/apache2: the routed lab runs the built-in server")
		return ServerBuiltin
	}
	return ServerApache
}

func needFRR(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("vtysh"); err != nil {
		t.Skip("routed mode's lab router needs FRR: apt-get install frr")
	}
}

// TestRoutedAnnouncements: in the routed lab, FRR's route to the VIP has
// exactly the eligible nodes as next hops, whatever makes a node
// ineligible (drainstop, stop, suspend, its agent exiting) and whatever
// restarts (the node's agent, FRR's bgpd); traffic through the router
// reaches every node.
func TestRoutedAnnouncements(t *testing.T) {
	needRoot(t)
	needFRR(t)
	if testing.Short() {
		t.Skip("builds shoal and a routed lab; skipped with -short")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	l := upLab(ctx, t, Options{Nodes: 3, Binary: bin, MACMode: "routed", Server: routedServer(t), Family: FamilyDual})
	// hops waits until the router's routes to both VIPs have exactly the
	// nodes keep names as next hops (the IPv4 VIP through their IPv4
	// addresses, the IPv6 one through their IPv6 addresses).
	hops := func(keep func(i int) bool, why string) {
		t.Helper()
		start := time.Now()
		for _, vip := range l.VIPs() {
			var want []netip.Addr
			for i, n := range l.Nodes {
				if keep(i) {
					want = append(want, map[bool]netip.Addr{false: n.Addr, true: n.Addr6}[vip.Is6()])
				}
			}
			slices.SortFunc(want, netip.Addr.Compare)
			if err := Poll(ctx, 15*time.Second, 20*time.Millisecond, func() error {
				got, err := l.NextHops(ctx, vip)
				if err != nil {
					return err
				}
				if !slices.Equal(got, want) {
					return fmt.Errorf("next hops for %s: %v, want %v", vip, got, want)
				}
				return nil
			}); err != nil {
				t.Fatalf("%s: %v", why, err)
			}
		}
		t.Logf("%s: next hops right for %v after %v", why, l.VIPs(), time.Since(start).Round(time.Millisecond))
	}
	all := func(int) bool { return true }
	without := func(j int) func(int) bool { return func(i int) bool { return i != j } }
	hops(all, "up")
	// Each node shows its session (BGP established, BFD up) and what it
	// announces in `shoal query`.
	for _, n := range l.Nodes {
		out, err := l.CLI(ctx, n.Name, "query", "--json")
		if err != nil {
			t.Fatal(err)
		}
		var q struct {
			BGP *struct {
				Sessions []struct {
					Neighbor, State, BFD string
				}
				Announced map[string]time.Time
			}
		}
		if err := json.Unmarshal(out, &q); err != nil {
			t.Fatal(err)
		}
		if q.BGP == nil || len(q.BGP.Sessions) != 1 || q.BGP.Sessions[0].State != "established" || q.BGP.Sessions[0].BFD != "up" || len(q.BGP.Announced) != 2 {
			t.Errorf("%s: query's bgp %+v, want one session established with BFD up, and both VIPs announced", n.Name, q.BGP)
		}
	}

	for _, vip := range l.VIPs() {
		res, err := l.Load(ctx, LoadArgs{URL: URL(vip), Duration: 2 * time.Second, Concurrency: 8}, nil)
		if err != nil {
			t.Fatal(err)
		}
		if res.Failures != 0 || len(res.ByNode) != len(l.Nodes) {
			t.Errorf("%s through the router: %d requests, %d failed (%v, %+v), served by %v; want none failed, every node serving", vip, res.Requests, res.Failures, res.Errors, res.FailureList, res.ByNode)
		}
		t.Logf("%s through the router: %d requests, served by %v", vip, res.Requests, res.ByNode)
	}

	// Each way out of the eligible set withdraws node3; start (after
	// resume, which leaves a node stopped, as NLB's) announces it again.
	for _, step := range [][]string{
		{"drainstop", "--timeout", "1s"}, {"start"},
		{"stop"}, {"start"},
		{"suspend"}, {"resume"}, {"start"},
	} {
		if _, err := l.CLI(ctx, "node3", step...); err != nil {
			t.Fatalf("%v: %v", step, err)
		}
		if step[0] == "start" {
			hops(all, fmt.Sprint(step))
		} else {
			hops(without(2), fmt.Sprint(step))
		}
	}

	// The agent exits (SIGTERM): its routes go with it; started again,
	// they come back.
	if err := l.Signal("node2", "agent", syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	hops(without(1), "node2's agent stopped")
	if _, err := l.Start("node2", "agent", "agent", "--config", l.Nodes[1].Config); err != nil {
		t.Fatal(err)
	}
	hops(all, "node2's agent started again")

	// FRR's bgpd restarts: the sessions come back and so do the routes.
	if err := l.Signal("router", "frr-bgpd", syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	if err := Poll(ctx, 10*time.Second, 50*time.Millisecond, func() error {
		out, err := l.Vtysh(ctx, "show bgp summary")
		if err == nil && !strings.Contains(string(out), "not running") {
			return fmt.Errorf("bgpd still answers")
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if err := l.restartDaemon(ctx, l.Router, "bgpd"); err != nil {
		t.Fatal(err)
	}
	hops(all, "bgpd restarted")
}

// TestRoutedRun: `shoal lab run --mac-mode routed --pulls 2`: every pull,
// under traffic, is a next hop the router drops within a second (BFD at
// 100 ms x 3), and no request fails outside the pulls.
func TestRoutedRun(t *testing.T) {
	needRoot(t)
	needFRR(t)
	if testing.Short() {
		t.Skip("builds shoal and a routed lab; skipped with -short")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, RunOptions{Options: Options{Nodes: 3, Binary: bin, MACMode: "routed", Base: t.TempDir()}, Pulls: 2, Duration: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "routed" || len(rep.Failovers) != 2 || len(rep.Recoveries) != 2 {
		t.Fatalf("report: mode %q, %d withdrawals, %d recoveries; want routed, 2 and 2", rep.Mode, len(rep.Failovers), len(rep.Recoveries))
	}
	for i, w := range rep.Failovers {
		if w >= 1000 {
			t.Errorf("pull %d: the router dropped the victim after %.0f ms, want under 1 s", i+1, w)
		}
	}
	if rep.Before.Failures != 0 || rep.After.Failures != 0 || rep.Before.Successes == 0 || rep.After.Successes == 0 {
		t.Errorf("outside the pulls: before %d of %d failed, after %d of %d; want none", rep.Before.Failures, rep.Before.Requests, rep.After.Failures, rep.After.Requests)
	}
	if len(rep.Before.ByNode) != 3 || len(rep.After.ByNode) != 3 {
		t.Errorf("served by %v before and %v after; want every node", rep.Before.ByNode, rep.After.ByNode)
	}
	t.Logf("withdrawals %v ms, pull to the last failed request %v ms; during the first pull %d of %d failed (ECMP rehashes the survivors' flows too)",
		rep.Failovers, rep.Recoveries, rep.During.Failures, rep.During.Requests)
}

// TestRoutedNeighborFlap: a second router whose sessions flap 10 times
// while traffic goes through the first changes nothing for the first (its
// kernel route to the VIP keeps every node), fails no request, and costs
// no heartbeat: no node declares a peer dead.
func TestRoutedNeighborFlap(t *testing.T) {
	needRoot(t)
	needFRR(t)
	if testing.Short() {
		t.Skip("builds shoal and a routed lab; skipped with -short")
	}
	bin := buildShoal(t)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	l := upLab(ctx, t, Options{Nodes: 3, Binary: bin, MACMode: "routed", Routers: 2})
	all := l.NodeAddrs()
	established := func() error {
		out, err := l.VtyshOn(ctx, l.Router2, "show bgp summary json")
		if err != nil {
			return err
		}
		var sum struct {
			IPv4 struct {
				Peers map[string]struct {
					State string `json:"state"`
				} `json:"peers"`
			} `json:"ipv4Unicast"`
		}
		if err := json.Unmarshal(out, &sum); err != nil {
			return err
		}
		up := 0
		for _, p := range sum.IPv4.Peers {
			if p.State == "Established" {
				up++
			}
		}
		if up != len(l.Nodes) {
			return fmt.Errorf("router2 has %d of %d sessions established", up, len(l.Nodes))
		}
		return nil
	}
	if err := Poll(ctx, 30*time.Second, 50*time.Millisecond, established); err != nil {
		t.Fatal(err)
	}
	deaths := func() (n uint64) {
		t.Helper()
		for _, node := range l.Nodes {
			out, err := l.CLI(ctx, node.Name, "status", "--json")
			if err != nil {
				t.Fatal(err)
			}
			var st struct {
				PeerDeaths uint64 `json:"peer_deaths"`
			}
			if err := json.Unmarshal(out, &st); err != nil {
				t.Fatal(err)
			}
			n += st.PeerDeaths
		}
		return n
	}
	before := deaths()

	// The first router's route (FRR's view of the kernel's), polled
	// through the flaps.
	watch, stopWatch := context.WithCancel(ctx)
	var seen [][]netip.Addr
	var seenMu sync.Mutex
	go func() {
		for watch.Err() == nil {
			hops, err := l.NextHops(watch, l.VIP)
			if err == nil && !slices.Equal(hops, all) {
				seenMu.Lock()
				seen = append(seen, hops)
				seenMu.Unlock()
			}
			time.Sleep(20 * time.Millisecond)
		}
	}()

	type result struct {
		res load.Result
		err error
	}
	done := make(chan result, 1)
	started := make(chan struct{})
	go func() {
		r, err := l.Load(ctx, LoadArgs{URL: URL(l.VIP), Duration: 90 * time.Second, Concurrency: 4, OnStart: func() { close(started) }}, nil)
		done <- result{r, err}
	}()
	<-started
	flaps := 0
	for flaps < 10 && ctx.Err() == nil {
		select {
		case r := <-done:
			done <- r
			t.Fatalf("the load ended after %d flaps", flaps)
		default:
		}
		if _, err := l.VtyshOn(ctx, l.Router2, "clear bgp *"); err != nil {
			t.Fatal(err)
		}
		if err := Poll(ctx, 5*time.Second, 20*time.Millisecond, func() error {
			if established() == nil {
				return fmt.Errorf("not reset yet")
			}
			return nil
		}); err != nil {
			t.Logf("flap %d: the reset was not seen (it may have been quicker than the poll): %v", flaps+1, err)
		}
		if err := Poll(ctx, 20*time.Second, 50*time.Millisecond, established); err != nil {
			t.Fatalf("flap %d: %v", flaps+1, err)
		}
		flaps++
	}
	r := <-done
	stopWatch()
	if r.err != nil {
		t.Fatal(r.err)
	}
	if r.res.Failures != 0 || len(r.res.ByNode) != len(l.Nodes) {
		t.Errorf("through router1 during %d flaps of router2: %d of %d requests failed, served by %v; want none failed, every node serving", flaps, r.res.Failures, r.res.Requests, r.res.ByNode)
	}
	seenMu.Lock()
	if len(seen) > 0 {
		t.Errorf("router1's next hops changed during the flaps: %v", seen)
	}
	seenMu.Unlock()
	if after := deaths(); after != before {
		t.Errorf("peers declared dead during the flaps: %d, before %d", after, before)
	}
	t.Logf("%d flaps of router2: %d requests through router1, %d failed, served by %v", flaps, r.res.Requests, r.res.Failures, r.res.ByNode)
}
