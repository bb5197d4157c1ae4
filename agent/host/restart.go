package host

import (
	"fmt"
	"time"

	"github.com/shoalnet/shoal/filter"
)

// RestartRecord is what an agent stopping for a restart leaves the next
// one, in the host record.
type RestartRecord struct {
	BootID string `json:"boot_id"` // the kernel's: pins and leases do not outlive a reboot
	PinDir string `json:"pin_dir"`
	// Pinned is the loader's state of the pinned data plane.
	Pinned *filter.Pinned `json:"pinned"`
	// LeaseEnd is when the data plane's lease ends: the peers' restart
	// windows end a period later.
	LeaseEnd time.Time `json:"lease_end"`
	// Accept is the accepting set in the tables, with the mappings it was
	// granted under; PeersDraining the buckets they mark dirty (other
	// nodes' connections); Draining this node's own held buckets.
	Accept        filter.Grant `json:"accept"`
	PeersDraining filter.Set   `json:"peers_draining,omitempty"`
	Draining      filter.Set   `json:"draining,omitempty"`
	// Healthy: the node's health as the stopping agent last saw it; the
	// next agent starts from it rather than from sick.
	Healthy bool `json:"healthy"`
}

func (r RestartRecord) String() string {
	return fmt.Sprintf("pinned in %s, lease until %s, %d buckets", r.PinDir, r.LeaseEnd.Format(time.RFC3339Nano), r.Accept.Buckets.Count())
}
