package node

import (
	"context"
	"log/slog"
	"net"
	"net/netip"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalnet/shoal/agent/internal/mailbox"
	"github.com/shoalnet/shoal/agent/track"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// Dataplane is what the agent needs of the XDP program.
type Dataplane interface {
	Update(t *filter.Tables, ifMAC net.HardwareAddr) error
	Counters() (filter.Counters, error)
}

// reconciler owns the data plane: from membership's latest snapshot (view,
// accepting set, peers' draining buckets, the view's own rules) and the
// tracker's held buckets it computes tables, pushes them, and reports back
// what the kernel holds. It is the only goroutine that calls Update.
//
// A push that fails leaves the previous tables in the kernel (Update swaps
// whole tables) and is reported as such, so membership never advertises the
// new view; the node also reports the data plane unhealthy, which takes it
// out of the eligible set once the tables that say so are in, retries with
// backoff, and stays out for a hold-down after the next success.
type reconciler struct {
	self     filter.NodeID
	log      *slog.Logger
	dp       Dataplane
	mac      func() net.HardwareAddr // the interface's MAC, which accepted frames get
	trk      *track.Tracker
	wake     chan struct{}
	in       *mailbox.Box[*Snap]      // from membership
	out      *mailbox.Box[pushReport] // to membership
	announce func()                   // gratuitous ARP after a view change
	onPush   func(s *Snap)
	finish   func(ctx context.Context) error
	now      func() time.Time
	// neighbors returns the MAC the host knows for a neighbour's address
	// (the peers' heartbeat addresses among them): the MACs SYNs are
	// handed over to. Nil: no hand-over.
	neighbors func(netip.Addr) net.HardwareAddr
	// fwd completes routed mode's tables with forwarding; nil: the node
	// keeps whatever the routers send it (plain ECMP).
	fwd *forwarder

	failures atomic.Uint64 // table pushes the data plane refused
	pub      atomic.Pointer[dataSnap]

	// Owned by the goroutine.
	snap        *Snap
	held        track.Held
	heldFresh   bool // held changed since the last push
	scannedView heartbeat.View
	polling     bool
	pushedGen   uint64
	pushedMAC   string
	pushedView  heartbeat.View
	pushedSnap  *Snap // the snapshot the kernel's tables came from
	pushedAt    time.Time
	epoch       uint64 // counts tables that released buckets; held is of the latest
	rescan      bool   // the tables of epoch need a scan once they are in
	last        plan
	tablesIndex uint64
	tablesAt    time.Time // when the kernel's tables went in (a push that changed them)
	healthy     bool
	failedAt    time.Time
	backoff     time.Duration
	lastErr     string
	lastLog     time.Time
	suppressed  int
	stopAsked   time.Time
	assign      *sharedAssigner // owners of the view's buckets, for hand-overs: membership's, whose lazy sets this goroutine computes
	released    filter.Set      // buckets handView's change released: SYNs there are handed over
	handView    heartbeat.View  // the view released belongs to
	handUntil   time.Time       // when released is cleared (zero: the view has not converged)
	kept        filter.Set      // the buckets the last tables keep for owners not ready (keeping)
	keepUntil   time.Time       // when keeping ends for this view at the latest (keepFor)
	// prev is the tables in the kernel when the rules last changed in a
	// way that remapped flows (filter.Tables.Prev): the SYNs they took
	// are kept or handed over under the new rules until the view of the
	// new rules converged, and handGrace periods more (prevUntil; zero:
	// not converged). remapKeep: the last tables keep some of them for
	// owners not ready.
	prev      *filter.Tables
	prevUntil time.Time
	remapKeep bool
	wg        sync.WaitGroup
}

// dataSnap is what the reconciler publishes for the APIs; immutable.
type dataSnap struct {
	tables      *filter.Tables
	tablesIndex uint64
	tablesAt    time.Time // when tables went into the kernel
	conns       int
	counted     bool // conns is a scan's, begun after the latest release
	healthy     bool
	lastErr     string
}

// Backoff after a refused push: the retry waits this long, doubling per
// failure up to maxPushBackoff, and the node stays out of the eligible set
// for as long after the next success. A minute without failures resets it.
const (
	minPushBackoff = 200 * time.Millisecond
	maxPushBackoff = 10 * time.Second
	pushLogEvery   = 10 * time.Second
	stopRetry      = 10 * time.Second // a drained node asks again to be stopped
)

func newReconciler(self filter.NodeID, log *slog.Logger, dp Dataplane, mac func() net.HardwareAddr, trk *track.Tracker,
	in *mailbox.Box[*Snap], out *mailbox.Box[pushReport]) *reconciler {
	r := &reconciler{self: self, log: log, dp: dp, mac: mac, trk: trk, in: in, out: out, wake: make(chan struct{}, 1),
		announce: func() {}, onPush: func(*Snap) {}, finish: func(context.Context) error { return nil }, now: time.Now, healthy: true,
		assign: &sharedAssigner{}}
	r.pub.Store(&dataSnap{healthy: true})
	return r
}

// run is the reconciler goroutine.
func (r *reconciler) run(ctx context.Context) {
	defer r.wg.Wait()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.in.Ready:
			r.snap = r.in.Take()
		case <-r.trk.Out.Ready:
			// Only a scan begun after the latest tables that released
			// buckets went in has seen every handshake they let begin.
			if h := r.trk.Out.Take(); h.Err == nil && r.snap != nil && h.Cfg == r.snap.fcfg && h.Epoch == r.epoch {
				r.heldFresh = !h.Set.Equal(r.held.Set) || h.Conns != r.held.Conns
				r.held = h
				r.publish()
			}
		case <-r.wake:
		case <-timer.C:
		}
		next := r.reconcile(ctx, r.now())
		timer.Reset(max(next, time.Millisecond))
	}
}

