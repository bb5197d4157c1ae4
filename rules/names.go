package rules

import "github.com/shoalnet/shoal/peer"

// MaxNameLen bounds a node's name.
const MaxNameLen = peer.MaxNameLen

// checkNodeName accepts names of 1-64 letters, digits, '-', '_' and '.',
// starting with a letter or digit (peer.CheckName).
func checkNodeName(name string) error { return peer.CheckName(name) }

// CheckNodeName reports whether name can be a node's name, for config
// validation before an agent starts.
func CheckNodeName(name string) error { return checkNodeName(name) }
