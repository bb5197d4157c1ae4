//go:build !linux

package agent

import (
	"errors"
	"net/netip"

	"github.com/shoalnet/shoal/rules"
)

// CheckNeighbour reads the neighbour table through netlink: Linux only.
func CheckNeighbour(vip netip.Addr, mode rules.MACMode) (Check, error) {
	return Check{}, errors.New("shoal doctor --neighbor reads the neighbour table through netlink: Linux only")
}
