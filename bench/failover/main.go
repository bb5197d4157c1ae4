//go:build linux

package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
	"github.com/shoalnet/shoal/deploy/lab/load"
)

// Result is what one run measured.
type Result struct {
	Nodes              int       `json:"nodes"`
	HeartbeatPeriod    string    `json:"heartbeat_period"`
	HeartbeatTolerance int       `json:"heartbeat_tolerance"`
	CyclesMS           []float64 `json:"cycles_ms"`
	P50MS              float64   `json:"p50_ms"`
	P99MS              float64   `json:"p99_ms"`
	MaxMS              float64   `json:"max_ms"`
	MeanMS             float64   `json:"mean_ms"`
}

func main() {
	binary := flag.String("binary", "bin/shoal", "the shoal binary the lab runs")
	cycles := flag.Int("cycles", 20, "plug pulls")
	nodes := flag.Int("nodes", 3, "lab nodes")
	period := flag.Duration("period", 0, "heartbeat period (0: the agent's default)")
	asJSON := flag.Bool("json", false, "print the result as JSON")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	res, err := run(ctx, *binary, *nodes, *cycles, *period)
	if err != nil {
		fmt.Fprintln(os.Stderr, "failover:", err)
		os.Exit(1)
	}
	if *asJSON {
		json.NewEncoder(os.Stdout).Encode(res)
		return
	}
	fmt.Printf("%d nodes, heartbeat %s x %d, %d plug pulls: failover p50 %.0f ms, p99 %.0f ms, max %.0f ms, mean %.0f ms\n",
		res.Nodes, res.HeartbeatPeriod, res.HeartbeatTolerance, len(res.CyclesMS), res.P50MS, res.P99MS, res.MaxMS, res.MeanMS)
}

func run(ctx context.Context, binary string, nodes, cycles int, period time.Duration) (res Result, err error) {
	bin, err := absPath(binary)
	if err != nil {
		return res, err
	}
	l, err := lab.Up(ctx, lab.Options{Nodes: nodes, Binary: bin, Period: period})
	if err != nil {
		return res, err
	}
	defer func() {
		if derr := l.Down(context.Background()); derr != nil && err == nil {
			err = derr
		}
	}()
	ctl := lab.Ctl{Binary: bin}
	out, err := ctl.Run(ctx, l.Nodes[0].Socket, "query", "--json")
	if err != nil {
		return res, err
	}
	var q struct {
		Settings struct {
			HeartbeatPeriod    string `json:"heartbeat_period"`
			HeartbeatTolerance int    `json:"heartbeat_tolerance"`
		} `json:"settings"`
	}
	if err := json.Unmarshal(out, &q); err != nil {
		return res, fmt.Errorf("query --json: %w", err)
	}
	res.Nodes, res.HeartbeatPeriod, res.HeartbeatTolerance = nodes, q.Settings.HeartbeatPeriod, q.Settings.HeartbeatTolerance
	st, err := l.Statuses(ctx, l.Nodes)
	if err != nil {
		return res, err
	}
	rules := lab.RuleIDs(st)
	victim := l.Nodes[len(l.Nodes)-1]
	dead := st[len(st)-1].NodeID
	survivors := l.Nodes[:len(l.Nodes)-1]
	var took []time.Duration
	for i := range cycles {
		if err := l.Pull(ctx, victim.Name); err != nil {
			return res, err
		}
		pulled := time.Now()
		if err := lab.Poll(ctx, 15*time.Second, 20*time.Millisecond, func() error {
			st, err := l.Statuses(ctx, survivors)
			if err != nil {
				return err
			}
			return lab.Covered(st, rules, dead)
		}); err != nil {
			return res, fmt.Errorf("cycle %d: survivors did not take over: %w", i+1, err)
		}
		d := time.Since(pulled)
		took = append(took, d)
		res.CyclesMS = append(res.CyclesMS, ms(d))
		fmt.Fprintf(os.Stderr, "cycle %2d: every bucket owned again %4.0f ms after the pull\n", i+1, ms(d))
		if err := l.Plug(ctx, victim.Name); err != nil {
			return res, err
		}
		if err := lab.Poll(ctx, 30*time.Second, 20*time.Millisecond, func() error {
			st, err := l.Statuses(ctx, l.Nodes)
			if err != nil {
				return err
			}
			if err := lab.Ready(st, len(l.Nodes)); err != nil {
				return err
			}
			return lab.CoverFull(st, rules)
		}); err != nil {
			return res, fmt.Errorf("cycle %d: cluster did not re-converge after the plug went back: %w", i+1, err)
		}
	}
	var sum float64
	for _, v := range res.CyclesMS {
		sum += v
		res.MaxMS = max(res.MaxMS, v)
	}
	res.MeanMS = sum / float64(len(res.CyclesMS))
	res.P50MS = ms(load.Percentile(took, 50))
	res.P99MS = ms(load.Percentile(took, 99))
	return res, nil
}

func absPath(p string) (string, error) {
	if _, err := os.Stat(p); err != nil {
		return "", fmt.Errorf("shoal binary: %w (build it with make build)", err)
	}
	if p[0] == '/' {
		return p, nil
	}
	wd, err := os.Getwd()
	if err != nil {
		return "", err
	}
	return wd + "/" + p, nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
