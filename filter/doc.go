// Package filter decides, with no coordination, which node owns a packet sent
// to a virtual IP: the flow key, the seeded hash, the bucket assignment, the
// per-node bucket states, and the XDP program that applies them in the kernel.
package filter