// reconcile pushes new tables when anything they depend on changed, or
// retries a refused push. It returns how long until it wants to run again.
func (r *reconciler) reconcile(ctx context.Context, now time.Time) time.Duration {
	s := r.snap
	if s == nil {
		return time.Hour
	}
	retry := !r.healthy && !now.Before(r.failedAt.Add(r.backoff))
	mac := r.mac()
	handEnds := len(r.released) > 0 && !r.handUntil.IsZero() && !now.Before(r.handUntil)
	keepEnds := (len(r.kept) > 0 || r.remapKeep) && !now.Before(r.keepUntil)
	prevEnds := r.prev != nil && !r.prevUntil.IsZero() && !now.Before(r.prevUntil)
	resolve := r.fwd != nil && r.fwd.unresolved && !now.Before(r.pushedAt.Add(resolveEvery))
	if s.gen == r.pushedGen && !r.heldFresh && !retry && !handEnds && !keepEnds && !prevEnds && !resolve && string(mac) == r.pushedMAC {
		r.finishDrain(ctx, now, s)
		return r.wakeIn(now)
	}
	t0 := r.now()
	accept, dirty := s.hb.Accept.get(), peersDraining(s.fcfg, s.rs.Index, s.hb.Peers)
	r.followPrev(now, s)
	keep := r.keeping(now, s, accept.Buckets)
	if len(keep) > 0 {
		accept = filter.Grant{Buckets: union(accept.Buckets, keep), Maps: accept.Maps}
	}
	prevEnded := r.last.tables != nil && r.last.tables.Prev != nil && r.prev == nil
	if viewChanged := !s.hb.View.Equal(r.scannedView) || r.held.Cfg != s.fcfg; viewChanged || len(r.kept) > 0 || prevEnded {
		r.scannedView = s.hb.View
		// The view releases buckets (or changed the rules, or these are
		// the first tables). Until they are in, this node still answers
		// SYNs in them, so no scan made before can know its connections:
		// every bucket that may hold one drains (and is announced so, for
		// peers to take it dirty), and a scan asked for once the tables
		// are in says which really do. Nothing waits for that scan (tens
		// of milliseconds beside 100,000 TIME_WAIT sockets): neither the
		// heartbeat that advertises the view nor a new owner's push.
		// Otherwise nothing left the accepting set and the connections
		// held are where the last scan saw them.
		// (A view that kept buckets for their new owners releases them
		// later, once those advertise it.)
		// (So do tables that let the previous rules' SYNs go.)
		if r.last.tables == nil || s.hb.Inheriting || r.held.Cfg != s.fcfg || releases(r.last.tables, accept.Buckets) || prevEnded {
			r.epoch++
			r.held = track.Held{Set: mayHold(s.fcfg, r.last.tables, r.held, s.hb.Inheriting), Conns: r.held.Conns,
				Cfg: s.fcfg, Epoch: r.epoch, Guess: true}
			r.rescan = true
		}
	}
	t1 := r.now()
	admin := s.admin
	if s.hb.Inheriting {
		// The previous agent's set, from before the peers are heard: keep
		// only what means the same flows under these rules, and its
		// peers' connections dirty.
		accept, dirty = accept.Intersect(everything(s.fcfg)), union(dirty, s.inheritedDirty)
	}
	hold := r.held.Set
	var remapped map[filter.RuleID]bool
	if r.prev != nil {
		// Every bucket of a remapped rule may hold a connection whose SYN
		// the previous tables took: its packets must find the socket.
		remapped = s.fcfg.Remapped(r.prev.Config)
		hold = union(hold, nil)
		for id := range remapped {
			hold[id] = full()
		}
	}
	routed := s.rs.Settings.MACMode == rules.MACRouted
	// Forwarding needs this node's IPv4 address: without it (or with
	// forwarding off) routed mode keeps whatever the routers send.
	forwards := routed && r.fwd != nil && NodeAddr(s.rs, r.self).IsValid()
	if routed && !forwards {
		// The routers choose which node serves a flow: this node keeps
		// whatever it is sent (no bucket is another's, none is dirty)
		// unless it is stopped or suspended, as in the other modes.
		accept, dirty, hold = filter.Grant{Buckets: filter.Set{}}, nil, nil
		if admin != rules.AdminStopped && admin != rules.AdminSuspended {
			accept = everything(s.fcfg)
		}
	}
	p := planTables(s.fcfg, r.self, admin, s.plugged, accept.Buckets, dirty, hold)
	if !routed || forwards {
		p.tables.Prev = r.prev
	}
	p.tables.Routed = routed
	hands := r.handOver(now, s, p.tables, accept.Buckets)
	r.remapKeep = r.keepRemapped(now, s, p.tables, remapped, hands)
	if forwards {
		// Routed: the packets this node does not take go to the node that
		// does (docs/ROUTED.md).
		r.fwd.complete(s, r.self, p.tables, r.assign)
	}
	t2 := r.now()
	// Tables the kernel already holds need no push (a view that moves
	// nothing here, the same tables for the next snapshot): pushing them
	// again would only make the next push, the one that acquires, wait
	// for this one's flip to retire.
	same := r.healthy && r.last.tables != nil && string(mac) == r.pushedMAC && sameTables(p.tables, r.last.tables)
	if same {
		// The kernel's tables stay what they are; a later push may name
		// them as its Prev.
		p.tables = r.last.tables
	} else {
		if err := r.dp.Update(p.tables, mac); err != nil {
			r.refused(now, s, err)
			return r.wakeIn(now)
		}
		r.tablesAt = r.now()
	}
	if t3 := r.now(); r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("tables pushed", "at", stamp(t3), "gen", s.gen, "view", s.hb.View.Eligible, "rules", s.hb.View.RulesIndex,
			"converged", s.hb.Converged, "skipped", same, "owned", stateCounts(p.tables, filter.Owned), "dirty", stateCounts(p.tables, filter.OwnedDirty),
			"draining", stateCounts(p.tables, filter.Draining), "handed_over", handCount(p.tables), "kept", keep.Count(),
			"scan", t1.Sub(t0), "plan", t2.Sub(t1), "update", t3.Sub(t2), "since_adopted", t3.Sub(s.hb.AdoptedAt))
	}
	if !r.healthy && !now.Before(r.failedAt.Add(r.backoff)) {
		r.healthy = true
		r.log.Info("data plane takes tables again", "view", s.hb.View.Eligible)
	}
	if r.healthy && !r.failedAt.IsZero() && now.Sub(r.failedAt) > time.Minute {
		r.backoff, r.failedAt = 0, time.Time{}
	}
	viewChanged := !s.hb.View.Equal(r.pushedView)
	r.last, r.pushedGen, r.pushedView, r.tablesIndex, r.heldFresh = p, s.gen, s.hb.View, s.rs.Index, false
	r.pushedSnap = s
	r.pushedMAC = string(mac)
	r.pushedAt = now
	if poll := p.draining.Count() > 0; poll != r.polling || r.rescan {
		r.polling, r.rescan = poll, false
		r.trk.Request(s.fcfg, poll, r.epoch)
	}
	r.kept = keep
	r.out.Put(pushReport{snap: s, ok: true, healthy: r.healthy,
		draining: toHeartbeat(p.draining), conns: r.held.Conns, keeping: len(keep) > 0 || r.remapKeep})
	r.publish()
	r.onPush(s)
	// The view change itself is logged by onPush, with its cause.
	if viewChanged && !s.plugged {
		r.announce()
	}
	r.finishDrain(ctx, now, s)
	return r.wakeIn(now)
}

