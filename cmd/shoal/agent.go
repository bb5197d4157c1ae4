package main

import (
	"log/slog"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent"
	"github.com/shoalnet/shoal/agent/config"
)

// agentSettings are the config fields a flag may override.
var agentSettings = (&config.Config{}).FieldNames()

var agentCommand = &cli.Command{
	Name:  "agent",
	Usage: "run the shoal agent on this node",
	Description: "Runs the node: puts the VIPs on lo, answers ARP with the cluster MAC, attaches\n" +
		"the XDP filter, heartbeats with its peers and replicates the rules. Settings come\n" +
		"from --config (YAML), then SHOAL_<SETTING> environment variables, then flags.\n" +
		"On SIGTERM or SIGINT it removes everything it set up.",
	Flags: append([]cli.Flag{
		&cli.StringFlag{Name: "config", Aliases: []string{"c"}, Usage: "YAML config file"},
		&cli.BoolFlag{Name: "check", Usage: "validate the configuration and exit"},
		logFormatFlag, logLevelFlag,
	}, settingFlags()...),
	Action: func(c *cli.Context) error {
		logger, err := newLogger(c.App.ErrWriter, c.String("log-format"), c.String("log-level"))
		if err != nil {
			return cli.Exit(err.Error(), exitUsage)
		}
		slog.SetDefault(logger)
		cfg, err := loadAgentConfig(c)
		if err != nil {
			return err
		}
		// A key reload (SIGHUP) rereads key_file and accept_key_files.
		cfg.Reread = func() (*config.Config, error) { return loadAgentConfig(c) }
		if c.Bool("check") {
			return nil
		}
		runtime.GOMAXPROCS(agentProcs(os.Getenv))
		ctx, stop := signal.NotifyContext(c.Context, syscall.SIGTERM, syscall.SIGINT)
		defer stop()
		return agent.Run(ctx, cfg)
	},
}

// agentProcs is how many threads may run the agent's Go code at once: one,
// unless GOMAXPROCS says otherwise. The agent's work is a stream of small
// wake-ups (a heartbeat, a probe, a Raft message), not parallel
// computation; with a second P idle, the runtime woke another thread to
// look for work at nearly every one of them. In a 32-node lab at rest one
// P cut the agents' CPU by a third (docs/BENCHMARKS-LOG.md, "Scaling,
// fourth step"), and it bounds what the agent takes from the node's own
// server to one core. The data plane runs in the kernel and is unaffected.
func agentProcs(getenv func(string) string) int {
	if v := getenv("GOMAXPROCS"); v != "" {
		return runtime.GOMAXPROCS(0) // the runtime has read it already
	}
	return 1
}

// loadAgentConfig reads the configuration: the file, then SHOAL_*
// variables, then flags; and validates it.
func loadAgentConfig(c *cli.Context) (*config.Config, error) {
	cfg, err := config.Load(c.String("config"))
	if err != nil {
		return nil, cli.Exit(err.Error(), exitUsage)
	}
	if err := cfg.ApplyEnv(os.Getenv); err != nil {
		return nil, cli.Exit(err.Error(), exitUsage)
	}
	for _, name := range agentSettings {
		if flag := flagName(name); c.IsSet(flag) {
			if err := cfg.Set(name, c.String(flag)); err != nil {
				return nil, cli.Exit(err.Error(), exitUsage)
			}
		}
	}
	if err := cfg.Validate(); err != nil {
		return nil, cli.Exit("invalid configuration:\n"+err.Error(), exitUsage)
	}
	return cfg, nil
}

func settingFlags() []cli.Flag {
	var flags []cli.Flag
	for _, name := range agentSettings {
		flags = append(flags, &cli.StringFlag{Name: flagName(name), Usage: "overrides " + name})
	}
	return flags
}

func flagName(setting string) string { return strings.ReplaceAll(setting, "_", "-") }
