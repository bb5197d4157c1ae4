//go:build !linux

package lab

import "syscall"

// freebind does nothing off Linux: the lab only runs on Linux.
func freebind(network, address string, c syscall.RawConn) error { return nil }
