package agent_test

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/shoalnet/shoal/deploy/lab"
)

// raftLab is a 10-node lab for the Raft tests: which agents run, and the
// writes the tests made.
type raftLab struct {
	t    *testing.T
	l    *lab.Lab
	down map[string]bool
	port int // of the last rule written
}

func (r *raftLab) live() []string {
	var out []string
	for _, n := range r.l.Nodes {
		if !r.down[n.Name] {
			out = append(out, n.Name)
		}
	}
	return out
}

func (r *raftLab) kill(name string) {
	r.t.Helper()
	stopAgent(r.t, r.l, name, syscall.SIGKILL)
	r.down[name] = true
}

func (r *raftLab) start(name string) {
	r.t.Helper()
	startAgent(r.t, r.l, name)
	delete(r.down, name)
}

// roles returns the Raft role of every node as the leader's configuration
// says (leader, voter, non-voter), and the leader.
func (r *raftLab) roles(ctx context.Context) (map[string]string, string, error) {
	var errs []string
	for _, name := range r.live() {
		st, err := client(r.t, r.l, name).Status(ctx)
		if err != nil || st.Leader == "" || r.down[st.Leader] {
			errs = append(errs, fmt.Sprintf("%s: leader %q, %v", name, st.Leader, err))
			continue
		}
		q, err := client(r.t, r.l, st.Leader).Query(ctx)
		if err != nil {
			return nil, "", err
		}
		roles := map[string]string{}
		for _, n := range q.Nodes {
			roles[n.Name] = n.Raft
		}
		return roles, st.Leader, nil
	}
	return nil, "", fmt.Errorf("no live leader: %s", strings.Join(errs, "; "))
}

// voters returns the voters (the leader first).
func voters(roles map[string]string, leader string) []string {
	out := []string{leader}
	for name, role := range roles {
		if role == "voter" {
			out = append(out, name)
		}
	}
	slices.Sort(out[1:])
	return out
}

// waitFiveLive waits until five voters run, the leader among them.
func (r *raftLab) waitFiveLive(what string, timeout time.Duration) []string {
	r.t.Helper()
	var vs []string
	poll(r.t, timeout, what, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		defer cancel()
		roles, leader, err := r.roles(ctx)
		if err != nil {
			return err
		}
		vs = voters(roles, leader)
		for _, v := range vs {
			if r.down[v] {
				return fmt.Errorf("voters %v include %s, which is down", vs, v)
			}
		}
		if len(vs) != 5 {
			return fmt.Errorf("voters %v, want 5", vs)
		}
		return nil
	})
	return vs
}

// write adds a rule through a live node, retrying for up to within, and
// returns how long it took and the rules index it was applied at.
func (r *raftLab) write(via string, within time.Duration) (time.Duration, uint64, error) {
	r.port++
	start := time.Now()
	var last error
	for time.Since(start) < within {
		ctx, cancel := context.WithTimeout(context.Background(), 4*time.Second)
		var info control.RuleInfo
		err := client(r.t, r.l, via).Do(ctx, "POST", "/v1/rules", control.RuleRequest{VIP: r.l.VIP.String(), Ports: fmt.Sprint(r.port), Proto: "tcp", Mode: "multiple", Affinity: "none"}, &info)
		if err == nil {
			st, serr := client(r.t, r.l, via).Status(ctx)
			cancel()
			if serr != nil {
				return time.Since(start), 0, serr
			}
			return time.Since(start), st.RulesIndex, nil
		}
		cancel()
		last = err
		time.Sleep(200 * time.Millisecond)
	}
	return time.Since(start), 0, fmt.Errorf("not written within %v: %w", within, last)
}

