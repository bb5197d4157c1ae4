package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/shoalnet/shoal/agent/control"
	"github.com/urfave/cli/v2"
)

var jsonFlag = &cli.BoolFlag{Name: "json", Usage: "print JSON instead of text"}

var nodeFlag = &cli.StringFlag{Name: "node", Usage: "the node to act on (default: this node)"}

func isAgentDown(err error) bool { return errors.Is(err, control.ErrAgentDown) }

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// usageError reports bad arguments with the usage exit code.
func usageError(format string, a ...any) error {
	return cli.Exit(fmt.Sprintf(format, a...), exitUsage)
}

// oneArg returns the command's single argument or a usage error.
func oneArg(c *cli.Context, what string) (string, error) {
	if c.NArg() != 1 {
		return "", usageError("%s: want exactly one argument: %s", c.Command.Name, what)
	}
	return c.Args().First(), nil
}
