package lab

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// Run builds a lab, sends traffic, pulls the plug on the last node while
// traffic flows, measures the time until the survivors own every bucket
// again, sends traffic again and removes the lab (unless o.Keep), also when
// a step fails or ctx ends. The report is returned as far as it got.
func Run(ctx context.Context, o RunOptions) (rep *Report, err error) {
	if o.Duration == 0 {
		o.Duration = 3 * time.Second
	}
	if o.Concurrency == 0 {
		o.Concurrency = 8
	}
	if o.FailoverTimeout == 0 {
		o.FailoverTimeout = 10 * time.Second
	}
	l, err := Up(ctx, o.Options)
	if err != nil {
		return nil, err
	}
	rep = &Report{Lab: l.ID, Nodes: len(l.Nodes), Family: string(l.Family), VIP: l.VIP.String(), ClusterMAC: l.State.ClusterMAC(), FailoverMS: -1}
	others := l.VIPs()[1:] // the IPv6 VIP of a dual lab: the same traffic, at the same time
	for _, v := range others {
		rep.Also = append(rep.Also, VIPReport{VIP: v.String(), ClusterMAC: ClusterMAC(v)})
	}
	if o.Period > 0 {
		rep.Period = o.Period.String()
	}
	defer func() {
		rep.summarizeFailovers()
		if o.Keep && err == nil {
			rep.Kept = true
			return
		}
		if derr := l.Down(context.Background()); derr != nil {
			err = errors.Join(err, fmt.Errorf("lab down: %w", derr))
		}
	}()
	la := LoadArgs{Duration: o.Duration, Concurrency: o.Concurrency, Rate: o.Rate}

	l.progress(o.Progress, "traffic before the pull (%v, new connections)", o.Duration)
	if l.Router != nil {
		rep.ClusterMAC, rep.Mode = "", "routed"
		if rep.Before, _, err = l.loadEach(ctx, la, nil, o.Progress); err != nil {
			return rep, err
		}
		return rep, l.runRouted(ctx, o, rep)
	}
	if len(l.Served()) < len(l.Nodes) {
		rep.Served = len(l.Served())
	}
	// The buckets that moved as nodes joined drain first: until then a
	// packet of a connection that is gone is taken by no node.
	if err := l.WaitSettled(ctx, cmp.Or(o.ReadyTimeout, readyTimeout(len(l.Nodes)))); err != nil {
		return rep, fmt.Errorf("lab: buckets still draining before the traffic: %w", err)
	}
	var also []load.Result
	if err := l.checkPackets(ctx, rep, "before", func() error {
		rep.Before, also, err = l.loadEach(ctx, la, others, o.Progress)
		return err
	}); err != nil {
		return rep, err
	}
	if rep.ClientARP, err = l.Neighbor(ctx, l.VIP.String()); err != nil {
		return rep, err
	}
	for i, v := range others {
		rep.Also[i].Before = also[i]
		if rep.Also[i].ClientNeighbor, err = l.Neighbor(ctx, v.String()); err != nil {
			return rep, err
		}
	}

	st, err := l.Statuses(ctx, l.Nodes)
	if err != nil {
		return rep, fmt.Errorf("lab: status before the pull: %w", err)
	}
	rules := RuleIDs(st)
	rep.Balance = Balance(st[:len(l.Served())], rules)
	// The pulls take served nodes, from the last one back: a node at
	// weight 0 owns no bucket to cover.
	served := len(l.Served())
	victim := served - 1
	dead := st[victim].NodeID
	survivors := append(slices.Clone(l.Nodes[:victim]), l.Nodes[victim+1:]...)
	rep.Victim = l.Nodes[victim].Name

	// Traffic goes on through the pull: 1 s before it, then o.Duration.
	const lead = time.Second
	during := la
	during.Duration = lead + o.Duration
	type loadOut struct {
		res  load.Result
		also []load.Result
		err  error
	}
	done := make(chan loadOut, 1)
	l.progress(o.Progress, "traffic through the pull (%v); pulling %s after %v", during.Duration, rep.Victim, lead)
	started := make(chan struct{})
	during.OnStart = func() { close(started) }
	go func() {
		r, also, err := l.loadEach(ctx, during, others, o.Progress)
		done <- loadOut{r, also, err}
	}()
	select {
	case <-ctx.Done():
		return rep, ctx.Err()
	case out := <-done:
		if out.err == nil {
			out.err = fmt.Errorf("it never wrote %q", LoadStarted)
		}
		return rep, fmt.Errorf("lab: the load ended before it started: %w", out.err)
	case <-started:
	}
	loadStart := time.Now()
	select {
	case <-ctx.Done():
		return rep, ctx.Err()
	case <-time.After(lead):
	}
	pulled, err := l.PullAt(ctx, rep.Victim)
	if err != nil {
		return rep, err
	}
	rep.PullAtMS = ms(pulled.Sub(loadStart))
	failover, perr := l.waitCovered(ctx, survivors, rules, dead, pulled, o.FailoverTimeout)
	if perr == nil {
		rep.FailoverMS = ms(failover)
		rep.Failovers = append(rep.Failovers, rep.FailoverMS)
		l.progress(o.Progress, "every bucket owned again %.0f ms after the pull", rep.FailoverMS)
	}
	out := <-done
	rep.During = out.res
	for i := range out.also {
		rep.Also[i].During = out.also[i]
	}
	if !out.res.Start.IsZero() {
		// On the load's own clock, so it lines up with its timeline.
		rep.PullAtMS = ms(pulled.Sub(out.res.Start))
	}
	if out.err != nil {
		return rep, out.err
	}
	if perr != nil {
		return rep, perr
	}

	l.progress(o.Progress, "traffic after the failover (%v)", o.Duration)
	if err := l.checkPackets(ctx, rep, "after", func() error {
		rep.After, also, err = l.loadEach(ctx, la, others, o.Progress)
		return err
	}); err != nil {
		return rep, err
	}
	for i := range also {
		rep.Also[i].After = also[i]
	}

	// Further pulls, without traffic, each on the next node (the Raft
	// leader node1 included), for a failover distribution.
	for i := 1; i < o.Pulls; i++ {
		if err := l.Plug(ctx, l.Nodes[victim].Name); err != nil {
			return rep, err
		}
		victim = (victim + served - 1) % served
		if err := l.waitAllCovered(ctx, rules, o.ReadyTimeout); err != nil {
			return rep, fmt.Errorf("lab: after plugging back: %w", err)
		}
		st, err := l.Statuses(ctx, l.Nodes)
		if err != nil {
			return rep, err
		}
		dead := st[victim].NodeID
		survivors := append(slices.Clone(l.Nodes[:victim]), l.Nodes[victim+1:]...)
		pulled, err := l.PullAt(ctx, l.Nodes[victim].Name)
		if err != nil {
			return rep, err
		}
		d, err := l.waitCovered(ctx, survivors, rules, dead, pulled, o.FailoverTimeout)
		if err != nil {
			return rep, err
		}
		rep.Failovers = append(rep.Failovers, ms(d))
		l.progress(o.Progress, "pull %d/%d (%s): every bucket owned again after %.0f ms", i+1, o.Pulls, l.Nodes[victim].Name, ms(d))
	}
	return rep, nil
}