// refused handles a push the data plane did not take: the kernel keeps the
// previous tables, membership keeps advertising what they match and takes
// the node out of the eligible set.
func (r *reconciler) refused(now time.Time, s *Snap, err error) {
	r.failures.Add(1)
	r.healthy, r.failedAt = false, now
	r.backoff = min(max(2*r.backoff, minPushBackoff), maxPushBackoff)
	r.lastErr = err.Error()
	if now.Sub(r.lastLog) >= pushLogEvery {
		r.log.Error("update xdp tables; keeping the previous ones and leaving the eligible set",
			"err", err, "view", s.hb.View.Eligible, "retry_in", r.backoff, "failures_total", r.failures.Load(),
			"suppressed", r.suppressed)
		r.lastLog, r.suppressed = now, 0
	} else {
		r.suppressed++
	}
	r.out.Put(pushReport{snap: s, ok: false, healthy: false})
	r.publish()
}

// wakeIn is how long until the next retry or the end of a hold-down.
func (r *reconciler) wakeIn(now time.Time) time.Duration {
	d := time.Hour
	if !r.healthy {
		d = r.failedAt.Add(r.backoff).Sub(now)
	}
	if !r.stopAsked.IsZero() {
		d = min(d, r.stopAsked.Add(stopRetry).Sub(now))
	}
	if len(r.released) > 0 && !r.handUntil.IsZero() {
		d = min(d, r.handUntil.Sub(now))
	}
	if len(r.kept) > 0 || r.remapKeep {
		d = min(d, r.keepUntil.Sub(now))
	}
	if r.prev != nil && !r.prevUntil.IsZero() {
		d = min(d, r.prevUntil.Sub(now))
	}
	if r.fwd != nil && r.fwd.unresolved {
		d = min(d, r.pushedAt.Add(resolveEvery).Sub(now))
	}
	return d
}

