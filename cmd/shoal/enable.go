package main

import "github.com/urfave/cli/v2"

var enableCommand = &cli.Command{
	Name:        "enable",
	Usage:       "let a node handle a port rule's traffic again",
	ArgsUsage:   "<vip:port|rule-id|all>",
	Description: "Enables the rule on this node (or --node, or --all-nodes): the node takes its\nshare of the rule's traffic again once the cluster converges.",
	Flags:       ruleStateFlags,
	Action:      ruleStateAction("enabled"),
}
