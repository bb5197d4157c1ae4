package drill

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
)

// LabOptions configure a drill in a lab built for it.
type LabOptions struct {
	Scenario Scenario
	Traffic  Traffic
	Lab      lab.Options // the lab to build
	// Node is the node the scenario acts on; the last node if empty.
	Node string
	// Weight is what the weight scenario sets the node's weight on the
	// VIP's port rule to (0-100 or "equal"); 0 if empty.
	Weight        string
	SettleTimeout time.Duration // DefaultSettleTimeout if zero
	Progress      io.Writer     // live progress lines; none if nil
}

// RunLab builds a lab, sends traffic from its client to the VIP, applies
// the scenario to one node after o.Traffic.Lead, measures how long the
// cluster takes to settle, and removes the lab, also on failure. plug sets
// the node's switch port down; kill sends SIGKILL to its agent; drainstop
// drains it; join starts it after it was stopped before the traffic;
// weight sets its weight on the port rule.
func RunLab(ctx context.Context, o LabOptions) (rep *Report, err error) {
	if err := o.Traffic.defaults(); err != nil {
		return nil, err
	}
	if o.SettleTimeout == 0 {
		o.SettleTimeout = DefaultSettleTimeout
	}
	if o.Weight == "" {
		o.Weight = "0"
	}
	if o.Lab.Nodes == 0 {
		o.Lab.Nodes = 3
	}
	if o.Lab.Nodes < 2 && o.Scenario != Weight {
		return nil, fmt.Errorf("drill: %s needs at least 2 nodes", o.Scenario)
	}
	progress(o.Progress, "building a %d-node lab", o.Lab.Nodes)
	l, err := lab.Up(ctx, o.Lab)
	if err != nil {
		return nil, err
	}
	defer func() {
		if derr := l.Down(context.Background()); derr != nil {
			err = errors.Join(err, fmt.Errorf("lab down: %w", derr))
		}
	}()
	d := &labDrill{l: l, o: o, ctl: lab.Ctl{Binary: l.Binary}}
	return d.run(ctx)
}

type labDrill struct {
	l      *lab.Lab
	o      LabOptions
	ctl    lab.Ctl
	victim lab.Host
	other  lab.Host // a node that stays: the CLI talks to its agent
	rules  []string
}

func (d *labDrill) run(ctx context.Context) (*Report, error) {
	l, o := d.l, d.o
	if o.Node == "" {
		o.Node = l.Nodes[len(l.Nodes)-1].Name
	}
	var ok bool
	if d.victim, ok = l.HostByName(o.Node); !ok || d.victim.Name == l.Client.Name {
		return nil, fmt.Errorf("drill: no node %q in the lab", o.Node)
	}
	d.other = l.Nodes[0]
	if d.other.Name == d.victim.Name && len(l.Nodes) > 1 {
		d.other = l.Nodes[1]
	}
	agents := map[string]*agentAPI{}
	var names []string
	for _, n := range l.Nodes {
		agents[n.Name] = newAgentAPI(n.Socket)
		names = append(names, n.Name)
	}
	q, err := agents[d.other.Name].query(ctx)
	if err != nil {
		return nil, err
	}
	st, err := l.Statuses(ctx, l.Nodes)
	if err != nil {
		return nil, err
	}
	d.rules = lab.RuleIDs(st)
	victimID := st[slices.IndexFunc(l.Nodes, func(h lab.Host) bool { return h.Name == d.victim.Name })].NodeID

	if o.Scenario == Join {
		progress(o.Progress, "stopping %s before the traffic, for the join", d.victim.Name)
		if _, err := d.ctl.Run(ctx, d.other.Socket, "stop", "--node", d.victim.Name); err != nil {
			return nil, err
		}
		if _, err := waitSettled(ctx, time.Now(), o.SettleTimeout, func() error {
			return d.without(ctx, victimID)
		}); err != nil {
			return nil, fmt.Errorf("drill: the lab did not settle with %s stopped: %w", d.victim.Name, err)
		}
	}

	smp := startSampler(ctx, agents, 100*time.Millisecond)
	type loadOut struct {
		res load.Result
		err error
	}
	done := make(chan loadOut, 1)
	launched := make(chan struct{})
	var once sync.Once
	go func() {
		r, err := l.Load(ctx, lab.LoadArgs{
			Duration: o.Traffic.Duration, Concurrency: o.Traffic.Concurrency, Rate: o.Traffic.Rate,
			KeepAlive: o.Traffic.KeepAlive, Timeout: o.Traffic.Timeout, Held: o.Traffic.Held,
			OnStart: func() { once.Do(func() { close(launched) }) },
		}, o.Progress)
		done <- loadOut{r, err}
	}()
	var settled time.Duration
	event, settleErr := func() (time.Time, error) {
		// The load generator starts in the client's namespace after a
		// while that depends on the machine's load: count the lead from
		// when it says it started, or else from the first VIP packets the
		// agents accept.
		var started time.Time
		select {
		case <-launched:
			started = time.Now()
		case <-time.After(10 * time.Second):
			started = trafficStarted(ctx, agents, 5*time.Second)
		}
		select {
		case <-ctx.Done():
			return time.Time{}, ctx.Err()
		case <-time.After(time.Until(started.Add(o.Traffic.Lead))):
		}
		event := time.Now()
		progress(o.Progress, "%s %s", o.Scenario.verb(), d.victim.Name)
		check, err := d.act(ctx, victimID)
		if err != nil {
			return event, err
		}
		settled, err = waitSettled(ctx, event, o.SettleTimeout, check)
		if err == nil {
			progress(o.Progress, "settled %.0f ms after the event", ms(settled))
		}
		return event, err
	}()
	out := <-done
	rep, err := finish(out.res, out.err, smp.Stop(), q, o.Traffic, event, settled, settleErr)
	if rep != nil {
		rep.Scenario, rep.Target, rep.Node, rep.Nodes = o.Scenario, fmt.Sprintf("lab %s (%d nodes)", l.ID, len(l.Nodes)), d.victim.Name, names
		rep.URL = lab.URL(l.VIP)
		rep.Settled = settledWhat(o.Scenario, "every node converged", true)
	}
	return rep, err
}