// keepFor is how long after adopting a view a node keeps buckets for
// owners that do not advertise it yet: half the tolerance, longer than any
// owner takes to apply the view when it can (Raft's apply on a follower
// came up to about 100 ms after the leader's under load), short enough
// that an owner that cannot (a one-way fault) holds up nobody's
// convergence for long; past it the buckets are released as without
// keeping, and their SYNs dropped until the owner acquires.
func keepFor(s *Snap) time.Duration {
	return s.rs.Settings.HeartbeatPeriod * time.Duration(max(s.rs.Settings.HeartbeatTolerance/2, 1))
}

// handGrace is how many heartbeat periods SYNs are still handed over after
// this node's view converged: every member acquired by then (each does on
// its own convergence, a one-way delay from this node's).
const handGrace = 3

// handOver completes tables t (planned from accepting set accept) for the
// moments around a view change. Every bucket this node takes no SYN in
// that it took until the change is released; until the view converges,
// and handGrace periods more, a SYN there goes to the bucket's owner in the
// view (the XDP program's hand-over), instead of being dropped while that
// owner waits to acquire. And buckets the view gives this node that it
// does not accept yet take the packets of connections it holds (a
// handshake whose SYN was handed over here), as draining ones do.
//
// No SYN is taken twice: this node owned a bucket it released, so no other
// node held it meanwhile, and the only node that can acquire it while this
// node keeps this view is its owner in the view (acquisition waits for
// this node to advertise the view), which is where the SYNs go. A newer
// view hands over only what it releases itself (docs/ARCHITECTURE.md).
func (r *reconciler) handOver(now time.Time, s *Snap, t *filter.Tables, accept filter.Set) *hands {
	if r.neighbors == nil || s.plugged || s.admin == rules.AdminStopped || s.admin == rules.AdminSuspended {
		r.released, r.handUntil = nil, time.Time{}
		return nil
	}
	h := &hands{t: t, rs: s.rs, neighbors: r.neighbors}
	if !s.hb.View.Equal(r.handView) {
		// Only what this view change released: a bucket released before
		// may have been acquired since by its owner in that view, and
		// handing its SYNs to the owner in this one would give them two.
		r.released, r.handView, r.handUntil = nil, s.hb.View, time.Time{}
	}
	if last := r.last.tables; last != nil {
		same := sameFlows(last.Config, t.Config)
		for id, st := range last.States {
			nst := t.States[id]
			if !same(id) {
				continue // its bucket numbers mean other flows now
			}
			for b, v := range st {
				if v.TakesSYNs() && nst != nil && !nst[b].TakesSYNs() {
					if r.released == nil {
						r.released = filter.Set{}
					}
					r.released.Add(id, uint16(b))
				}
			}
		}
	}
	switch {
	case !s.hb.Converged:
		r.handUntil = time.Time{}
	case r.handUntil.IsZero():
		r.handUntil = now.Add(handGrace * s.rs.Settings.HeartbeatPeriod)
	case !now.Before(r.handUntil):
		r.released = nil
	}
	if len(r.released) == 0 && s.hb.Converged && r.prev == nil {
		return h
	}
	owners := r.assign.assign(s.fcfg, nodeIDs(s.hb.View.Eligible))
	h.owners = owners
	if !s.hb.Converged {
		for id, own := range owners.Rules {
			st := t.States[id]
			if st == nil {
				continue
			}
			for b, o := range own {
				// (Draining already where it may hold connections of its
				// own, as every bucket does after a rules change.)
				if o == r.self && !st[b].TakesSYNs() && !accept.Has(id, uint16(b)) {
					st[b] = filter.Draining
					handTo(t, id)[b] = filter.HandPending
				}
			}
		}
	}
	for id, m := range r.released {
		own, st := owners.Rules[id], t.States[id]
		if own == nil || st == nil {
			continue
		}
		for b := range filter.NumBuckets {
			o := own[b]
			if !m.Has(uint16(b)) || o == r.self || o == filter.NoNode || (st[b] != filter.NotOwned && st[b] != filter.Draining) {
				continue
			}
			if i := h.index(o); i != 0 {
				handTo(t, id)[b] = i
			}
		}
	}
	return h
}

