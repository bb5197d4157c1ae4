package heartbeat

import "time"

// Every node sends a heartbeat to every other each period, so each node
// receives N-1 a period: at 64 nodes and 75 ms, 840 a second, and the
// lab measured about 20-35 µs of a node's CPU per heartbeat (sending it
// carries its delivery; receiving wakes the agent). What a heartbeat
// detects is a silence of T x P (0.9 s by default), not a number of lost
// datagrams, so a bigger cluster can send less often for the same
// detection time: the period in use grows by a step of the settings'
// period per 16 registered nodes, and the tolerance shrinks so that T x P
// stays, down to MinScaledTolerance periods (lost heartbeats in a row
// before a false death; 0.01^4 = 1e-8 at 1% loss).
const (
	NodesPerStep       = 16
	MinScaledTolerance = 4
)

// ScaledTiming returns the period and tolerance a cluster of nodes
// registered nodes uses, given the settings' period and tolerance: the
// settings up to NodesPerStep nodes; then k = ceil(nodes/NodesPerStep)
// times the period (k at most tolerance/MinScaledTolerance) and
// ceil(tolerance/k) periods, so that a silence is declared a death no
// sooner than the settings say. Every node computes it from the same
// replicated registry, and switches at SetTiming's safe point.
func ScaledTiming(period time.Duration, tolerance, nodes int) (time.Duration, int) {
	k := min((nodes+NodesPerStep-1)/NodesPerStep, tolerance/MinScaledTolerance)
	if k <= 1 {
		return period, tolerance
	}
	return period * time.Duration(k), (tolerance + k - 1) / k
}
