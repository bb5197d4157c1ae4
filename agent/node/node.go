package node

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/shoalnet/shoal/agent/track"
	"github.com/shoalnet/shoal/filter"
	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// Node is an agent's running core: the membership, data-plane and tracking
// goroutines and the heartbeat receiver, wired one way (membership ->
// reconciler -> kernel, tracker -> reconciler, reconciler's reports ->
// membership) through mailboxes that never block the sender. Run builds it
// around the host; tests build it around fakes.
type Node struct {
	self filter.NodeID
	log  *slog.Logger
	link *heartbeat.Transport
	dp   Dataplane
	mem  *membership
	rec  *reconciler
	trk  *track.Tracker
}

// Config is what a node is made of.
type Config struct {
	Self        filter.NodeID
	Incarnation func() (uint64, error) // for every new machine (start, plug put back)
	Log         *slog.Logger
	Link        *heartbeat.Transport // the node closes it when it stops
	Rules       rulesSource
	Dataplane   Dataplane
	MAC         func() net.HardwareAddr // the interface's MAC, which accepted frames get
	Scan        func(vips []netip.Addr) ([]track.Conn, error)
	Health      func() bool           // the node's health; nil is always healthy
	OnRules     func(st *rules.State) // told of every rules state applied; must not block
	OnPush      func(s *Snap)         // told of every snapshot whose tables went in
	// RenewLease extends the data plane's lease on its owned buckets by d;
	// membership calls it with every heartbeat it sends.
	RenewLease func(d time.Duration) error
	Finish     func(ctx context.Context) error // propose this node stopped once a drain ends
	Announce   func()                          // gratuitous ARP after a view change
	// Neighbors returns the MAC the host knows for a neighbour's address
	// (nil: none), the peers' heartbeat addresses among them: released
	// buckets' SYNs are handed over to their new owners' MACs. Nil: no
	// hand-over.
	Neighbors func(netip.Addr) net.HardwareAddr
	// Forward turns routed mode's forwarding on (docs/ROUTED.md); nil:
	// in routed mode the node keeps whatever the routers send it.
	Forward *Forwarding
	Probe   probeCheck // asks a suspect's peer API if it is alive; nil: no probes
	// Inherit, after a restart, is what the previous agent's tables held:
	// the first machine starts from it (see restart.go).
	Inherit *Inheritance
}

func New(c Config) (*Node, error) {
	if c.Health == nil {
		c.Health = func() bool { return true }
	}
	mem := newMembership(c.Self, c.Incarnation, c.Log, c.Link, c.Rules, c.Health)
	if c.OnRules != nil {
		mem.onRules = c.OnRules
	}
	if c.RenewLease != nil {
		mem.renew = c.RenewLease
	}
	if c.Probe != nil {
		mem.probes = newProber(c.Probe)
		mem.probes.notify = mem.interrupt
	}
	if c.Link != nil {
		mem.in = c.Link
	}
	mem.inherit = c.Inherit
	if err := mem.start(mem.now()); err != nil {
		return nil, err
	}
	trk := track.New(c.Scan, c.Log)
	rec := newReconciler(c.Self, c.Log, c.Dataplane, c.MAC, trk, mem.toDP, mem.reports)
	rec.assign = mem.assigner
	if c.Finish != nil {
		rec.finish = c.Finish
	}
	if c.Announce != nil {
		rec.announce = c.Announce
	}
	if c.OnPush != nil {
		rec.onPush = c.OnPush
	}
	rec.neighbors = c.Neighbors
	if c.Forward != nil {
		rec.fwd = &forwarder{host: c.Forward}
	}
	return &Node{self: c.Self, log: c.Log, link: c.Link, dp: c.Dataplane, mem: mem, rec: rec, trk: trk}, nil
}

// run runs the node until ctx ends, then stops every goroutine, closes the
// heartbeat socket and waits for them. It returns the receiver's error.
func (n *Node) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	memErr := make(chan error, 1)
	wg.Go(func() { n.trk.Run(ctx) })
	wg.Go(func() { n.rec.run(ctx) })
	wg.Go(func() { memErr <- n.mem.run(ctx) })
	var err error
	select {
	case <-ctx.Done():
	case err = <-memErr:
		if err != nil {
			err = fmt.Errorf("heartbeat receiver: %w", err)
		}
	}
	cancel()
	n.link.Close()
	wg.Wait()
	return err
}

// handoff advertises that this node stops (once its tables accept nothing)
// and waits until every live peer advertises a view without it, or ctx ends.
// It reports whether the handoff completed.
func (n *Node) Handoff(ctx context.Context) bool {
	done, err := n.mem.handoff(ctx)
	if err != nil {
		return false
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// drained waits until a scan begun after the node's latest release finds
// no connection on it, or ctx ends; it returns the connections counted
// last.
func (n *Node) Drained(ctx context.Context) int {
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		ds := n.rec.pub.Load()
		if ds.counted && ds.conns == 0 {
			return 0
		}
		select {
		case <-ctx.Done():
			return ds.conns
		case <-tick.C:
		}
	}
}

// announceRestart announces a restart window and waits until every live
// peer has heard it, or ctx ends. It reports whether they all heard it.
func (n *Node) AnnounceRestart(ctx context.Context, window time.Duration) bool {
	done, err := n.mem.announceRestart(ctx, window)
	if err != nil {
		return false
	}
	select {
	case <-done:
		return true
	case <-ctx.Done():
		return false
	}
}

// poke tells the node something outside it changed (health, the link):
// membership re-reads the health, the reconciler the interface's MAC.
func (n *Node) Poke() {
	n.mem.poke()
	n.rec.poke()
}

// Snap returns the snapshot membership published last: what the tables and
// the APIs follow.
func (n *Node) Snap() *Snap { return n.mem.snap.Load() }

// Tables returns the tables in the kernel now (nil before the first push).
func (n *Node) Tables() *filter.Tables { return n.rec.pub.Load().tables }

// Held is what the tables in the kernel were computed from, for a restart
// record: the accepting set, the peers' draining buckets, this node's own
// draining buckets, and its health.
func (n *Node) Held() (accept filter.Grant, peersDraining, draining filter.Set, healthy bool) {
	st := n.rec.kernel()
	return st.accept, st.peersDraining, st.draining, st.healthy
}

// Period is the heartbeat period the machine runs with now.
func (n *Node) Period() time.Duration { return n.mem.machinePeriod() }

// SetPlug pulls (or puts back) the node's virtual plug: it stops (or
// resumes) heartbeats and probes as a pulled cable would.
func (n *Node) SetPlug(ctx context.Context, pulled bool) error { return n.mem.setPlug(ctx, pulled) }
