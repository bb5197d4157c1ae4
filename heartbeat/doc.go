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
package heartbeat
