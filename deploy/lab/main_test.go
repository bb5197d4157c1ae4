package lab

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
	"testing"

	"github.com/shoalnet/shoal/deploy/lab/load"
)

// helperEnv makes the test binary act as the shoal binary's `lab serve` and
// `lab load`, so the topology test needs no build of cmd/shoal.
const helperEnv = "SHOAL_LAB_TEST_HELPER"

func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "1" {
		os.Exit(helper(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// helper runs `lab serve ...` or `lab load ...` with the flags the lab
// passes.
func helper(args []string) int {
	if len(args) < 2 || args[0] != "lab" {
		fmt.Fprintln(os.Stderr, "helper: want lab serve|load, got", args)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	fs := flag.NewFlagSet(args[1], flag.ContinueOnError)
	switch args[1] {
	case "serve":
		name := fs.String("name", "", "")
		var listen []string
		fs.Func("listen", "", func(s string) error { listen = append(listen, s); return nil })
		if fs.Parse(args[2:]) != nil {
			return 2
		}
		if err := Serve(ctx, *name, listen, slog.Default()); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "load":
		var o load.Options
		fs.StringVar(&o.URL, "url", "", "")
		fs.DurationVar(&o.Duration, "duration", 0, "")
		fs.IntVar(&o.Concurrency, "concurrency", 1, "")
		fs.BoolVar(&o.KeepAlive, "keepalive", false, "")
		fs.Float64Var(&o.Rate, "rate", 0, "")
		fs.DurationVar(&o.Timeout, "timeout", 0, "")
		fs.Bool("json", true, "")
		if fs.Parse(args[2:]) != nil {
			return 2
		}
		fmt.Fprintln(os.Stderr, LoadStarted)
		res, err := load.Run(ctx, o)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		json.NewEncoder(os.Stdout).Encode(res)
		return 0
	}
	return 2
}
