package rules

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/hashicorp/raft"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/peer"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

// testTiming is fast enough for tests on loopback.
var testTiming = Timing{
	HeartbeatTimeout:   300 * time.Millisecond,
	ElectionTimeout:    300 * time.Millisecond,
	LeaderLeaseTimeout: 100 * time.Millisecond,
	CommitTimeout:      5 * time.Millisecond,
}

// testNode is one agent's rules store with its peer API on loopback. The
// addresses survive restarts, as a real node's do.
type testNode struct {
	t        testing.TB
	name     string
	dir      string
	raftAddr string
	apiAddr  string
	key      []byte
	certs    *peer.Certs // nil: derived from key
	timing   Timing
	noSync   bool
	lastID   filter.NodeID // the id the node had when it stopped
	store    *Store
	srv      *http.Server
	live     atomic.Pointer[Store] // store while it runs, for the fleet's health
}

// testVoters replaces dead voters within seconds.
var testVoters = VoterPolicy{DeadAfter: time.Second, Stable: time.Second, Contact: 500 * time.Millisecond, Interval: 200 * time.Millisecond}

// fleet stands in for the heartbeats of each test's nodes: a member is
// live, and caught up as far as its store says, while its test node runs.
var fleet = struct {
	sync.Mutex
	nodes map[testing.TB]map[string]*testNode
}{nodes: map[testing.TB]map[string]*testNode{}}

func enlist(n *testNode) {
	fleet.Lock()
	defer fleet.Unlock()
	if fleet.nodes[n.t] == nil {
		fleet.nodes[n.t] = map[string]*testNode{}
		n.t.Cleanup(func() {
			fleet.Lock()
			delete(fleet.nodes, n.t)
			fleet.Unlock()
		})
	}
	fleet.nodes[n.t][n.name] = n
}

// fleetHealth is node n's PeerHealth source.
func (n *testNode) fleetHealth(s *Store) func() map[filter.NodeID]PeerHealth {
	return func() map[filter.NodeID]PeerHealth {
		out := map[filter.NodeID]PeerHealth{}
		for _, m := range s.State().Nodes {
			fleet.Lock()
			peer := fleet.nodes[n.t][m.Name]
			fleet.Unlock()
			h := PeerHealth{LastHeard: time.Hour}
			if peer != nil {
				if ps := peer.live.Load(); ps != nil {
					h = PeerHealth{Live: true, RulesIndex: ps.State().Index}
				}
			}
			out[m.ID] = h
		}
		return out
	}
}

func newTestNode(t testing.TB, name string) *testNode {
	return &testNode{t: t, name: name, dir: t.TempDir(), raftAddr: "127.0.0.1:0", key: testKey, timing: testTiming}
}

// start opens the store and serves its peer API.
func (n *testNode) start(bootstrap bool) {
	n.t.Helper()
	listenAddr := n.apiAddr
	if listenAddr == "" {
		listenAddr = "127.0.0.1:0"
	}
	ln, err := net.Listen("tcp", listenAddr)
	if err != nil {
		n.t.Fatalf("%s: listen for peer api: %v", n.name, err)
	}
	n.apiAddr = ln.Addr().String()
	s, err := Open(StoreConfig{
		NodeName:      n.name,
		DataDir:       n.dir,
		RaftBind:      n.raftAddr,
		HeartbeatAddr: "127.0.0.1:7946",
		APIAddr:       n.apiAddr,
		Key:           n.key,
		TLS:           n.certs,
		Bootstrap:     bootstrap,
		Timing:        n.timing,
		Voters:        testVoters,
		NoSync:        n.noSync,
		Logger:        slog.New(slog.DiscardHandler),
	})
	if err != nil {
		ln.Close()
		n.t.Fatalf("%s: open: %v", n.name, err)
	}
	n.store = s
	s.SetPeerHealth(n.fleetHealth(s))
	enlist(n)
	n.live.Store(s)
	n.raftAddr = s.RaftAddr()
	n.srv = peer.NewServer(s.PeerHandler(), "peer", nil)
	go n.srv.Serve(peer.Listener(ln, s.TLS(), nil))
	n.t.Cleanup(n.stop)
}

// stoppedID returns the node's id from the registry as it last saw it.
func (n *testNode) stoppedID(t testing.TB) filter.NodeID {
	t.Helper()
	if n.lastID == 0 {
		t.Fatalf("%s has no recorded id", n.name)
	}
	return n.lastID
}

