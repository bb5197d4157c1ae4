// Package peer is the cluster's identity and the transport between its
// nodes: the cluster key, the mutual-TLS certificates (derived from the key
// or an operator's CA) and their rotation, the peer API's client, server
// and listener, and the listeners' limits and refusal counts. The Raft
// transport in rules and the agent's peer API both use it.
package peer