// hands gives the nodes SYNs are handed over to their indexes in one set
// of tables' HandMACs, by their heartbeat addresses' MACs.
type hands struct {
	t         *filter.Tables
	rs        *rules.State
	owners    *filter.Owners // the owners of the view's buckets; nil: none computed
	neighbors func(netip.Addr) net.HardwareAddr
	byNode    map[filter.NodeID]uint8
}

// index returns node o's hand-over index, giving it the next free one; 0
// when its MAC is not known or the indexes ran out.
func (h *hands) index(o filter.NodeID) uint8 {
	if i, ok := h.byNode[o]; ok {
		return i
	}
	if h.byNode == nil {
		h.byNode = map[filter.NodeID]uint8{}
	}
	if len(h.byNode)+1 >= filter.HandKeep {
		return 0
	}
	mac := peerMAC(h.rs, o, h.neighbors)
	if mac == nil {
		h.byNode[o] = 0
		return 0
	}
	i := uint8(len(h.byNode) + 1)
	h.byNode[o] = i
	copy(h.t.HandMACs[i][:], mac)
	return i
}

// followPrev keeps r.prev: set to the kernel's tables when the rules
// change in a way that remaps flows, let go handGrace periods after the
// view of the new rules converged, and at once where nothing is handed
// over (no hand-overs here, a stop, a pulled plug, inherited tables).
//
// Every node that applies the change keeps judging the SYNs its previous
// tables took by them, so no SYN falls between the old mapping's owner,
// which lets go, and the new mapping's, which takes the bucket only once
// every member advertises the new rules and none keeps
// (docs/AGENT.md, "Rules that remap flows"). Prev is the tables in
// the kernel at the change, whatever they came from: their states are
// what this node took SYNs by, and another node took none of those flows
// by its own, at any time the first could have.
func (r *reconciler) followPrev(now time.Time, s *Snap) {
	last := r.last.tables
	if r.neighbors == nil || s.plugged || s.admin == rules.AdminStopped || s.admin == rules.AdminSuspended || s.hb.Inheriting || last == nil {
		r.prev, r.prevUntil = nil, time.Time{}
		return
	}
	if last.Config != s.fcfg {
		r.prev, r.prevUntil = nil, time.Time{}
		if len(s.fcfg.Remapped(last.Config)) > 0 {
			r.prev = last
		}
	}
	if r.prev == nil {
		return
	}
	switch {
	case !s.hb.Converged:
		r.prevUntil = time.Time{}
	case r.prevUntil.IsZero():
		r.prevUntil = now.Add(handGrace * s.rs.Settings.HeartbeatPeriod)
	case !now.Before(r.prevUntil):
		r.prev, r.prevUntil = nil, time.Time{}
	}
}

