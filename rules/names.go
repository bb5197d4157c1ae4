package rules

import (
	"fmt"
	"strings"

	"github.com/shoalnet/shoal/peer"
)

// MaxNameLen bounds a node's name.
const MaxNameLen = peer.MaxNameLen

// checkNodeName accepts names of 1-64 letters, digits, '-', '_' and '.',
// starting with a letter or digit (peer.CheckName).
func checkNodeName(name string) error { return peer.CheckName(name) }

// CheckNodeName reports whether name can be a node's name, for config
// validation before an agent starts.
func CheckNodeName(name string) error { return checkNodeName(name) }

// CheckZone reports whether zone can label where a node is: empty (none),
// or up to 64 letters, digits and - _ . /.
func CheckZone(zone string) error {
	if len(zone) > 64 {
		return fmt.Errorf("%w: zone %q: longer than 64 bytes", ErrInvalid, zone)
	}
	for _, r := range zone {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./", r)) {
			return fmt.Errorf("%w: zone %q: only letters, digits and - _ . / are allowed", ErrInvalid, zone)
		}
	}
	return nil
}
