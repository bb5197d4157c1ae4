package main

import (
	"context"
	"fmt"
	"time"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var drainstopCommand = &cli.Command{
	Name:  "drainstop",
	Usage: "finish a node's connections, then stop it",
	Description: "The node takes no new connections while its existing ones finish on it; when\n" +
		"none are left it stops. The command waits, printing progress, until the node is\n" +
		"stopped. With --timeout, a node still draining then is stopped (its remaining\n" +
		"connections are cut) and the command exits with code 4.",
	Flags: []cli.Flag{
		nodeFlag,
		&cli.DurationFlag{Name: "timeout", Usage: "stop the node anyway after this long (0 = wait forever)"},
		&cli.BoolFlag{Name: "no-wait", Usage: "return once draining has begun"},
	},
	Action: func(c *cli.Context) error {
		if c.NArg() > 0 {
			return usageError("drainstop takes no arguments; use --node NAME for another node")
		}
		cl := client(c)
		node := c.String("node")
		if err := cl.Do(c.Context, "POST", "/v1/admin", control.AdminRequest{Node: node, State: "draining"}, nil); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "%s: draining\n", nodeLabel(node))
		if c.Bool("no-wait") {
			return nil
		}
		return waitDrained(c.Context, cl, c, node, c.Duration("timeout"))
	},
}

// applyGrace bounds how long waitDrained waits for the node asked to apply
// the drain it was just told of.
const applyGrace = 5 * time.Second

// waitDrained polls until the node is stopped or the timeout passes.
func waitDrained(ctx context.Context, cl *control.Client, c *cli.Context, node string, timeout time.Duration) error {
	start := time.Now()
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
	lastPrint := time.Time{}
	drained := false
	var stoppedAt time.Time
	for {
		p, err := drainProgress(ctx, cl, node)
		if err != nil {
			return err
		}
		admin, conns := p.admin, p.conns
		if admin == "stopped" {
			// The node asked has applied the stop; the node drained may
			// not have yet (a heartbeat or two later): wait for it to,
			// so that what it says of itself agrees once this returns.
			if stoppedAt.IsZero() {
				stoppedAt = time.Now()
			}
			if p.applied || time.Since(stoppedAt) >= applyGrace {
				fmt.Fprintf(c.App.Writer, "%s: stopped after %s\n", nodeLabel(node), time.Since(start).Round(time.Millisecond))
				return nil
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-tick.C:
			}
			continue
		}
		// Reads are local: the node asked may not have applied the drain
		// yet, so a state from before it is not yet an answer.
		if admin == "draining" {
			drained = true
		} else if drained || time.Since(start) >= applyGrace {
			return fmt.Errorf("%s left draining: it is now %s", nodeLabel(node), admin)
		}
		if time.Since(lastPrint) >= time.Second {
			if conns >= 0 {
				fmt.Fprintf(c.App.Writer, "  %s: %d connections left\n", time.Since(start).Round(time.Second), conns)
			} else {
				fmt.Fprintf(c.App.Writer, "  %s: still draining\n", time.Since(start).Round(time.Second))
			}
			lastPrint = time.Now()
		}
		if timeout > 0 && time.Since(start) >= timeout {
			if err := cl.Do(ctx, "POST", "/v1/admin", control.AdminRequest{Node: node, State: "stopped"}, nil); err != nil {
				return err
			}
			return cli.Exit(fmt.Sprintf("%s: still draining after %s; stopped it (%d connections cut)", nodeLabel(node), timeout, max(conns, 0)), exitTimeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// progress is a drained node's state as the node asked sees it.
type progress struct {
	admin string
	conns int // connections it still holds; -1 when unknown (another node)
	// applied: the drained node itself has applied the rules the node
	// asked holds (or cannot be heard, so cannot be waited for).
	applied bool
}

func drainProgress(ctx context.Context, cl *control.Client, node string) (progress, error) {
	st, err := cl.Status(ctx)
	if err != nil {
		return progress{}, err
	}
	if node == "" || node == st.NodeName {
		return progress{admin: st.Admin, conns: st.Connections, applied: true}, nil
	}
	q, err := cl.Query(ctx)
	if err != nil {
		return progress{}, err
	}
	for _, n := range q.Nodes {
		if n.Name == node {
			return progress{admin: n.Admin, conns: -1, applied: !n.Live || n.RulesIndex >= q.RulesIndex}, nil
		}
	}
	return progress{}, fmt.Errorf("node %s is not registered", node)
}
