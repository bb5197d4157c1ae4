// Package announce claims the VIPs on the network: L2 answers ARP and
// Neighbor Solicitations with the cluster MAC, announces the VIPs and holds
// the multicast memberships, NLB's way.
package announce
