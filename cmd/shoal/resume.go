package main

import "github.com/urfave/cli/v2"

var resumeCommand = &cli.Command{
	Name:        "resume",
	Usage:       "end a suspend (the node stays stopped until start)",
	Description: "Like NLB's resume: lifts a suspend so the node accepts admin changes again.\nThe node stays stopped; run start to take traffic.",
	Flags:       []cli.Flag{nodeFlag},
	Action:      adminAction("resume", "resumed (stopped; run start to take traffic)"),
}
