// Package doctor checks the network around a node (kernel, XDP, sysctls,
// clock, heartbeats, ports, cluster MAC delivery, the gateway's neighbour
// entry) and says how to fix what fails.
package doctor