// checkPackets runs a phase of traffic without a change and, in an IPv4
// lab, records in rep.Packets[phase] what the client sent and the nodes
// took meanwhile.
func (l *Lab) checkPackets(ctx context.Context, rep *Report, phase string, traffic func() error) error {
	if l.Family != "" && l.Family != Family4 {
		return traffic()
	}
	from, err := l.packetMark(ctx)
	if err != nil {
		return err
	}
	if err := traffic(); err != nil {
		return err
	}
	p, err := l.packetsSince(ctx, from)
	if err != nil {
		return err
	}
	if rep.Packets == nil {
		rep.Packets = map[string]PacketCheck{}
	}
	rep.Packets[phase] = p
	return nil
}

// waitCovered polls the survivors until they cover every bucket without
// node dead, and returns the time from pulled until the tables that cover
// went in (CoveredSince). It polls as often as the lab's other waits
// (pollEvery), not faster: the time comes from the survivors' tables_at,
// not from the poll that saw it, and the asking is work for the agents
// while they fail over: a status request costs an agent about 0.45 ms of
// CPU (1,920 of them to an idle 32-node lab cost its agents 0.86 CPU-s),
// and every 20 ms that was dozens of rounds of 31 requests through a
// failover.
func (l *Lab) waitCovered(ctx context.Context, survivors []Host, rules []string, dead uint32, pulled time.Time, timeout time.Duration) (time.Duration, error) {
	var last error
	var since time.Time
	err := Poll(ctx, timeout, l.pollEvery(), func() error {
		asked := time.Now()
		st, err := l.Statuses(ctx, survivors)
		if err != nil {
			last = err
			return err
		}
		if last = Covered(st, rules, dead); last == nil {
			since = CoveredSince(st, time.Now())
			if since.Before(pulled) {
				// Tables from before the pull cannot have covered the
				// pulled node's buckets: a clock step; time the poll.
				since = asked
			}
		}
		return last
	})
	if err != nil {
		return 0, fmt.Errorf("lab: the survivors did not cover node %d's buckets: %w (last: %v)", dead, err, last)
	}
	return since.Sub(pulled), nil
}

