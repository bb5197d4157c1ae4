package filter

import "errors"

// Capacities of the XDP program's tables (the same numbers are in
// xdp/shoal.c). (*XDP).Update refuses tables that exceed them with
// ErrCapacity; the rules layer checks them before it proposes a change.
const (
	MaxVIPs           = 64   // VIPs per cluster
	MaxRules          = 256  // port rules, DefaultRule not counted
	MaxHeartbeatPeers = 1024 // peers whose heartbeats the program lets through
	// FragEntries is how many datagrams' first-fragment verdicts the
	// program remembers (an LRU) for their later fragments.
	FragEntries = 16384
)

// ErrCapacity is returned when tables hold more VIPs or port rules than
// the XDP program has room for.
var ErrCapacity = errors.New("tables exceed the data plane's capacity")
