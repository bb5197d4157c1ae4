//go:build !linux

package agent

import (
	"context"
	"errors"
)

// Run runs the agent; the data plane (XDP), the ARP responder and the host
// setup exist on Linux only.
func Run(ctx context.Context, cfg *Config) error {
	return errors.New("shoal agent runs on Linux only (XDP, raw sockets, netlink)")
}