// keepRemapped completes tables t with the hand-over indexes of the rules
// Prev remaps (filter.Tables.Prev): per bucket, where a SYN the previous
// tables took goes. To this node while it is about to acquire the bucket
// (HandPending, from handOver); to its owner in the view once that owner
// advertises the view, and so holds the bucket pending; and until then
// (for keepFor at most) kept here (HandKeep), which the node advertises as
// keeping. It reports whether any bucket is kept.
func (r *reconciler) keepRemapped(now time.Time, s *Snap, t *filter.Tables, remapped map[filter.RuleID]bool, h *hands) bool {
	if len(remapped) == 0 || h == nil || h.owners == nil {
		return false
	}
	ready := readyPeers(s)
	keeps := now.Before(s.hb.AdoptedAt.Add(keepFor(s)))
	kept := false
	for id := range remapped {
		own, st := h.owners.Rules[id], t.States[id]
		if own == nil || st == nil {
			continue
		}
		for b, o := range own {
			if st[b].TakesSYNs() || o == r.self || o == filter.NoNode {
				continue
			}
			switch {
			case ready[o]:
				if i := h.index(o); i != 0 {
					handTo(t, id)[b] = i
				}
			case keeps:
				handTo(t, id)[b] = filter.HandKeep
				kept = true
			}
		}
	}
	return kept
}

