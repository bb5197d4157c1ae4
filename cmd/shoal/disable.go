package main

import "github.com/urfave/cli/v2"

var disableCommand = &cli.Command{
	Name:        "disable",
	Usage:       "stop a node handling a port rule's traffic at once",
	ArgsUsage:   "<vip:port|rule-id|all>",
	Description: "Disables the rule on this node (or --node, or --all-nodes): the node drops all of\nthe rule's packets, including those of its existing connections (use drain to let\nthem finish).",
	Flags:       ruleStateFlags,
	Action:      ruleStateAction("disabled"),
}
