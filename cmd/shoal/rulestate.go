package main

import (
	"fmt"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

// ruleStateAction enables, disables or drains the rule named by the
// argument, on one node (NLB's per-host semantics) or cluster-wide.
func ruleStateAction(state string) cli.ActionFunc {
	return func(c *cli.Context) error {
		target, err := oneArg(c, "<vip:port|rule-id|all>")
		if err != nil {
			return err
		}
		req := control.RuleStateRequest{Target: target, State: state, Node: c.String("node"), AllNodes: c.Bool("all-nodes")}
		if req.AllNodes && req.Node != "" {
			return usageError("%s: --node and --all-nodes exclude each other", c.Command.Name)
		}
		if err := client(c).Do(c.Context, "POST", "/v1/rules/state", req, nil); err != nil {
			return err
		}
		where := nodeLabel(req.Node)
		if req.AllNodes {
			where = "every node"
		}
		fmt.Fprintf(c.App.Writer, "rule %s %s on %s\n", target, state, where)
		return nil
	}
}

var ruleStateFlags = []cli.Flag{
	nodeFlag,
	&cli.BoolFlag{Name: "all-nodes", Usage: "change the rule itself, for every node"},
}