// keeping returns the buckets the last tables took SYNs in that this view
// gives to a peer that does not advertise the view yet: its tables do not
// hold them pending, and a SYN handed over to it now would be dropped (a
// drained node applies its drain a Raft commit ahead of its peers, a
// leaving node adopts the view without it before they do). This node keeps
// taking their SYNs meanwhile, and says so (heartbeat.Message.Keeping), so
// that no node acquires before it lets them go; once their owners
// advertise the view it releases them and hands their SYNs over. Only
// where hand-overs run, and only buckets that still mean the same flows.
func (r *reconciler) keeping(now time.Time, s *Snap, accept filter.Set) filter.Set {
	last := r.last.tables
	r.keepUntil = s.hb.AdoptedAt.Add(keepFor(s))
	if last == nil || r.neighbors == nil || s.plugged || s.admin == rules.AdminStopped || s.admin == rules.AdminSuspended ||
		s.hb.Inheriting || !r.healthy || !now.Before(r.keepUntil) {
		return nil
	}
	same := sameFlows(last.Config, s.fcfg)
	ready := readyPeers(s)
	var owners *filter.Owners
	var keep filter.Set
	for id, st := range last.States {
		if !same(id) {
			continue // its bucket numbers mean other flows now
		}
		for b, v := range st {
			if !v.TakesSYNs() || accept.Has(id, uint16(b)) {
				continue
			}
			if owners == nil {
				owners = r.assign.assign(s.fcfg, nodeIDs(s.hb.View.Eligible))
			}
			own := owners.Rules[id]
			if own == nil {
				continue
			}
			if o := own[b]; o != r.self && o != filter.NoNode && !ready[o] {
				if keep == nil {
					keep = filter.Set{}
				}
				keep.Add(id, uint16(b))
			}
		}
	}
	return keep
}

// readyPeers returns, per peer, whether it is live and advertises this
// node's view: its tables then hold the buckets the view gives it pending,
// so a SYN handed over to it is taken.
func readyPeers(s *Snap) map[filter.NodeID]bool {
	ready := map[filter.NodeID]bool{}
	for _, p := range s.hb.Peers {
		ready[filter.NodeID(p.ID)] = p.Live && p.View.Equal(s.hb.View)
	}
	return ready
}

// sameFlows reports, for a rule of config from, whether its bucket numbers
// mean the same flows under config to.
func sameFlows(from, to *filter.Config) func(filter.RuleID) bool {
	if from == to {
		return func(filter.RuleID) bool { return true }
	}
	fm, tm := from.Mappings(), to.Mappings()
	return func(id filter.RuleID) bool { return fm[id].Within(tm[id]) }
}

// handTo returns t's hand-over indexes of rule id, made if missing.
func handTo(t *filter.Tables, id filter.RuleID) *[filter.NumBuckets]uint8 {
	if t.HandTo == nil {
		t.HandTo = map[filter.RuleID]*[filter.NumBuckets]uint8{}
	}
	h := t.HandTo[id]
	if h == nil {
		h = new([filter.NumBuckets]uint8)
		t.HandTo[id] = h
	}
	return h
}

// handCount counts the buckets whose SYNs t hands over.
func handCount(t *filter.Tables) int {
	n := 0
	for _, h := range t.HandTo {
		for _, i := range h {
			if i != 0 && i != filter.HandPending {
				n++
			}
		}
	}
	return n
}

// peerMAC returns node id's MAC from the neighbour table, by its heartbeat
// address, or nil.
func peerMAC(rs *rules.State, id filter.NodeID, neighbors func(netip.Addr) net.HardwareAddr) net.HardwareAddr {
	n := rs.Node(id)
	if n == nil {
		return nil
	}
	ap, err := netip.ParseAddrPort(n.HeartbeatAddr)
	if err != nil {
		return nil
	}
	if mac := neighbors(ap.Addr().Unmap()); len(mac) == 6 {
		return mac
	}
	return nil
}

func (r *reconciler) publish() {
	r.pub.Store(&dataSnap{tables: r.last.tables, tablesIndex: r.tablesIndex, tablesAt: r.tablesAt, conns: r.held.Conns,
		counted: !r.held.Guess, healthy: r.healthy, lastErr: r.lastErr})
}

