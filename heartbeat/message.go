package heartbeat

import "time"

// MaxRestartWindow is the longest restart a node may announce: peers keep it
// in their views for at most this long after its last heartbeat.
const MaxRestartWindow = 10 * time.Second

// Message is one heartbeat: what a node tells every peer each period.
type Message struct {
	// KeyID is the id of the cluster key the heartbeat is signed with. Decode
	// sets it; Encode writes the keyring's primary instead.
	KeyID       uint32
	ClusterID   uint32
	Node        uint32
	Incarnation uint64 // grows by at least one per start of the node, persisted
	Seq         uint64 // grows by one per heartbeat within an incarnation
	Admin       AdminState
	Healthy     bool
	// Settled is false while the sender is still listening after its start
	// (until it has heard every registered peer, or for T periods), or while
	// it knows itself deaf. An unsettled node is not eligible, and its view
	// is not held against anyone.
	Settled bool
	// Deaf: the sender hears no peer while a probe found one alive. It is
	// not settled, and stays out of every view until it hears again.
	Deaf bool
	// Leaving: the sender is stopping and hands its buckets over. It is not
	// eligible; peers drop it from their views at once.
	Leaving bool
	// RestartWindow, when not 0, says the sender is restarting: peers keep
	// it as it was (live, in their views) for this long after this
	// heartbeat, at most MaxRestartWindow, then treat it as failed. The
	// wire carries whole milliseconds.
	RestartWindow time.Duration
	RulesIndex    uint64  // the Raft index of the rules the sender has applied
	View          View    // the sender's current view
	Draining      Buckets // buckets the sender holds connections in but does not accept
	// Keeping: the sender's data plane still takes new connections in
	// buckets its view gives to peers that do not advertise that view yet
	// (they are not ready to take the SYNs it would hand them). No node
	// converges, and so acquires, while a live peer keeps: a bucket is
	// taken only once its previous owner has let it go.
	Keeping bool
	// Acks lists, sorted by node, every peer the sender heard within the
	// last T periods and the highest sequence number it received from that
	// peer's incarnation: what the sender hears, and how far.
	Acks     []Ack
	Counters Counters
	// CompactAcks: on the wire, Acks carry the low 32 bits of each
	// incarnation and sequence (protocol version 3). Encode writes version
	// 3 for a message with it; Decode sets it for one, and Machine.Receive
	// widens the acknowledgements before it reads them.
	CompactAcks bool
}

// Ack is what a heartbeat says of one peer it hears: the peer's incarnation,
// the highest sequence number received from it, and how many whole periods
// ago the last heartbeat from it arrived (0: within the last period; 255 and
// more show as 255).
type Ack struct {
	Node        uint32
	Incarnation uint64
	Seq         uint64
	Age         uint8
}

// Counters are a few figures a node shares with its peers for display.
type Counters struct {
	Accepted    uint64 // packets accepted by the data plane
	Dropped     uint64 // packets dropped by the data plane
	Connections uint64 // connections held on the VIPs
}
