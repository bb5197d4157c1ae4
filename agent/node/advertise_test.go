package node

import (
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net/netip"
	"testing"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// nodeRules is twoNodeRules with n nodes of equal weight.
func nodeRules(index uint64, n int) *rules.State {
	st := twoNodeRules(index, 50, 50)
	for id := 3; id <= n; id++ {
		nd := st.Nodes[1]
		nd.ID, nd.Name, nd.HostPriority = filter.NodeID(id), fmt.Sprintf("n%d", id), id
		nd.HeartbeatAddr = fmt.Sprintf("127.0.0.1:%d", 7000+id)
		st.Nodes = append(st.Nodes, nd)
	}
	st.LastNodeID = filter.NodeID(n)
	return st
}

// farm is n members of one rules state on a virtual clock, every
// heartbeat delivered to every other member at the next tick, each
// member's data plane taking its snapshots after a delay the test sets.
type farm struct {
	t       *testing.T
	now     time.Time
	ms      []*membership
	links   []*fanLink
	inbox   [][]*heartbeat.Message
	running []bool
	queue   [][]queued // snapshots waiting for each data plane
	delay   func(i int) time.Duration
	adopted []map[string]time.Time // by member: when each view was adopted
	adv     []map[string]time.Time // by member: when a heartbeat first advertised it
	pushed  []map[string]time.Time // by member: when its tables were first reported in
}

type queued struct {
	at   time.Time
	snap *Snap
}

func newFarm(t *testing.T, st *rules.State, n int) *farm {
	f := &farm{t: t, now: time.Unix(1000, 0), inbox: make([][]*heartbeat.Message, n), running: make([]bool, n),
		queue: make([][]queued, n), delay: func(int) time.Duration { return 0 }}
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := range n {
		l := &fanLink{now: func() time.Time { return f.now }}
		for j := range n {
			if j != i {
				l.inboxes = append(l.inboxes, &f.inbox[j])
			}
		}
		m := newMembership(filter.NodeID(i+1), testIncarnation, log, l, staticRules{st}, func() bool { return true })
		m.now = func() time.Time { return f.now }
		f.ms, f.links = append(f.ms, m), append(f.links, l)
		f.adopted = append(f.adopted, map[string]time.Time{})
		f.adv = append(f.adv, map[string]time.Time{})
		f.pushed = append(f.pushed, map[string]time.Time{})
	}
	return f
}

func viewKey(v heartbeat.View) string { return fmt.Sprint(v.Eligible, v.RulesIndex) }

// start runs member i from now on.
func (f *farm) start(i int) {
	if err := f.ms[i].start(f.now); err != nil {
		f.t.Fatal(err)
	}
	f.running[i] = true
}

// tick advances the clock by dt and runs every running member once.
func (f *farm) tick(dt time.Duration) {
	f.now = f.now.Add(dt)
	for i, m := range f.ms {
		msgs := f.inbox[i]
		f.inbox[i] = nil
		if !f.running[i] {
			continue
		}
		for q := f.queue[i]; len(q) > 0 && !q[0].at.After(f.now); q = f.queue[i] {
			m.takeReport(pushReport{snap: q[0].snap, ok: true, healthy: true})
			if k := viewKey(q[0].snap.hb.View); f.pushed[i][k].IsZero() {
				f.pushed[i][k] = f.now
			}
			f.queue[i] = q[1:]
		}
		for _, msg := range msgs {
			m.receive(msg, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(7000+msg.Node)))
		}
		sent := len(f.links[i].sent)
		last := m.snap.Load()
		m.step(f.now)
		if s := m.snap.Load(); s != last {
			f.queue[i] = append(f.queue[i], queued{at: f.now.Add(f.delay(i)), snap: s})
			if k := viewKey(s.hb.View); f.adopted[i][k].IsZero() {
				f.adopted[i][k] = f.now
			}
		}
		if len(f.links[i].sent) > sent {
			if k := viewKey(m.lastView); f.adv[i][k].IsZero() {
				f.adv[i][k] = f.now
			}
		}
	}
}

// kernelAccept is what member i's kernel tables accept.
func (f *farm) kernelAccept(i int) filter.Set {
	k := f.ms[i].inKernel
	if !k.ok {
		return filter.Set{}
	}
	return k.snap.hb.Accept.get().Buckets
}

// TestNoBucketInTwoKernelsWhileViewsChange: members join and die while
// their data planes take each snapshot after a random delay; at every
// instant the tables in the running members' kernels accept no bucket
// twice, and once the changes stop every bucket is accepted somewhere.
// (It fails if a view that adds a node were advertised before its
// tables: the newcomer acquires while the others' kernels still hold its
// buckets.)
func TestNoBucketInTwoKernelsWhileViewsChange(t *testing.T) {
	const period = 100 * time.Millisecond
	const dt = period / 10
	for seed := range uint64(6) {
		t.Run(fmt.Sprint("seed ", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			const n = 5
			f := newFarm(t, nodeRules(5, n), n)
			f.delay = func(int) time.Duration { return time.Duration(rng.IntN(8)) * dt }
			// Nodes 1-3 at once, node 4 and 5 join later; then node 2
			// and node 5 die, one after the other or together.
			events := map[int]func(){
				0:   func() { f.start(0); f.start(1); f.start(2) },
				200: func() { f.start(3) },
				230: func() { f.start(4) },
				500: func() { f.running[1] = false },
			}
			second := 500 + rng.IntN(30)
			if rng.IntN(2) == 0 {
				second = 700
			}
			prevEvent := events[second]
			events[second] = func() {
				if prevEvent != nil {
					prevEvent()
				}
				f.running[4] = false
			}
			for tick := range 1100 {
				if ev := events[tick]; ev != nil {
					ev()
				}
				f.tick(dt)
				seen := filter.Set{}
				for i := range f.ms {
					if !f.running[i] {
						continue
					}
					for id, bm := range f.kernelAccept(i) {
						for w, bits := range bm {
							if old := seen[id]; old != nil && old[w]&bits != 0 {
								t.Fatalf("tick %d: member %d's kernel accepts buckets %#x of word %d, rule %d, that another running member's accepts too", tick, i+1, old[w]&bits, w, id)
							}
							if seen[id] == nil {
								seen[id] = new(filter.Bitmap)
							}
							seen[id][w] |= bits
						}
					}
				}
				if tick == 1099 {
					if got := seen.Count(); got != 2*filter.NumBuckets {
						t.Errorf("at the end the running members' kernels accept %d buckets, want %d", got, 2*filter.NumBuckets)
					}
				}
			}
		})
	}
}