// stop kills the node: raft, storage and peer API. Its state dir stays.
func (n *testNode) stop() {
	if n.store == nil {
		return
	}
	if me := n.store.State().NodeByName(n.name); me != nil {
		n.lastID = me.ID
	}
	n.live.Store(nil)
	n.srv.Close()
	if err := n.store.Close(); err != nil {
		n.t.Errorf("%s: close: %v", n.name, err)
	}
	n.store = nil
}

func testCtx(t testing.TB, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// newCluster bootstraps nodes[0] and joins the others, each through the
// node before it (so a follower forwards the join to the leader).
func newCluster(t testing.TB, size int) []*testNode {
	return newClusterTiming(t, size, testTiming, false)
}

func newClusterTiming(t testing.TB, size int, timing Timing, noSync bool) []*testNode {
	t.Helper()
	nodes := make([]*testNode, size)
	for i := range nodes {
		nodes[i] = newTestNode(t, fmt.Sprintf("n%d", i+1))
		nodes[i].timing = timing
		nodes[i].noSync = noSync
	}
	nodes[0].start(true)
	for i, n := range nodes[1:] {
		n.start(false)
		id, err := n.store.Join(testCtx(t, 10*time.Second), nodes[i].apiAddr, NodeInfo{})
		if err != nil {
			t.Fatalf("%s joins through %s: %v", n.name, nodes[i].name, err)
		}
		if id != filter.NodeID(i+2) {
			t.Errorf("%s got node id %d, want %d", n.name, id, i+2)
		}
	}
	waitConverged(t, nodes)
	return nodes
}

// poll calls f until it returns nil or the deadline passes.
func poll(t testing.TB, d time.Duration, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v: %v", what, d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitConverged waits until every running node holds the same state.
func waitConverged(t testing.TB, nodes []*testNode) *State {
	t.Helper()
	var first *State
	poll(t, 10*time.Second, "replicas converge", func() error {
		first = nil
		for _, n := range nodes {
			if n.store == nil {
				continue
			}
			s := n.store.State()
			if first == nil {
				first = s
				continue
			}
			if diff := cmp.Diff(first, s, stateOpts); diff != "" {
				return fmt.Errorf("%s differs (-first +%s):\n%s", n.name, n.name, diff)
			}
		}
		return nil
	})
	return first
}

func leaderOf(t testing.TB, nodes []*testNode) (leader *testNode, followers []*testNode) {
	t.Helper()
	poll(t, 10*time.Second, "a leader is elected", func() error {
		leader, followers = nil, nil
		for _, n := range nodes {
			switch {
			case n.store == nil:
			case n.store.IsLeader():
				leader = n
			default:
				followers = append(followers, n)
			}
		}
		if leader == nil {
			return errors.New("no leader")
		}
		return nil
	})
	return leader, followers
}

func mustApply(t testing.TB, n *testNode, cmd Command) Result {
	t.Helper()
	res, err := n.store.Apply(testCtx(t, 10*time.Second), cmd)
	if err != nil {
		t.Fatalf("%s: apply %T: %v", n.name, cmd, err)
	}
	return res
}

func putRule(port uint16) *PutRule {
	return &PutRule{Rule: filter.Rule{VIP: vip1, PortLo: port, PortHi: port, Proto: filter.ProtoTCP}}
}

func TestClusterWritesFromFollower(t *testing.T) {
	nodes := newCluster(t, 3)
	_, followers := leaderOf(t, nodes)
	f := followers[0]
	mustApply(t, f, &PutVIP{VIP: vip1})
	res := mustApply(t, f, putRule(80))
	if res.RuleID != 1 {
		t.Errorf("rule id = %d, want 1", res.RuleID)
	}
	// Read your writes: the follower has the rule when Apply returns.
	if got := f.store.State(); got.Rule(1) == nil || got.Index < res.Index {
		t.Errorf("%s state after apply: index %d, rule 1 %v; want index >= %d with the rule", f.name, got.Index, got.Rule(1), res.Index)
	}
	mustApply(t, followers[1], &SetWeight{Rule: 1, Node: 3, Weight: 10})
	// A business error comes back from the leader with its sentinel.
	if _, err := f.store.Apply(testCtx(t, 5*time.Second), putRule(80)); !errors.Is(err, ErrConflict) || !strings.Contains(err.Error(), "overlaps rule 1") {
		t.Errorf("overlapping rule from a follower: err = %v, want ErrConflict naming rule 1", err)
	}
	s := waitConverged(t, nodes)
	if w := s.Node(3).Rules[1].Weight; w != 10 {
		t.Errorf("node 3 weight on rule 1 = %d, want 10", w)
	}
	if got := len(s.Nodes); got != 3 {
		t.Errorf("%d nodes registered, want 3", got)
	}
	for _, n := range nodes {
		if name, ok := n.store.Leader(); !ok || name == "" {
			t.Errorf("%s knows no leader", n.name)
		}
	}
}

func TestClusterLeaderFailover(t *testing.T) {
	nodes := newCluster(t, 3)
	leader, followers := leaderOf(t, nodes)
	mustApply(t, followers[0], &PutVIP{VIP: vip1})
	leader.stop()
	newLeader, _ := leaderOf(t, followers)
	if newLeader == leader {
		t.Fatal("the stopped node is still leader")
	}
	for _, n := range followers {
		mustApply(t, n, putRule(uint16(8000+len(n.name))+uint16(n.name[1])))
	}
	s := waitConverged(t, followers)
	if len(s.Rules) != 2 || !s.HasVIP(vip1) {
		t.Errorf("after failover: vips %v, %d rules; want vip1 and 2 rules", s.VIPs, len(s.Rules))
	}
}

func TestClusterFollowerCatchesUp(t *testing.T) {
	nodes := newCluster(t, 3)
	_, followers := leaderOf(t, nodes)
	down := followers[0]
	down.stop()
	mustApply(t, followers[1], &PutVIP{VIP: vip1})
	for p := uint16(1); p <= 20; p++ {
		mustApply(t, followers[1], putRule(p))
	}
	down.start(false)
	s := waitConverged(t, nodes)
	if len(s.Rules) != 20 {
		t.Errorf("%d rules after catch-up, want 20", len(s.Rules))
	}
}

func TestClusterFullRestartKeepsRules(t *testing.T) {
	nodes := newCluster(t, 3)
	mustApply(t, nodes[2], &PutVIP{VIP: vip1})
	mustApply(t, nodes[2], &PutVIP{VIP: vip2})
	for p := uint16(1); p <= 10; p++ {
		mustApply(t, nodes[p%3], putRule(p))
	}
	mustApply(t, nodes[1], &PutRule{Rule: filter.Rule{VIP: vip2, PortLo: 443, PortHi: 443, Proto: filter.ProtoBoth, Mode: filter.ModeSingle}})
	mustApply(t, nodes[0], &SetWeight{Rule: 3, Node: 2, Weight: 0})
	mustApply(t, nodes[0], &SetHandlingPriority{Rule: 11, Node: 3, Priority: 9})
	mustApply(t, nodes[0], &SetAdminState{Node: 1, State: AdminDraining})
	mustApply(t, nodes[0], &SetRuleState{Rules: []filter.RuleID{4, 5}, State: filter.RuleDisabled})
	before := waitConverged(t, nodes)
	for _, n := range nodes {
		n.stop()
	}
	for i, n := range nodes {
		n.start(i == 0) // existing state wins over the bootstrap flag
	}
	leaderOf(t, nodes)
	poll(t, 10*time.Second, "every node replays its rules", func() error {
		for _, n := range nodes {
			if got := n.store.State(); got.Index < before.Index {
				return fmt.Errorf("%s at index %d, want %d", n.name, got.Index, before.Index)
			}
		}
		return nil
	})
	after := waitConverged(t, nodes)
	if diff := cmp.Diff(before, after, stateOpts); diff != "" {
		t.Errorf("state after a full restart (-before +after):\n%s", diff)
	}
	mustApply(t, nodes[1], putRule(99)) // and the cluster still takes writes
}

func TestTwoNodesOneDownNoQuorum(t *testing.T) {
	for _, stop := range []string{"leader", "follower"} {
		t.Run("stop "+stop, func(t *testing.T) {
			nodes := newCluster(t, 2)
			mustApply(t, nodes[1], &PutVIP{VIP: vip1})
			mustApply(t, nodes[1], putRule(80))
			leader, followers := leaderOf(t, nodes)
			survivor := leader
			if stop == "leader" {
				leader.stop()
				survivor = followers[0]
			} else {
				followers[0].stop()
			}
			start := time.Now()
			_, err := survivor.store.Apply(context.Background(), putRule(81))
			took := time.Since(start)
			if !errors.Is(err, ErrNoQuorum) {
				t.Fatalf("apply with 1 of 2 voters: err = %v, want ErrNoQuorum", err)
			}
			t.Logf("error: %v", err)
			if !strings.Contains(err.Error(), "1 of 2 voters reachable") {
				t.Errorf("error %q does not say how many voters are reachable", err)
			}
			if took > DefaultApplyTimeout+2*time.Second {
				t.Errorf("apply took %v to fail, want about %v", took, DefaultApplyTimeout)
			}
			// Reads still work, from the last applied state.
			s := survivor.store.State()
			if s.Rule(1) == nil || s.Rule(2) != nil {
				t.Errorf("survivor's rules: %+v, want rule 1 only", s.Rules)
			}
		})
	}
}

func TestClusterRemoveDeadNodeAndLeave(t *testing.T) {
	nodes := newCluster(t, 3)
	nodes[2].stop()
	// Any node may remove a dead one; a follower forwards to the leader.
	_, followers := leaderOf(t, nodes[:2])
	var from *testNode = nodes[0]
	if len(followers) > 0 {
		from = followers[0]
	}
	if err := from.store.RemoveNode(testCtx(t, 10*time.Second), 3); err != nil {
		t.Fatalf("remove dead node 3: %v", err)
	}
	s := waitConverged(t, nodes[:2])
	if s.Node(3) != nil || len(s.Nodes) != 2 {
		t.Errorf("registry after removing node 3: %+v", s.Nodes)
	}
	if m, err := nodes[0].store.Members(); err != nil || len(m) != 2 {
		t.Errorf("raft members after removing node 3: %+v, %v; want 2", m, err)
	}
	if err := nodes[1].store.Leave(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("n2 leaves: %v", err)
	}
	poll(t, 10*time.Second, "n2 is gone from n1's registry and raft", func() error {
		m, err := nodes[0].store.Members()
		if err != nil {
			return err
		}
		if len(m) != 1 || nodes[0].store.State().Node(2) != nil {
			return fmt.Errorf("members %+v, registry %+v", m, nodes[0].store.State().Nodes)
		}
		return nil
	})
	nodes[1].stop()
	mustApply(t, nodes[0], &PutVIP{VIP: vip1}) // n1 alone is a quorum
	if err := nodes[0].store.Leave(testCtx(t, 5*time.Second)); !errors.Is(err, ErrConflict) {
		t.Errorf("the last voter leaves: err = %v, want ErrConflict", err)
	}
}

func TestJoinBeyondFiveVotersAddsNonvoters(t *testing.T) {
	if testing.Short() {
		t.Skip("6-node cluster; skipped with -short")
	}
	nodes := newCluster(t, 6)
	members, err := nodes[0].store.Members()
	if err != nil {
		t.Fatal(err)
	}
	voters := 0
	for _, m := range members {
		if m.Voter {
			voters++
		} else if m.Name != "n6" {
			t.Errorf("%s is a non-voter, want only n6", m.Name)
		}
	}
	if voters != MaxVoters || len(members) != 6 {
		t.Errorf("%d members with %d voters, want 6 with %d", len(members), voters, MaxVoters)
	}
	mustApply(t, nodes[5], &PutVIP{VIP: vip1}) // a non-voter forwards writes too
	waitConverged(t, nodes)

	// Removing a voter promotes the non-voter.
	_, followers := leaderOf(t, nodes)
	gone := followers[0]
	gone.stop()
	if err := nodes[5].store.RemoveNode(testCtx(t, 10*time.Second), gone.stoppedID(t)); err != nil {
		t.Fatalf("remove %s: %v", gone.name, err)
	}
	poll(t, 10*time.Second, "n6 becomes a voter", func() error {
		ms, err := nodes[5].store.Members()
		if err != nil {
			return err
		}
		for _, m := range ms {
			if m.Name == "n6" && m.Voter && len(ms) == 5 {
				return nil
			}
		}
		return fmt.Errorf("members %+v", ms)
	})
}

func TestJoinWithWrongKeyRefused(t *testing.T) {
	nodes := newCluster(t, 1)
	bad := newTestNode(t, "intruder")
	bad.key = []byte("fedcba9876543210fedcba9876543210")
	bad.start(false)
	_, err := bad.store.Join(testCtx(t, 5*time.Second), nodes[0].apiAddr, NodeInfo{})
	if !errors.Is(err, ErrAuth) {
		t.Fatalf("join with the wrong key: err = %v, want ErrAuth", err)
	}
	if s := nodes[0].store.State(); len(s.Nodes) != 1 {
		t.Errorf("registry after a refused join: %+v", s.Nodes)
	}
}

func TestApplyWithoutClusterFails(t *testing.T) {
	n := newTestNode(t, "lonely")
	n.start(false)
	ctx := testCtx(t, 5*time.Second)
	_, err := n.store.Apply(ctx, &InitCluster{Settings: testSettings()})
	if !errors.Is(err, ErrNotMember) {
		t.Errorf("apply on a node that joined nothing: err = %v, want ErrNotMember", err)
	}
}

func TestLeaderLeaves(t *testing.T) {
	nodes := newCluster(t, 3)
	leader, followers := leaderOf(t, nodes)
	id := leader.store.State().NodeByName(leader.name).ID
	if err := leader.store.Leave(testCtx(t, 10*time.Second)); err != nil {
		t.Fatalf("leader %s leaves: %v", leader.name, err)
	}
	leader.stop()
	newLeader, _ := leaderOf(t, followers)
	poll(t, 10*time.Second, "the old leader is out of raft and the registry", func() error {
		m, err := newLeader.store.Members()
		if err != nil {
			return err
		}
		if len(m) != 2 || newLeader.store.State().Node(id) != nil {
			return fmt.Errorf("members %+v, registry %+v", m, newLeader.store.State().Nodes)
		}
		return nil
	})
	mustApply(t, followers[0], &PutVIP{VIP: vip1})
	waitConverged(t, followers)
}

func TestSubscribeNotifiesEachChange(t *testing.T) {
	nodes := newCluster(t, 2)
	_, followers := leaderOf(t, nodes)
	ch, stop := followers[0].store.Subscribe()
	defer stop()
	select { // drain a notice left from forming the cluster
	case <-ch:
	default:
	}
	before := followers[0].store.State().Index
	res := mustApply(t, nodes[0], &PutVIP{VIP: vip1})
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatal("no notification after a change")
	}
	poll(t, 5*time.Second, "follower applies the change", func() error {
		if s := followers[0].store.State(); s.Index < res.Index || !s.HasVIP(vip1) {
			return fmt.Errorf("index %d (was %d), want %d with the vip", s.Index, before, res.Index)
		}
		return nil
	})
	stop()
	mustApply(t, nodes[0], &PutVIP{VIP: vip2})
	poll(t, 5*time.Second, "follower applies the second change", func() error {
		if !followers[0].store.State().HasVIP(vip2) {
			return errors.New("no vip2 yet")
		}
		return nil
	})
	select {
	case <-ch:
		t.Error("notified after stop")
	default:
	}
}

// TestInterruptedBootstrapFinishes covers an agent that died after making
// its one-node cluster but before initialising it: started again with the
// bootstrap flag, it finishes the job.
func TestInterruptedBootstrapFinishes(t *testing.T) {
	n := newTestNode(t, "n1")
	n.start(false)
	self := raft.Server{Suffrage: raft.Voter, ID: "n1", Address: raft.ServerAddress(n.raftAddr)}
	if err := n.store.raft.BootstrapCluster(raft.Configuration{Servers: []raft.Server{self}}).Error(); err != nil {
		t.Fatal(err)
	}
	n.stop()
	n.start(true)
	poll(t, 10*time.Second, "the bootstrap is finished", func() error {
		s := n.store.State()
		if s.Settings.ClusterID == 0 || s.NodeByName("n1") == nil {
			return fmt.Errorf("cluster id %x, nodes %+v", s.Settings.ClusterID, s.Nodes)
		}
		return nil
	})
	mustApply(t, n, &PutVIP{VIP: vip1})
}

// TestSnapshotsThroughRaft takes real snapshots (file store) and compacts
// the log, so a restarted node restores from its snapshot and a follower
// that fell behind the compacted log is caught up with InstallSnapshot.
func TestSnapshotsThroughRaft(t *testing.T) {
	raftConfigHook = func(c *raft.Config) { c.TrailingLogs = 2 }
	t.Cleanup(func() { raftConfigHook = nil })
	nodes := newCluster(t, 3)
	leader, followers := leaderOf(t, nodes)
	behind := followers[0]
	behind.stop()
	mustApply(t, leader, &PutVIP{VIP: vip1})
	for p := uint16(1); p <= 30; p++ {
		mustApply(t, followers[1], putRule(p))
	}
	mustApply(t, leader, &SetWeight{Rule: 7, Node: 2, Weight: 3})
	for _, n := range []*testNode{leader, followers[1]} {
		if err := n.store.raft.Snapshot().Error(); err != nil {
			t.Fatalf("%s: snapshot: %v", n.name, err)
		}
	}
	mustApply(t, leader, putRule(31)) // one entry after the snapshot
	if first, err := leader.store.bolt.FirstIndex(); err != nil || first <= 3 {
		t.Fatalf("leader's log starts at %d (%v); the snapshot did not compact it", first, err)
	}
	behind.start(false)
	want := waitConverged(t, nodes)
	if len(want.Rules) != 31 || want.Node(2).NodeRule(7).Weight != 3 {
		t.Fatalf("converged state has %d rules, weight %d; want 31 and 3", len(want.Rules), want.Node(2).NodeRule(7).Weight)
	}
	// A restart restores from the snapshot and replays the entry after it.
	followers[1].stop()
	followers[1].start(false)
	poll(t, 10*time.Second, followers[1].name+" restores", func() error {
		if got := followers[1].store.State(); got.Index < want.Index {
			return fmt.Errorf("index %d, want %d", got.Index, want.Index)
		}
		return nil
	})
	if diff := cmp.Diff(want, followers[1].store.State(), stateOpts); diff != "" {
		t.Errorf("state after restoring from a snapshot (-want +got):\n%s", diff)
	}
}

func TestPeerStateEndpoint(t *testing.T) {
	nodes := newCluster(t, 1)
	mustApply(t, nodes[0], &PutVIP{VIP: vip1})
	url := peer.URL(nodes[0].apiAddr, pathState)
	resp, err := peer.NewClient(testCerts(t, "n1", testKey)).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var got State
	if err := json.NewDecoder(resp.Body).Decode(&got); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET state: %s, %v", resp.Status, err)
	}
	if diff := cmp.Diff(nodes[0].store.State(), &got, stateOpts); diff != "" {
		t.Errorf("peer state (-local +peer):\n%s", diff)
	}
	if resp2, err := http.Get(url); err == nil {
		resp2.Body.Close()
		t.Errorf("GET state without TLS: %s, want refused", resp2.Status)
	}
}

