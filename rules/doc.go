// Package rules replicates shoal's configuration (VIPs, port rules, per-node
// weights and priorities, the node registry, admin states and cluster
// settings) across the cluster with Raft, and serves the authenticated peer
// API that forwards writes and joins to the leader.
//
// The agent opens a Store (bootstrapping a one-node cluster, or joining one
// through any member with Store.Join), mounts Store.PeerHandler on its TCP
// peer listener at PeerPathPrefix, and reconciles its data plane from
// State().FilterConfig() each time the channel from Store.Subscribe fires.
// Reads are local and never wait for Raft; writes (Store.Apply) go to the
// leader from any node and fail with ErrNoQuorum within the apply timeout
// when a majority of voters is gone, leaving the last applied rules in force.
//
// Peer HTTP requests are signed with HMAC-SHA256 under the 32-byte cluster
// key (SignRequest, NewPeerClient) and checked by Authenticate; Raft's own
// TCP connections open with a mutual HMAC handshake under the same key.
package rules
