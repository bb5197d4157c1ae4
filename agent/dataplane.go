package agent

import (
	"context"
	"log/slog"
	"net"
	"reflect"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// dataplane is what the agent needs of the XDP program.
type dataplane interface {
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
	dp       dataplane
	mac      func() net.HardwareAddr // the interface's MAC, which accepted frames get
	trk      *tracker
	wake     chan struct{}
	in       *mailbox[*memberSnap] // from membership
	out      *mailbox[pushReport]  // to membership
	announce func()                // gratuitous ARP after a view change
	onPush   func(s *memberSnap)
	finish   func(ctx context.Context) error
	now      func() time.Time

	failures atomic.Uint64 // table pushes the data plane refused
	pub      atomic.Pointer[dataSnap]

	// Owned by the goroutine.
	snap        *memberSnap
	held        held
	heldFresh   bool // held changed since the last push
	scannedView heartbeat.View
	polling     bool
	pushedGen   uint64
	pushedMAC   string
	pushedView  heartbeat.View
	pushedSnap  *memberSnap // the snapshot the kernel's tables came from
	epoch       uint64      // counts tables that released buckets; held is of the latest
	rescan      bool        // the tables of epoch need a scan once they are in
	last        plan
	tablesIndex uint64
	healthy     bool
	failedAt    time.Time
	backoff     time.Duration
	lastErr     string
	lastLog     time.Time
	suppressed  int
	stopAsked   time.Time
	wg          sync.WaitGroup
}

// dataSnap is what the reconciler publishes for the APIs; immutable.
type dataSnap struct {
	tables      *filter.Tables
	tablesIndex uint64
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

func newReconciler(self filter.NodeID, log *slog.Logger, dp dataplane, mac func() net.HardwareAddr, trk *tracker,
	in *mailbox[*memberSnap], out *mailbox[pushReport]) *reconciler {
	r := &reconciler{self: self, log: log, dp: dp, mac: mac, trk: trk, in: in, out: out, wake: make(chan struct{}, 1),
		announce: func() {}, onPush: func(*memberSnap) {}, finish: func(context.Context) error { return nil }, now: time.Now, healthy: true}
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
		case <-r.in.ready:
			r.snap = r.in.take()
		case <-r.trk.out.ready:
			// Only a scan begun after the latest tables that released
			// buckets went in has seen every handshake they let begin.
			if h := r.trk.out.take(); h.err == nil && r.snap != nil && h.cfg == r.snap.fcfg && h.epoch == r.epoch {
				r.heldFresh = !h.set.Equal(r.held.set) || h.conns != r.held.conns
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
	if s.gen == r.pushedGen && !r.heldFresh && !retry && string(mac) == r.pushedMAC {
		r.finishDrain(ctx, now, s)
		return r.wakeIn(now)
	}
	t0 := r.now()
	accept, dirty := s.hb.Accept.get(), peersDraining(s.fcfg, s.rs.Index, s.hb.Peers, s.hb.PeersDraining)
	if !s.hb.View.Equal(r.scannedView) {
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
		if r.last.tables == nil || s.hb.Inheriting || r.held.cfg != s.fcfg || releases(r.last.tables, accept.Buckets) {
			r.epoch++
			r.held = held{set: mayHold(s.fcfg, r.last.tables, r.held, s.hb.Inheriting), conns: r.held.conns,
				cfg: s.fcfg, epoch: r.epoch, guess: true}
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
	p := planTables(s.fcfg, r.self, admin, s.plugged, accept.Buckets, dirty, r.held.set)
	t2 := r.now()
	// Tables the kernel already holds need no push (a view that moves
	// nothing here, the same tables for the next snapshot): pushing them
	// again would only make the next push, the one that acquires, wait
	// for this one's flip to retire.
	same := r.healthy && r.last.tables != nil && string(mac) == r.pushedMAC && sameTables(p.tables, r.last.tables)
	if !same {
		if err := r.dp.Update(p.tables, mac); err != nil {
			r.refused(now, s, err)
			return r.wakeIn(now)
		}
	}
	if t3 := r.now(); r.log.Enabled(ctx, slog.LevelDebug) {
		r.log.Debug("tables pushed", "at", stamp(t3), "gen", s.gen, "view", s.hb.View.Eligible, "rules", s.hb.View.RulesIndex,
			"converged", s.hb.Converged, "skipped", same, "owned", stateCounts(p.tables, filter.Owned), "dirty", stateCounts(p.tables, filter.OwnedDirty),
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
	if poll := p.draining.Count() > 0; poll != r.polling || r.rescan {
		r.polling, r.rescan = poll, false
		r.trk.request(s.fcfg, poll, r.epoch)
	}
	r.out.put(pushReport{snap: s, ok: true, healthy: r.healthy,
		draining: toHeartbeat(p.draining), conns: r.held.conns})
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
func (r *reconciler) refused(now time.Time, s *memberSnap, err error) {
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
	r.out.put(pushReport{snap: s, ok: false, healthy: false})
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
	return d
}

func (r *reconciler) publish() {
	r.pub.Store(&dataSnap{tables: r.last.tables, tablesIndex: r.tablesIndex, conns: r.held.conns,
		counted: !r.held.guess, healthy: r.healthy, lastErr: r.lastErr})
}

// finishDrain stops a draining node once it holds no connections: a scan
// begun after the tables that drained it went in (so after the last SYN
// they let it answer) found none. It waits for its view (without it) to
// converge too: the stop is a rules change, which would make the members
// converge again, and the buckets they are acquiring wait for that.
func (r *reconciler) finishDrain(ctx context.Context, now time.Time, s *memberSnap) {
	n := s.rs.Node(r.self)
	if n == nil || n.Admin != rules.AdminDraining {
		r.stopAsked = time.Time{}
		return
	}
	if !s.hb.Converged || r.held.guess || r.held.conns > 0 || r.held.cfg != s.fcfg || (!r.stopAsked.IsZero() && now.Sub(r.stopAsked) < stopRetry) {
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
	accept, dirty := s.hb.Accept.get(), peersDraining(s.fcfg, s.rs.Index, s.hb.Peers, s.hb.PeersDraining)
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
func mayHold(cfg *filter.Config, last *filter.Tables, h held, inheriting bool) filter.Set {
	if last == nil || inheriting || h.cfg != cfg || last.Config != cfg {
		return everything(cfg).Buckets
	}
	out := union(h.set, nil)
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
			if (v == filter.Owned || v == filter.OwnedDirty) && !accept.Has(id, uint16(b)) {
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
	return true
}

func (r *reconciler) poke() {
	select {
	case r.wake <- struct{}{}:
	default:
	}
}