// TestConcurrentWritesFromEveryNode proposes rules from all nodes at once:
// each gets its own id and every replica ends with the same state.
func TestConcurrentWritesFromEveryNode(t *testing.T) {
	nodes := newCluster(t, 3)
	mustApply(t, nodes[0], &PutVIP{VIP: vip1})
	const writes = 30
	type out struct {
		id  filter.RuleID
		err error
	}
	results := make(chan out, writes)
	for i := range writes {
		go func() {
			res, err := nodes[i%3].store.Apply(testCtx(t, 10*time.Second), putRule(uint16(1000+i)))
			results <- out{res.RuleID, err}
		}()
	}
	ids := map[filter.RuleID]bool{}
	for range writes {
		o := <-results
		if o.err != nil {
			t.Errorf("concurrent write: %v", o.err)
			continue
		}
		if ids[o.id] {
			t.Errorf("rule id %d handed out twice", o.id)
		}
		ids[o.id] = true
	}
	if s := waitConverged(t, nodes); len(s.Rules) != writes {
		t.Errorf("%d rules, want %d", len(s.Rules), writes)
	}
}

// TestForwardedRetryAppliesOnce sends one request twice to the leader, as a
// follower does when the first reply is lost: one rule, one answer.
func TestForwardedRetryAppliesOnce(t *testing.T) {
	nodes := newCluster(t, 2)
	leader, followers := leaderOf(t, nodes)
	f := followers[0]
	mustApply(t, f, &PutVIP{VIP: vip1})
	data, err := encodeEntry(putRule(80), 4242)
	if err != nil {
		t.Fatal(err)
	}
	var results []Result
	for range 2 {
		res, err := f.store.forward(testCtx(t, 5*time.Second), leader.apiAddr, pathApply, data, true)
		if err != nil {
			t.Fatalf("forward: %v", err)
		}
		results = append(results, res)
	}
	if diff := cmp.Diff(results[0], results[1]); diff != "" {
		t.Errorf("second answer (-first +second):\n%s", diff)
	}
	if s := waitConverged(t, nodes); len(s.Rules) != 1 {
		t.Errorf("%d rules after a retried request, want 1", len(s.Rules))
	}
}

