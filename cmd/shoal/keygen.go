package main

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"

	"github.com/urfave/cli/v2"
)

var keygenCommand = &cli.Command{
	Name:        "keygen",
	Usage:       "write a new random cluster key",
	ArgsUsage:   "<file>",
	Description: "Writes 32 random bytes as 64 hex characters, mode 0600. Copy the same file to\nevery node: it authenticates heartbeats and peer requests.",
	Action: func(c *cli.Context) error {
		path, err := oneArg(c, "<file>")
		if err != nil {
			return err
		}
		key := make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return err
		}
		f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return fmt.Errorf("keygen: %w (refusing to overwrite an existing key)", err)
		}
		if _, err := fmt.Fprintln(f, hex.EncodeToString(key)); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "wrote a new cluster key to %s\n", path)
		return nil
	},
}
