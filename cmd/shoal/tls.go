package main

import (
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"time"

	"github.com/urfave/cli/v2"

	"github.com/shoalnet/shoal/peer"
	"github.com/shoalnet/shoal/rules"
)

var tlsCommand = &cli.Command{
	Name:  "tls",
	Usage: "make an operator CA and node certificates",
	Description: "By default every node issues itself a certificate under a CA derived from the\n" +
		"cluster key, and nothing needs doing. With an operator CA instead, the CA's key\n" +
		"stays with the operator and each node gets a certificate for its own name, so a\n" +
		"node can only act as itself: set tls.ca_file, tls.cert_file and tls.key_file in\n" +
		"its config. See docs/SECURITY.md.",
	Subcommands: []*cli.Command{
		{
			Name:        "ca",
			Usage:       "operator CA",
			Description: "Manage the operator CA.",
			Subcommands: []*cli.Command{tlsCACreateCommand},
		},
		{
			Name:        "cert",
			Usage:       "node certificates",
			Description: "Issue node certificates under the operator CA.",
			Subcommands: []*cli.Command{tlsCertCreateCommand},
		},
	},
}

var tlsCACreateCommand = &cli.Command{
	Name:      "create",
	Usage:     "make a new operator CA",
	ArgsUsage: " ",
	Description: "Writes shoal-ca.pem (copy it to every node as tls.ca_file) and shoal-ca-key.pem\n" +
		"(mode 0600: keep it off the nodes) into --dir. Refuses to overwrite either.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "dir", Value: ".", Usage: "where to write the files"},
		&cli.IntFlag{Name: "days", Value: 5 * 365, Usage: "validity in days"},
	},
	Action: func(c *cli.Context) error {
		if c.NArg() != 0 {
			return usageError("tls ca create takes no arguments")
		}
		ca, err := peer.CreateCA("shoal operator CA", time.Duration(c.Int("days"))*24*time.Hour, time.Now())
		if err != nil {
			return err
		}
		key, err := peer.EncodeKeyPEM(ca.Key)
		if err != nil {
			return err
		}
		dir := c.String("dir")
		if err := writeNew(filepath.Join(dir, "shoal-ca-key.pem"), key, 0o600); err != nil {
			return err
		}
		if err := writeNew(filepath.Join(dir, "shoal-ca.pem"), peer.EncodeCertPEM(ca.Cert), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "wrote %s and %s\n", filepath.Join(dir, "shoal-ca.pem"), filepath.Join(dir, "shoal-ca-key.pem"))
		return nil
	},
}

var tlsCertCreateCommand = &cli.Command{
	Name:      "create",
	Usage:     "issue a node's certificate",
	ArgsUsage: "<node-name>",
	Description: "Writes NODE.pem and NODE-key.pem (mode 0600) into --dir, signed by the CA in\n" +
		"--ca and --ca-key. Copy both to the node and set tls.cert_file and tls.key_file.",
	Flags: []cli.Flag{
		&cli.StringFlag{Name: "dir", Value: ".", Usage: "where to write the files"},
		&cli.StringFlag{Name: "ca", Value: "shoal-ca.pem", Usage: "the CA certificate"},
		&cli.StringFlag{Name: "ca-key", Value: "shoal-ca-key.pem", Usage: "the CA's private key"},
		&cli.StringSliceFlag{Name: "ip", Usage: "an address of the node, for its certificate (repeatable)"},
		&cli.IntFlag{Name: "days", Value: 365, Usage: "validity in days"},
	},
	Action: func(c *cli.Context) error {
		name, err := oneArg(c, "<node-name>")
		if err != nil {
			return err
		}
		if err := rules.CheckNodeName(name); err != nil {
			return usageError("%v", err)
		}
		var ips []netip.Addr
		for _, s := range c.StringSlice("ip") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return usageError("--ip %q: %v", s, err)
			}
			ips = append(ips, a)
		}
		ca, err := peer.LoadCA(c.String("ca"), c.String("ca-key"))
		if err != nil {
			return err
		}
		cert, key, err := ca.Issue(name, ips, time.Duration(c.Int("days"))*24*time.Hour, time.Now())
		if err != nil {
			return err
		}
		kp, err := peer.EncodeKeyPEM(key)
		if err != nil {
			return err
		}
		dir := c.String("dir")
		if err := writeNew(filepath.Join(dir, name+"-key.pem"), kp, 0o600); err != nil {
			return err
		}
		if err := writeNew(filepath.Join(dir, name+".pem"), peer.EncodeCertPEM(cert), 0o644); err != nil {
			return err
		}
		fmt.Fprintf(c.App.Writer, "wrote %s and %s\n", filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem"))
		return nil
	},
}

// writeNew writes a file that must not exist yet.
func writeNew(path string, b []byte, mode os.FileMode) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return fmt.Errorf("%w (refusing to overwrite)", err)
	}
	if _, err := f.Write(b); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