// TestFollowersApplyWithoutWaitingForCommitTimeout: an idle leader tells its
// followers about commits only every CommitTimeout; a write must still reach
// every replica at once.
func TestFollowersApplyWithoutWaitingForCommitTimeout(t *testing.T) {
	slow := testTiming
	slow.CommitTimeout = 5 * time.Second
	nodes := newClusterTiming(t, 3, slow, false)
	leader, followers := leaderOf(t, nodes)
	mustApply(t, leader, &PutVIP{VIP: vip1})
	for i := range 3 {
		start := time.Now()
		res := mustApply(t, leader, putRule(uint16(2000+i)))
		for _, f := range followers {
			poll(t, 2*time.Second, "a follower applies the write", func() error {
				if got := f.store.State().Index; got < res.Index {
					return fmt.Errorf("%s at index %d, want %d", f.name, got, res.Index)
				}
				return nil
			})
		}
		t.Logf("write %d applied everywhere after %v", i, time.Since(start))
	}
}

// TestSettledTimeouts: every node switches to the settled Raft timeouts
// once it has a leader, the settled cluster keeps its leader while idle
// (the lease outlasts the longer gaps between heartbeats), and it still
// replaces a stopped leader and takes writes.
func TestSettledTimeouts(t *testing.T) {
	timing := testTiming
	timing.SettledHeartbeatTimeout, timing.SettledElectionTimeout = 600*time.Millisecond, 600*time.Millisecond
	timing.LeaderLeaseTimeout = 300 * time.Millisecond
	nodes := newClusterTiming(t, 3, timing, false)
	for _, n := range nodes {
		poll(t, 5*time.Second, n.name+" settles", func() error {
			rc := n.store.raft.ReloadableConfig()
			if rc.HeartbeatTimeout != timing.SettledHeartbeatTimeout || rc.ElectionTimeout != timing.SettledElectionTimeout {
				return fmt.Errorf("heartbeat timeout %v, election timeout %v", rc.HeartbeatTimeout, rc.ElectionTimeout)
			}
			return nil
		})
	}
	leader, followers := leaderOf(t, nodes)
	term := leader.store.raft.CurrentTerm()
	// Idle for several settled heartbeat timeouts: no follower may start
	// an election, and the leader may not step down.
	time.Sleep(3 * timing.SettledHeartbeatTimeout)
	if !leader.store.IsLeader() || leader.store.raft.CurrentTerm() != term {
		t.Fatalf("idle settled cluster changed leader: %s leads %v, term %d -> %d", leader.name, leader.store.IsLeader(), term, leader.store.raft.CurrentTerm())
	}
	mustApply(t, followers[0], &PutVIP{VIP: vip1})
	leader.stop()
	start := time.Now()
	next, _ := leaderOf(t, followers)
	t.Logf("new leader %s after %v", next.name, time.Since(start))
	mustApply(t, next, putRule(2000))
}

