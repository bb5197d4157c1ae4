// Package heartbeat decides which peers are alive and converges the cluster's
// view, so that every node computes the same owner table and every bucket has
// exactly one owner.
//
// The package has three layers:
//
//   - the codec (Encode, Decode): a versioned binary heartbeat authenticated
//     with HMAC-SHA256 under the cluster key;
//   - the Machine: a pure state machine, fed heartbeats, ticks and local
//     changes with an injected clock, that keeps the failure detector, the
//     view and the accepting set (release at once on a view change, acquire
//     only when converged, yield when a live peer's view leaves this node out);
//   - the shell: a UDP Transport and a Runner that drive a Machine with the
//     real clock.
//
// The Machine is generic over the bucket-set type S so that heartbeat does not
// import the filter package: the caller passes owned(view), which computes the
// buckets this node owns in a view, and intersect.
//
// Beyond DESIGN.md's rules, a node that has just started is "unsettled" until
// it has heard every registered peer (or for T periods): it is not eligible,
// and its view is not held against anyone, so a booting node, whose first
// view lists only the peers it has heard so far, does not make the whole
// cluster yield. A node announces a new view at once (at most four heartbeats
// a period), which keeps agreement near K periods.
//
// Limits, by design: two groups that cannot hear each other's heartbeats but
// share client traffic will both serve it; a node that hears nobody (its
// receive path broken) sees every peer die, takes every bucket, and the
// others, seeing a view that leaves them out, yield to it; a one-way
// partition combined with the loss of all K heartbeats announcing the change
// can give a bucket two owners for a moment (the simulator measures how
// often). Heartbeats are UDP datagrams to each peer's configured address and
// port, which firewalls between nodes must let through both ways.
package heartbeat
