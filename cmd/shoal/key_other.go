//go:build !linux

package main

import "errors"

// agentPID needs SO_PEERCRED, which is Linux's.
func agentPID(string) (int, error) { return 0, errors.New("needs Linux") }