// TestBootstrapElectsAtOnce: a fresh one-node cluster does not wait a
// heartbeat timeout for its first election (it would take 2-4 s here).
func TestBootstrapElectsAtOnce(t *testing.T) {
	n := newTestNode(t, "n1")
	n.timing = Timing{HeartbeatTimeout: 2 * time.Second, ElectionTimeout: 2 * time.Second,
		LeaderLeaseTimeout: 200 * time.Millisecond, CommitTimeout: 5 * time.Millisecond}
	start := time.Now()
	n.start(true)
	took := time.Since(start)
	if !n.store.IsLeader() {
		t.Fatal("a bootstrapped node is not the leader once Open returns")
	}
	if took > time.Second {
		t.Errorf("bootstrap took %v; want well under the 2 s heartbeat timeout", took)
	}
	if rc := n.store.raft.ReloadableConfig(); rc.HeartbeatTimeout != 200*time.Millisecond {
		t.Errorf("heartbeat timeout %v after bootstrap, want the lease, 200ms", rc.HeartbeatTimeout)
	}
}

func TestTimingValidate(t *testing.T) {
	tests := []struct {
		name string
		t    Timing
		ok   bool
	}{
		{"default", DefaultTiming(), true},
		{"no settled timeouts", testTiming, true},
		{"settled below the first", Timing{HeartbeatTimeout: time.Second, ElectionTimeout: time.Second, LeaderLeaseTimeout: time.Second,
			SettledHeartbeatTimeout: 500 * time.Millisecond, SettledElectionTimeout: 2 * time.Second}, false},
		{"lease too short for the settled heartbeats", Timing{HeartbeatTimeout: time.Second, ElectionTimeout: time.Second, LeaderLeaseTimeout: 500 * time.Millisecond,
			SettledHeartbeatTimeout: 2 * time.Second, SettledElectionTimeout: 2 * time.Second}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.t.validate()
			if (err == nil) != tt.ok {
				t.Fatalf("validate() = %v, want ok %v", err, tt.ok)
			}
			if err != nil && !errors.Is(err, ErrInvalid) {
				t.Errorf("error %v is not ErrInvalid", err)
			}
		})
	}
}

