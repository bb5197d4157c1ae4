// Package heartbeat decides which peers are alive and converges the cluster's
// view, so that every node computes the same owner table and every bucket has
// exactly one owner.
//
// The package has three layers:
//
//   - the codec (Encode, Decode): a versioned binary heartbeat authenticated
//     with HMAC-SHA256 under an HKDF subkey of a cluster key from a Keyring,
//     named by its key id;
//   - the Machine: a pure state machine, fed heartbeats (with their source
//     address), ticks, probe results and local changes with an injected
//     clock, that keeps the failure detector, the view and the accepting set
//     (release at once on a view change, acquire once every member
//     acknowledges the view, yield when a peer that hears this node leaves it
//     out);
//   - the shell: a UDP Transport and a Runner that drive a Machine with the
//     real clock (the agent drives its own).
//
// The Machine is generic over the bucket-set type S so that heartbeat does not
// import the filter package: the caller passes owned(view), which computes the
// buckets this node owns in a view, and intersect.
//
// Beyond DESIGN.md's rules, a node that has just started (or stopped being
// deaf) is "unsettled" until it has heard every registered peer (or for T
// periods, and no probe says an unheard peer is alive): it is not eligible,
// and its view is not held against anyone. Views keep only nodes that hear
// each other (reach.go). A view that drops a node which may still be
// accepting without knowing is acted on only after a hold (deathHold or T+1
// periods, see holdFor), unless a probe found the node gone.
//
// Limits, by design: two groups that cannot hear each other on any channel
// (heartbeats and probes) but share client traffic will both serve it;
// without probes, a node that hears nobody takes every bucket and the others
// yield to it; a one-way fault combined with the loss of every heartbeat
// announcing the change during the hold can give a bucket two owners for a
// moment (the simulator measures how often). Heartbeats are UDP datagrams to
// each peer's registered address and port, which firewalls between nodes
// must let through both ways.
package heartbeat