// inForce waits until every live node's tables hold rules index idx and
// returns how long that took.
func (r *raftLab) inForce(idx uint64, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	for {
		var behind []string
		for _, name := range r.live() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := client(r.t, r.l, name).Status(ctx)
			cancel()
			if err != nil || st.TablesIndex < idx {
				behind = append(behind, name)
			}
		}
		if len(behind) == 0 {
			return time.Since(start), nil
		}
		if time.Since(start) > timeout {
			return time.Since(start), fmt.Errorf("%v not at rules index %d", behind, idx)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// writeEverywhere writes a rule through via within 10 s, and checks that
// every live node's tables hold it within a second of the write.
func (r *raftLab) writeEverywhere(what, via string) {
	r.t.Helper()
	took, idx, err := r.write(via, 10*time.Second)
	if err != nil {
		r.t.Fatalf("%s: write through %s: %v", what, via, err)
	}
	spread, err := r.inForce(idx, 5*time.Second)
	r.t.Logf("%s: rule on port %d written through %s in %v (index %d), in every live node's tables %v later", what, r.port, via, took.Round(time.Millisecond), idx, spread.Round(time.Millisecond))
	if err != nil || spread > time.Second {
		r.t.Errorf("%s: the rule reached every live node's tables after %v (%v), want within 1 s", what, spread.Round(time.Millisecond), err)
	}
}

// TestE2ERaftTenNodes: a 10-node lab keeps its rules writable as voters
// die, come back, reboot in a row and are cut off, with
// hashicorp/raft-autopilot and the voter policy (rules.VoterPolicy) keeping
// five voters.
func TestE2ERaftTenNodes(t *testing.T) {
	l := upLabWith(t, lab.Options{Nodes: 10})
	r := &raftLab{t: t, l: l, down: map[string]bool{}, port: 9000}
	r.waitFiveLive("five voters at start", 30*time.Second)

	t.Run("two voters killed at once", func(t *testing.T) {
		r.t = t
		vs := r.waitFiveLive("five live voters", 30*time.Second)
		killed := vs[:2] // the leader and another voter
		for _, v := range killed {
			r.kill(v)
		}
		r.writeEverywhere(fmt.Sprintf("%v killed", killed), r.live()[0])
		// Replaced: five live voters again, the killed ones demoted.
		r.waitFiveLive("the dead voters replaced", 40*time.Second)
		r.writeEverywhere("after the replacement", r.live()[0])
		// Back as non-voters, and the leader stays.
		_, leaderBefore, err := r.roles(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range killed {
			r.start(v)
		}
		poll(t, 30*time.Second, "the killed voters back", func() error { return covered(l, r.live()...) })
		time.Sleep(3 * time.Second) // a few autopilot rounds
		roles, leaderAfter, err := r.roles(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		for _, v := range killed {
			if roles[v] != "non-voter" {
				t.Errorf("%s came back as %q, want a non-voter", v, roles[v])
			}
		}
		if leaderAfter != leaderBefore {
			t.Errorf("the leader changed from %s to %s as the killed voters came back", leaderBefore, leaderAfter)
		}
	})

	t.Run("the three oldest killed in turn", func(t *testing.T) {
		r.t = t
		for i, name := range []string{"node1", "node2", "node3"} {
			if i > 0 {
				time.Sleep(30 * time.Second)
			}
			r.kill(name)
			r.writeEverywhere(name+" killed", r.live()[0])
		}
		for _, name := range []string{"node1", "node2", "node3"} {
			r.start(name)
		}
		poll(t, 30*time.Second, "the three back", func() error { return covered(l, r.live()...) })
		r.waitFiveLive("five live voters", 40*time.Second)
	})

	// hashicorp/consul#8118: voters restarted one after another, each
	// back before the next goes and faster than the stabilisation time,
	// lost Consul its consensus for good.
	t.Run("voters rebooted in a row", func(t *testing.T) {
		r.t = t
		vs := r.waitFiveLive("five live voters", 40*time.Second)
		for _, v := range vs {
			r.kill(v)
			time.Sleep(time.Second)
			r.start(v)
			poll(t, 20*time.Second, v+" back", func() error { return covered(l, r.live()...) })
			time.Sleep(2 * time.Second) // below the 10 s stabilisation time
		}
		r.writeEverywhere("after the reboots", r.live()[0])
		r.waitFiveLive("five live voters after the reboots", 60*time.Second)
	})

	t.Run("voters split 3/2 for a minute", func(t *testing.T) {
		r.t = t
		vs := r.waitFiveLive("five live voters", 40*time.Second)
		var nonvoters []string
		for _, n := range r.live() {
			if !slices.Contains(vs, n) {
				nonvoters = append(nonvoters, n)
			}
		}
		major := append(slices.Clone(vs[:3]), nonvoters[:3]...)
		minor := append(slices.Clone(vs[3:]), nonvoters[3:]...)
		heal := partition(t, l, major, minor)
		cut := time.Now()
		var acked []int
		for time.Since(cut) < time.Minute {
			if _, _, err := r.write(major[0], 10*time.Second); err != nil {
				t.Errorf("majority side: write: %v", err)
			} else {
				acked = append(acked, r.port)
			}
			time.Sleep(5 * time.Second)
		}
		r.port++
		ctx, cancel := context.WithTimeout(context.Background(), 6*time.Second)
		err := client(t, l, minor[0]).Do(ctx, "POST", "/v1/rules", control.RuleRequest{VIP: l.VIP.String(), Ports: fmt.Sprint(r.port), Proto: "tcp", Mode: "multiple", Affinity: "none"}, nil)
		cancel()
		if err == nil {
			t.Errorf("minority side: a write was acknowledged")
		}
		heal()
		t.Logf("partitioned %v | %v for %v; %d writes acknowledged on the majority side", major, minor, time.Since(cut).Round(time.Second), len(acked))
		poll(t, 60*time.Second, "one cluster again", func() error { return covered(l, r.live()...) })
		r.waitFiveLive("five live voters after the heal", 60*time.Second)
		// The same rules everywhere, every acknowledged write among them.
		poll(t, 20*time.Second, "the same rules on every node", func() error {
			var first []string
			for i, name := range r.live() {
				q, err := client(t, l, name).Query(context.Background())
				if err != nil {
					return err
				}
				var ports []string
				for _, rule := range q.Rules {
					ports = append(ports, rule.Ports)
				}
				slices.Sort(ports)
				if i == 0 {
					first = ports
					for _, p := range acked {
						if !slices.Contains(ports, fmt.Sprint(p)) {
							return fmt.Errorf("%s: the rule on port %d, acknowledged during the partition, is missing", name, p)
						}
					}
				} else if !slices.Equal(ports, first) {
					return fmt.Errorf("%s has rules %v, %s has %v", name, ports, r.live()[0], first)
				}
			}
			return nil
		})
		r.writeEverywhere("after the heal", minor[0])
	})
}

// partition cuts two groups of nodes off from each other (every packet
// between them, both ways, in each node's input hook) until heal.
func partition(t *testing.T, l *lab.Lab, a, b []string) (heal func()) {
	t.Helper()
	if _, err := exec.LookPath("nft"); err != nil {
		t.Skip("needs nftables' nft (apt-get install nftables; .ci/run installs it)")
	}
	addrs := func(names []string) string {
		var s []string
		for _, n := range names {
			s = append(s, node(t, l, n).Addr.String())
		}
		return strings.Join(s, ", ")
	}
	const table = "shoal_test_partition"
	nft := func(name, script string) error {
		cmd := exec.Command("ip", "netns", "exec", node(t, l, name).Namespace, "nft", "-f", "-")
		cmd.Stdin = strings.NewReader(script)
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("nft in %s: %v: %s", name, err, out)
		}
		return nil
	}
	var done []string
	heal = func() {
		for _, n := range done {
			if err := nft(n, "delete table inet "+table+"\n"); err != nil {
				t.Error(err)
			}
		}
		done = nil
	}
	t.Cleanup(heal)
	for _, side := range []struct{ names, others []string }{{a, b}, {b, a}} {
		for _, n := range side.names {
			if err := nft(n, fmt.Sprintf("table inet %s {\n chain input {\n  type filter hook input priority 0; policy accept;\n  ip saddr { %s } drop\n }\n}\n", table, addrs(side.others))); err != nil {
				t.Fatal(err)
			}
			done = append(done, n)
		}
	}
	return heal
}