// finishDrain stops a draining node once it holds no connections: a scan
// begun after the tables that drained it went in (so after the last SYN
// they let it answer) found none. It waits for its view (without it) to
// converge too: the stop is a rules change, which would make the members
// converge again, and the buckets they are acquiring wait for that.
func (r *reconciler) finishDrain(ctx context.Context, now time.Time, s *Snap) {
	n := s.rs.Node(r.self)
	if n == nil || n.Admin != rules.AdminDraining {
		r.stopAsked = time.Time{}
		return
	}
	// Not while hand-overs run either: a stopped node hands nothing over,
	// and its peers may still be pushing the tables that acquire.
	if !s.hb.Converged || len(r.released) > 0 || r.prev != nil || r.held.Guess || r.held.Conns > 0 || r.held.Cfg != s.fcfg ||
		(!r.stopAsked.IsZero() && now.Sub(r.stopAsked) < stopRetry) {
		return
	}
	r.stopAsked = now
	r.wg.Add(1)
	go func() {
		defer r.wg.Done()
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if err := r.finish(cctx); err != nil {
			r.log.Warn("drain finished but stop failed; will retry", "err", err)
			return
		}
		r.log.Info("drain finished: node stopped")
	}()
}

// kernel returns what the tables in the kernel were computed from; call it
// only once run has returned.
func (r *reconciler) kernel() kernelState {
	s := r.pushedSnap
	if s == nil {
		return kernelState{}
	}
	accept, dirty := s.hb.Accept.get(), peersDraining(s.fcfg, s.rs.Index, s.hb.Peers)
	if s.hb.Inheriting {
		accept, dirty = accept.Intersect(everything(s.fcfg)), union(dirty, s.inheritedDirty)
	}
	if s.plugged || s.admin == rules.AdminStopped || s.admin == rules.AdminSuspended {
		accept = filter.Grant{Buckets: filter.Set{}, Maps: accept.Maps}
	}
	return kernelState{ok: true, accept: accept, peersDraining: dirty, draining: r.last.draining, healthy: s.healthy}
}

// mayHold is every bucket this node may hold a connection in once tables
// that release buckets go in, until a scan made after them says: those
// the last result held and every one the last tables did not leave to
// others; under other rules, at start and when inheriting, any bucket.
func mayHold(cfg *filter.Config, last *filter.Tables, h track.Held, inheriting bool) filter.Set {
	if last == nil || inheriting || h.Cfg != cfg || last.Config != cfg {
		return everything(cfg).Buckets
	}
	out := union(h.Set, nil)
	for id, st := range last.States {
		if st == nil {
			continue
		}
		for b, v := range st {
			if v != filter.NotOwned {
				out.Add(id, uint16(b))
			}
		}
	}
	return out
}

// releases reports whether tables last accept (OWNED or OWNED_DIRTY) a
// bucket that accept leaves out.
func releases(last *filter.Tables, accept filter.Set) bool {
	for id, st := range last.States {
		if st == nil {
			continue
		}
		for b, v := range st {
			if v.TakesSYNs() && !accept.Has(id, uint16(b)) {
				return true
			}
		}
	}
	return false
}

// sameTables reports whether a and b judge every packet alike.
func sameTables(a, b *filter.Tables) bool {
	if a.Config != b.Config && !reflect.DeepEqual(a.Config, b.Config) {
		return false
	}
	if len(a.States) != len(b.States) {
		return false
	}
	for id, sa := range a.States {
		sb := b.States[id]
		if sb == nil || *sa != *sb {
			return false
		}
	}
	if a.HandMACs != b.HandMACs || a.Prev != b.Prev || a.Routed != b.Routed || a.Self != b.Self || a.MTU != b.MTU ||
		a.Peers != b.Peers || a.PeerMACs != b.PeerMACs || len(a.Forward) != len(b.Forward) {
		return false
	}
	for id, f := range a.Forward {
		if o := b.Forward[id]; o == nil || *o != *f {
			return false
		}
	}
	for _, pair := range [][2]*filter.Tables{{a, b}, {b, a}} {
		for id, h := range pair[0].HandTo {
			if o := pair[1].HandTo[id]; o == nil && *h != ([filter.NumBuckets]uint8{}) || o != nil && *o != *h {
				return false
			}
		}
	}
	return true
}

func (r *reconciler) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