// TestAutopilotReplacesDeadVoters: two voters die at once (the leader one
// of them); the rules stay writable, the dead are demoted and two healthy
// non-voters promoted, so two more may die; a dead voter that comes back
// rejoins as a non-voter.
func TestAutopilotReplacesDeadVoters(t *testing.T) {
	if testing.Short() {
		t.Skip("8-node cluster; skipped with -short")
	}
	nodes := newCluster(t, 8)
	mustApply(t, nodes[0], &PutVIP{VIP: vip1})
	running := func() []*testNode {
		var out []*testNode
		for _, n := range nodes {
			if n.store != nil {
				out = append(out, n)
			}
		}
		return out
	}
	// votersOf: the voters in the configuration as a running node sees it.
	votersOf := func() (map[string]bool, error) {
		leader, _ := leaderOf(t, running())
		ms, err := leader.store.Members()
		if err != nil {
			return nil, err
		}
		v := map[string]bool{}
		for _, m := range ms {
			if m.Voter {
				v[m.Name] = true
			}
		}
		return v, nil
	}
	// fiveLive waits for five voters, every one of them running.
	fiveLive := func(what string) map[string]bool {
		var v map[string]bool
		poll(t, 15*time.Second, what, func() error {
			var err error
			if v, err = votersOf(); err != nil {
				return err
			}
			for _, n := range nodes {
				if v[n.name] && n.store == nil {
					return fmt.Errorf("voters %v include %s, which is down", v, n.name)
				}
			}
			if len(v) != MaxVoters {
				return fmt.Errorf("voters %v, want %d", v, MaxVoters)
			}
			return nil
		})
		return v
	}
	port := uint16(1000)
	write := func(what string) {
		t.Helper()
		port++
		start := time.Now()
		_, err := running()[0].store.Apply(testCtx(t, 10*time.Second), putRule(port))
		if err != nil {
			t.Fatalf("%s: write: %v", what, err)
		}
		t.Logf("%s: written in %v", what, time.Since(start).Round(time.Millisecond))
	}
	for round := 1; round <= 2; round++ {
		v := fiveLive(fmt.Sprintf("round %d: five live voters", round))
		leader, _ := leaderOf(t, running())
		var killed []*testNode
		killed = append(killed, leader)
		for _, n := range nodes {
			if v[n.name] && n != leader && len(killed) < 2 {
				killed = append(killed, n)
			}
		}
		for _, n := range killed {
			n.stop()
		}
		write(fmt.Sprintf("round %d: %s and %s dead", round, killed[0].name, killed[1].name))
		after := fiveLive(fmt.Sprintf("round %d: the dead voters replaced", round))
		for _, n := range killed {
			if after[n.name] {
				t.Errorf("round %d: %s is dead and still a voter", round, n.name)
			}
		}
		write(fmt.Sprintf("round %d: after the replacement", round))
		if round == 1 {
			// One of the dead comes back: a non-voter, and no election.
			back := killed[1]
			leaderBefore, _ := leaderOf(t, running())
			term := leaderBefore.store.raft.CurrentTerm()
			back.start(false)
			waitConverged(t, running())
			time.Sleep(3 * testVoters.Interval)
			if v, err := votersOf(); err != nil || v[back.name] {
				t.Errorf("%s came back as a voter (%v, %v); want a non-voter", back.name, v, err)
			}
			if now := leaderBefore.store.raft.CurrentTerm(); !leaderBefore.store.IsLeader() || now != term {
				t.Errorf("%s's return disturbed the leader: term %d -> %d", back.name, term, now)
			}
		}
	}
}