// waitAllCovered waits until every node is converged on a view of them all
// and together they accept every bucket of every rule exactly once.
func (l *Lab) waitAllCovered(ctx context.Context, rules []string, timeout time.Duration) error {
	if timeout == 0 {
		timeout = 30 * time.Second
	}
	return Poll(ctx, timeout, 50*time.Millisecond, func() error {
		st, err := l.Statuses(ctx, l.Nodes)
		if err != nil {
			return err
		}
		if err := Ready(st, len(l.Nodes)); err != nil {
			return err
		}
		return CoverFull(st, rules)
	})
}

func (l *Lab) progress(w io.Writer, format string, a ...any) {
	if w != nil {
		fmt.Fprintf(w, "lab %s: %s\n", l.ID, fmt.Sprintf(format, a...))
	}
}

// loadEach runs a against the lab's VIP and, at the same time, the same
// load against each of others (only a's OnStart is called), and returns
// the results in that order.
func (l *Lab) loadEach(ctx context.Context, a LoadArgs, others []netip.Addr, progress io.Writer) (load.Result, []load.Result, error) {
	res := make([]load.Result, len(others))
	errs := make([]error, len(others))
	var wg sync.WaitGroup
	for i, v := range others {
		b := a
		b.URL, b.OnStart = URL(v), nil
		wg.Add(1)
		go func() {
			defer wg.Done()
			res[i], errs[i] = l.Load(ctx, b, progress)
		}()
	}
	r, err := l.Load(ctx, a, progress)
	wg.Wait()
	return r, res, errors.Join(append([]error{err}, errs...)...)
}

