// Package host owns what the agent changes on the host and must undo: the
// VIPs on lo, the cluster interface's sysctls, the announcer and the XDP
// attachment kept across link events, the record that lets a crashed or
// restarted agent's successor adopt or repair all of it.
package host
