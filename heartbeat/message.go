package heartbeat

// Message is one heartbeat: what a node tells every peer each period.
type Message struct {
	ClusterID   uint32
	Node        uint32
	Incarnation uint64 // boot nonce; a new one means the node restarted
	Seq         uint64 // grows by one per heartbeat within an incarnation
	Admin       AdminState
	Healthy     bool
	// Settled is false while the sender is still listening after its start
	// (until it has heard every registered peer, or for T periods). An
	// unsettled node is not eligible, and its view is not yet held against
	// anyone.
	Settled    bool
	RulesIndex uint64  // the Raft index of the rules the sender has applied
	View       View    // the sender's current view
	Draining   Buckets // buckets the sender holds connections in but does not accept
	Counters   Counters
}

// Counters are a few figures a node shares with its peers for display.
type Counters struct {
	Accepted    uint64 // packets accepted by the data plane
	Dropped     uint64 // packets dropped by the data plane
	Connections uint64 // connections held on the VIPs
}
