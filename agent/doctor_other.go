//go:build !linux

package agent

import (
	"errors"
	"net/netip"

	"github.com/shoalnet/shoal/rules"
)

// CheckNeighbour reads the neighbour table through netlink: Linux only.
func CheckNeighbour(vip netip.Addr, mode rules.MACMode) (DoctorCheck, error) {
	return DoctorCheck{}, errors.New("shoal doctor --neighbor reads the neighbour table through netlink: Linux only")
}