// Load runs the load generator in the client namespace against a.URL, by
// default the VIP on port 80 (new connections unless a.KeepAlive). Its progress lines go to
// progress.
func (l *Lab) Load(ctx context.Context, a LoadArgs, progress io.Writer) (load.Result, error) {
	url := a.URL
	if url == "" {
		url = URL(l.VIP)
	}
	args := []string{"netns", "exec", l.Client.Namespace, l.Binary, "lab", "load",
		"--url", url,
		"--duration", a.Duration.String(),
		"--concurrency", fmt.Sprint(a.Concurrency), "--json"}
	if a.KeepAlive {
		args = append(args, "--keepalive")
	}
	if a.Rate > 0 {
		args = append(args, "--rate", fmt.Sprint(a.Rate))
	}
	if a.Timeout > 0 {
		args = append(args, "--timeout", a.Timeout.String())
	}
	if a.Held > 0 {
		args = append(args, "--held", fmt.Sprint(a.Held))
	}
	cmd := exec.CommandContext(ctx, "ip", args...)
	var out, errb bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &errb
	if progress != nil {
		cmd.Stderr = io.MultiWriter(&errb, progress)
	}
	if a.OnStart != nil {
		cmd.Stderr = io.MultiWriter(cmd.Stderr, &lineWatch{line: LoadStarted, then: a.OnStart})
	}
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			return load.Result{}, fmt.Errorf("lab: load from the client: %w", ctx.Err())
		}
		return load.Result{}, fmt.Errorf("lab: load from the client: %w: %s", err, lastLines(errb.String(), 5))
	}
	var r load.Result
	if err := json.Unmarshal(out.Bytes(), &r); err != nil {
		return load.Result{}, fmt.Errorf("lab: load result: %w", err)
	}
	return r, nil
}

// lineWatch calls then once a line equal to line has been written.
type lineWatch struct {
	line string
	then func()
	buf  []byte
	done bool
}

func (w *lineWatch) Write(b []byte) (int, error) {
	if w.done {
		return len(b), nil
	}
	w.buf = append(w.buf, b...)
	for {
		i := bytes.IndexByte(w.buf, '\n')
		if i < 0 {
			break
		}
		if string(w.buf[:i]) == w.line {
			w.done, w.buf = true, nil
			w.then()
			break
		}
		w.buf = w.buf[i+1:]
	}
	return len(b), nil
}

// lastLines returns the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Neighbor returns the MAC the client's neighbour table holds for addr, ""
// if none.
func (l *Lab) Neighbor(ctx context.Context, addr string) (string, error) {
	out, err := ip(ctx, "-n", l.Client.Namespace, "neigh", "show", addr, "dev", Interface)
	if err != nil {
		return "", err
	}
	return parseNeigh(out), nil
}

// Pull cuts host off the switch: its port on the bridge goes down, which
// also drops the carrier of its own end, so nothing passes either way, as
// with a pulled cable. It uses netlink, with no process to start, so it
// takes effect within microseconds of the call.
func (l *Lab) Pull(ctx context.Context, host string) error {
	_, err := l.setPort(host, false)
	return err
}

// PullAt is Pull, and returns the moment just before the link went down:
// the start of a failover measurement.
func (l *Lab) PullAt(ctx context.Context, host string) (time.Time, error) {
	return l.setPort(host, false)
}

// Plug puts host back on the switch.
func (l *Lab) Plug(ctx context.Context, host string) error {
	_, err := l.setPort(host, true)
	return err
}

// setPort sets host's bridge port up or down through a netlink socket in
// the switch namespace and returns the time just before the change.
func (l *Lab) setPort(host string, up bool) (time.Time, error) {
	h, ok := l.HostByName(host)
	if !ok {
		return time.Time{}, fmt.Errorf("lab: no host %q", host)
	}
	ns, err := netns.GetFromName(l.Switch)
	if err != nil {
		return time.Time{}, fmt.Errorf("lab: switch namespace: %w", err)
	}
	defer ns.Close()
	nl, err := netlink.NewHandleAt(ns)
	if err != nil {
		return time.Time{}, fmt.Errorf("lab: netlink in %s: %w", l.Switch, err)
	}
	defer nl.Close()
	link, err := nl.LinkByName(h.BridgePort)
	if err != nil {
		return time.Time{}, fmt.Errorf("lab: %s: %w", h.BridgePort, err)
	}
	at := time.Now()
	if up {
		err = nl.LinkSetUp(link)
	} else {
		err = nl.LinkSetDown(link)
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("lab: set %s up=%v: %w", h.BridgePort, up, err)
	}
	return at, nil
}