// act applies the scenario and returns the check that passes once the
// cluster has settled after it.
func (d *labDrill) act(ctx context.Context, victimID uint32) (func() error, error) {
	l, name := d.l, d.victim.Name
	switch d.o.Scenario {
	case Plug:
		if err := l.Pull(ctx, name); err != nil {
			return nil, err
		}
		return func() error { return d.without(ctx, victimID) }, nil
	case Kill, SIGTERM:
		sig := syscall.SIGKILL
		if d.o.Scenario == SIGTERM {
			sig = syscall.SIGTERM
		}
		if _, err := d.signal(sig); err != nil {
			return nil, err
		}
		return func() error { return d.without(ctx, victimID) }, nil
	case Restart:
		if _, err := d.ctl.Run(ctx, d.victim.Socket, "restart"); err != nil {
			return nil, err
		}
		p, err := d.signal(syscall.SIGTERM)
		if err != nil {
			return nil, err
		}
		select {
		case <-l.Exited(p):
		case <-time.After(15 * time.Second):
			return nil, fmt.Errorf("drill: %s's agent (pid %d) did not exit within 15 s of SIGTERM", name, p.PID)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if _, err := l.Start(name, "agent", "agent", "--config", d.victim.Config); err != nil {
			return nil, fmt.Errorf("drill: start %s's agent again: %w", name, err)
		}
		return func() error { return d.all(ctx, 0, victimID) }, nil
	case Rule:
		rule := netip.AddrPortFrom(l.VIP, lab.HTTPPort).String()
		if _, err := d.ctl.Run(ctx, d.victim.Socket, "rules", "set", "--ports", fmt.Sprintf("%d-%d", lab.HTTPPort, lab.HTTPPort+1), rule); err != nil {
			return nil, err
		}
		st, err := d.ctl.Status(ctx, d.other.Socket)
		if err != nil {
			return nil, err
		}
		return func() error { return d.all(ctx, st.RulesIndex, 0) }, nil
	case Drainstop:
		if _, err := d.ctl.Run(ctx, d.other.Socket, "drainstop", "--node", name, "--no-wait"); err != nil {
			return nil, err
		}
		return func() error { return d.without(ctx, victimID) }, nil
	case Join:
		if _, err := d.ctl.Run(ctx, d.other.Socket, "start", "--node", name); err != nil {
			return nil, err
		}
		return func() error { return d.all(ctx, 0, victimID) }, nil
	case Rehash:
		if l.Router == nil {
			return nil, errors.New("drill: rehash needs a routed lab (--mac-mode routed)")
		}
		if err := l.SetNextHop(ctx, d.victim.Addr, true); err != nil {
			return nil, err
		}
		back := false
		return func() error {
			if !back {
				if err := d.nextHops(ctx, func(a netip.Addr) bool { return a != d.victim.Addr }); err != nil {
					return err
				}
				if err := l.SetNextHop(ctx, d.victim.Addr, false); err != nil {
					return err
				}
				back = true
			}
			return d.nextHops(ctx, func(netip.Addr) bool { return true })
		}, nil
	case Weight:
		rule := netip.AddrPortFrom(l.VIP, lab.HTTPPort).String()
		if _, err := d.ctl.Run(ctx, d.other.Socket, "weight", "set", rule, name, d.o.Weight); err != nil {
			return nil, err
		}
		st, err := d.ctl.Status(ctx, d.other.Socket)
		if err != nil {
			return nil, err
		}
		return func() error { return d.all(ctx, st.RulesIndex, 0) }, nil
	}
	return nil, fmt.Errorf("drill: unknown scenario %q", d.o.Scenario)
}

// signal sends sig to the victim's newest agent process (a join may have
// restarted it) and returns that process.
func (d *labDrill) signal(sig syscall.Signal) (lab.Proc, error) {
	name := d.victim.Name
	p, ok := d.l.Newest(name, "agent")
	if !ok {
		return p, fmt.Errorf("drill: no agent process of %s", name)
	}
	if err := syscall.Kill(p.PID, sig); err != nil {
		return p, fmt.Errorf("drill: signal %s's agent (pid %d, %v): %w", name, p.PID, sig, err)
	}
	return p, nil
}

// without passes when every node but the victim has converged on a view
// without it and together they accept every bucket.
func (d *labDrill) without(ctx context.Context, victimID uint32) error {
	if d.l.Router != nil {
		// Routed mode: settled once the router's route no longer has the
		// victim (without forwarding every node keeps what the router
		// sends it); with forwarding, once the others also own every
		// bucket, and a draining victim keeps its route until drained.
		if d.l.NoForward || d.o.Scenario != Drainstop {
			if err := d.nextHops(ctx, func(a netip.Addr) bool { return a != d.victim.Addr }); err != nil || d.l.NoForward {
				return err
			}
		}
	}
	var rest []lab.Host
	for _, n := range d.l.Nodes {
		if n.Name != d.victim.Name {
			rest = append(rest, n)
		}
	}
	st, err := d.l.Statuses(ctx, rest)
	if err != nil {
		return err
	}
	return lab.Covered(st, d.rules, victimID)
}

// all passes when every node has converged on one view of them all at
// rules index >= minIndex and together they accept every bucket exactly
// once; with mustAccept, that node accepts some.
func (d *labDrill) all(ctx context.Context, minIndex uint64, mustAccept uint32) error {
	st, err := d.l.Statuses(ctx, d.l.Nodes)
	if err != nil {
		return err
	}
	if err := lab.RulesAt(st, minIndex); err != nil {
		return err
	}
	if d.l.Router != nil {
		if err := d.nextHops(ctx, func(netip.Addr) bool { return true }); err != nil || d.l.NoForward {
			return err
		}
	}
	if err := lab.Ready(st, len(d.l.Nodes)); err != nil {
		return err
	}
	if err := lab.CoverFull(st, d.rules); err != nil {
		return err
	}
	if mustAccept != 0 {
		for _, s := range st {
			if s.NodeID == mustAccept {
				var n int
				for _, c := range s.Accepting {
					n += c
				}
				if n == 0 {
					return fmt.Errorf("%s accepts no bucket yet", s.NodeName)
				}
			}
		}
	}
	return nil
}

// trafficStarted polls the agents' accepted-packet counters every 20 ms and
// returns when their sum first grows, or now after timeout.
func trafficStarted(ctx context.Context, agents map[string]*agentAPI, timeout time.Duration) time.Time {
	sum := func() uint64 {
		var n uint64
		for _, a := range agents {
			if v, err := a.accepted(ctx); err == nil {
				n += v
			}
		}
		return n
	}
	base := sum()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) && ctx.Err() == nil {
		if sum() > base {
			return time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Now()
}

// nextHops passes when the lab router's route to the VIP has exactly the
// nodes keep says, as next hops.
func (d *labDrill) nextHops(ctx context.Context, keep func(netip.Addr) bool) error {
	want := slices.DeleteFunc(d.l.NodeAddrs(), func(a netip.Addr) bool { return !keep(a) })
	hops, err := d.l.NextHops(ctx, d.l.VIP)
	if err != nil {
		return err
	}
	if !slices.Equal(hops, want) {
		return fmt.Errorf("the router's next hops are %v, want %v", hops, want)
	}
	return nil
}
