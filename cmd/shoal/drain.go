package main

import "github.com/urfave/cli/v2"

var drainCommand = &cli.Command{
	Name:        "drain",
	Usage:       "let a node finish a port rule's connections but take no new ones",
	ArgsUsage:   "<vip:port|rule-id|all>",
	Description: "Drains the rule on this node (or --node, or --all-nodes): new connections go to\nthe other nodes while existing ones finish here.",
	Flags:       ruleStateFlags,
	Action:      ruleStateAction("draining"),
}
