package main

import (
	"fmt"
	"syscall"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/heartbeat"
)

var keyCommand = &cli.Command{
	Name:  "key",
	Usage: "cluster key ids, reload and rotation",
	Description: "A node signs with the key in key_file and also accepts the keys in\n" +
		"accept_key_files. Rotating without downtime: see `shoal key rotate --help`.",
	Subcommands: []*cli.Command{keyIDCommand, keyReloadCommand, keyRotateCommand},
}

var keyIDCommand = &cli.Command{
	Name:        "id",
	Usage:       "print the ids of key files",
	ArgsUsage:   "<key-file>...",
	Description: "Prints each key's id (the one heartbeats carry and the agent logs), to check\nwhich nodes hold which key.",
	Action: func(c *cli.Context) error {
		if c.NArg() == 0 {
			return usageError("key id: give one or more key files")
		}
		for _, f := range c.Args().Slice() {
			k, err := config.ReadKey(f)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.App.Writer, "%08x  %s\n", heartbeat.KeyID(k), f)
		}
		return nil
	},
}

var keyReloadCommand = &cli.Command{
	Name:      "reload",
	Usage:     "make the local agent reread its key files",
	ArgsUsage: " ",
	Description: "Sends SIGHUP to the agent behind the control socket (as systemctl reload\n" +
		"shoal does). The agent logs the key ids it then uses; a key file that does\n" +
		"not read leaves the keys in use unchanged.",
	Action: func(c *cli.Context) error {
		pid, err := agentPID(c.String("socket"))
		if err != nil {
			return cli.Exit(fmt.Sprintf("key reload: %v", err), exitAgentDown)
		}
		if err := syscall.Kill(pid, syscall.SIGHUP); err != nil {
			return fmt.Errorf("key reload: signal agent %d: %w", pid, err)
		}
		fmt.Fprintf(c.App.Writer, "asked agent %d to reload its keys; its log says which it uses\n", pid)
		return nil
	},
}

var keyRotateCommand = &cli.Command{
	Name:      "rotate",
	Usage:     "print the steps to rotate from one key to another",
	ArgsUsage: "<old-key-file> <new-key-file>",
	Description: "Rotating the cluster key without downtime takes three steps, each done on\n" +
		"every node before the next starts:\n" +
		"  1. copy the new key to every node, add it to accept_key_files, shoal key reload:\n" +
		"     every node accepts both keys (heartbeats, and TLS trusts both derived CAs);\n" +
		"  2. on every node: key_file = new, accept_key_files = [old], shoal key reload:\n" +
		"     nodes sign with the new key, which every node already accepts;\n" +
		"  3. on every node: remove the old key from accept_key_files, shoal key reload.\n" +
		"This command prints the steps with the two keys' ids and paths.",
	Action: func(c *cli.Context) error {
		if c.NArg() != 2 {
			return usageError("key rotate: give the old and the new key file")
		}
		oldF, newF := c.Args().Get(0), c.Args().Get(1)
		var ids [2]uint32
		for i, f := range []string{oldF, newF} {
			k, err := config.ReadKey(f)
			if err != nil {
				return err
			}
			ids[i] = heartbeat.KeyID(k)
		}
		if ids[0] == ids[1] {
			return usageError("key rotate: both files hold key %08x", ids[0])
		}
		w := c.App.Writer
		fmt.Fprintf(w, "rotate %08x (%s) -> %08x (%s); finish each step on every node first:\n", ids[0], oldF, ids[1], newF)
		fmt.Fprintf(w, "1. copy %s to every node; in its config:\n     key_file: %s\n     accept_key_files: [%s]\n   then: shoal key reload\n", newF, oldF, newF)
		fmt.Fprintf(w, "2. on every node:\n     key_file: %s\n     accept_key_files: [%s]\n   then: shoal key reload\n", newF, oldF)
		fmt.Fprintf(w, "3. on every node:\n     key_file: %s\n     accept_key_files: []\n   then: shoal key reload; delete %s\n", newF, oldF)
		fmt.Fprintf(w, "each reload logs \"cluster keys reloaded\" with the primary and accepted ids.\n")
		return nil
	},
}
