// Command failover measures shoal's failover time over many pulled plugs in
// one lab: for each cycle it sets the last node's switch port down, polls
// the survivors every 20 ms until they own every bucket again (the failover
// time), puts the port back and waits until the whole cluster has
// re-converged with every bucket owned, then starts the next cycle. It
// prints every cycle and p50/p99/max. bench/failover.sh runs it; it needs
// root, Linux and the shoal binary.
package main
