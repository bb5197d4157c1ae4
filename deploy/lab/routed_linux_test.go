package lab

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
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
	l := upLab(ctx, t, Options{Nodes: 3, Binary: bin, MACMode: "routed", Server: routedServer(t)})
	all := l.NodeAddrs()
	hops := func(want []netip.Addr, why string) {
		t.Helper()
		start := time.Now()
		if err := Poll(ctx, 15*time.Second, 20*time.Millisecond, func() error {
			got, err := l.NextHops(ctx, l.VIP)
			if err != nil {
				return err
			}
			if !slices.Equal(got, want) {
				return fmt.Errorf("next hops %v, want %v", got, want)
			}
			return nil
		}); err != nil {
			t.Fatalf("%s: %v", why, err)
		}
		t.Logf("%s: next hops %v after %v", why, want, time.Since(start).Round(time.Millisecond))
	}
	without := func(i int) []netip.Addr {
		return slices.DeleteFunc(slices.Clone(all), func(a netip.Addr) bool { return a == l.Nodes[i].Addr })
	}
	hops(all, "up")

	res, err := l.Load(ctx, LoadArgs{URL: URL(l.VIP), Duration: 2 * time.Second, Concurrency: 8}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if res.Failures != 0 || len(res.ByNode) != len(l.Nodes) {
		t.Errorf("through the router: %d requests, %d failed, served by %v; want none failed, every node serving", res.Requests, res.Failures, res.ByNode)
	}
	t.Logf("through the router: %d requests, served by %v", res.Requests, res.ByNode)

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
	if err := l.restartDaemon(ctx, "bgpd"); err != nil {
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
