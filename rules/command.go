package rules

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"time"

	"github.com/shoalnet/shoal/filter"
)

// CommandType is a command's one-byte tag at the head of its Raft log entry.
// An entry is the tag, a version byte, an 8-byte request id and the
// command's payload as JSON.
// Tags are never reused: a replica must decode every entry ever written.
type CommandType uint8

// Command tags.
const (
	TypeInitCluster         CommandType = 1
	TypePutVIP              CommandType = 2
	TypeRemoveVIP           CommandType = 3
	TypePutRule             CommandType = 4
	TypeRemoveRule          CommandType = 5
	TypeSetRuleState        CommandType = 6
	TypeSetWeight           CommandType = 7
	TypeSetHandlingPriority CommandType = 8
	TypeSetHostPriority     CommandType = 9
	TypeRegisterNode        CommandType = 10
	TypeRemoveNode          CommandType = 11
	TypeSetAdminState       CommandType = 12
	TypeSetSettings         CommandType = 13
	TypeSetMACMode          CommandType = 14
)

// commandVersion is the payload version every command is written with. A
// change to a payload that old replicas cannot read gets a new version, and
// the decoder keeps reading the old ones.
const commandVersion = 1

// maxCommandSize bounds an encoded command; real ones are a few hundred bytes.
const maxCommandSize = 64 << 10

// Command is one change to the replicated state. The FSM applies commands in
// log order; the same command applied to the same state gives the same
// result on every replica.
type Command interface {
	// Type returns the command's tag.
	Type() CommandType
	// apply changes s in place, or returns a business error and leaves the
	// caller to discard s.
	apply(s *State) (Result, error)
}

// Result is what a successful command returns.
type Result struct {
	Index  uint64        // the Raft index the command was applied at
	RuleID filter.RuleID // PutRule: the rule's id (assigned when it was 0)
	NodeID filter.NodeID // RegisterNode: the node's id
}

// commandTable maps each tag to a constructor of its payload; decoding
// dispatches through it.
var commandTable = map[CommandType]func() Command{
	TypeInitCluster:         func() Command { return new(InitCluster) },
	TypePutVIP:              func() Command { return new(PutVIP) },
	TypeRemoveVIP:           func() Command { return new(RemoveVIP) },
	TypePutRule:             func() Command { return new(PutRule) },
	TypeRemoveRule:          func() Command { return new(RemoveRule) },
	TypeSetRuleState:        func() Command { return new(SetRuleState) },
	TypeSetWeight:           func() Command { return new(SetWeight) },
	TypeSetHandlingPriority: func() Command { return new(SetHandlingPriority) },
	TypeSetHostPriority:     func() Command { return new(SetHostPriority) },
	TypeRegisterNode:        func() Command { return new(RegisterNode) },
	TypeRemoveNode:          func() Command { return new(RemoveNode) },
	TypeSetAdminState:       func() Command { return new(SetAdminState) },
	TypeSetSettings:         func() Command { return new(SetSettings) },
	TypeSetMACMode:          func() Command { return new(SetMACMode) },
}

// CommandLevel is the highest command level this build applies. Every node
// reports its level in the registry (NodeInfo.CommandLevel); a command type
// added later gets the next level in commandSince, and the leader proposes
// it only once every registered node reports that level, so no replica
// meets an entry it cannot decode during a rolling upgrade.
const CommandLevel = CompactHeartbeatLevel

// commandSince is the level each command type needs; types not listed
// need level 1.
var commandSince = map[CommandType]int{
	TypeSetMACMode: 2,
}

// listedWeightLevel is the level a SetWeight with lists needs.
const listedWeightLevel = 6

// CompactHeartbeatLevel is the level of a shoal that decodes heartbeats of
// protocol version 3 (compact acknowledgements, heartbeat.ProtocolVersion):
// an agent sends them once every registered node reports it (Speaks). No
// command needs it.
const CompactHeartbeatLevel = 7

// zoneLevel is the level a registration with a zone needs (NodeInfo.Zone:
// replicas below it refuse the field).
const zoneLevel = 4

// entryHeader is the size of a log entry's header: the type tag, the
// payload version and the request id.
const entryHeader = 10

// EncodeCommand returns cmd as a log entry with no request id: the type
// tag, the payload version, 8 zero bytes, then the payload as JSON.
func EncodeCommand(cmd Command) ([]byte, error) {
	return encodeEntry(cmd, 0)
}

// encodeEntry encodes cmd with a request id (big-endian). A write keeps its
// id through every retry, and the FSM remembers the results of recent ids,
// so a retry after a lost leadership or a lost reply gets the first
// attempt's result instead of applying the command twice. 0: no id.
func encodeEntry(cmd Command, reqID uint64) ([]byte, error) {
	if _, ok := commandTable[cmd.Type()]; !ok {
		return nil, fmt.Errorf("encode command: unknown type %d", cmd.Type())
	}
	payload, err := json.Marshal(cmd)
	if err != nil {
		return nil, fmt.Errorf("encode command %d: %w", cmd.Type(), err)
	}
	b := make([]byte, entryHeader, entryHeader+len(payload))
	b[0], b[1] = byte(cmd.Type()), commandVersion
	binary.BigEndian.PutUint64(b[2:], reqID)
	return append(b, payload...), nil
}

// DecodeCommand parses a log entry written by EncodeCommand. It is strict:
// unknown tags, versions or fields and trailing bytes are errors, so two
// replicas can never read one entry two ways.
func DecodeCommand(b []byte) (Command, error) {
	cmd, _, err := decodeEntry(b)
	return cmd, err
}

// decodeEntry parses a log entry and its request id.
func decodeEntry(b []byte) (Command, uint64, error) {
	if len(b) < entryHeader {
		return nil, 0, fmt.Errorf("decode command: %d bytes is too short", len(b))
	}
	if len(b) > maxCommandSize {
		return nil, 0, fmt.Errorf("decode command: %d bytes is over the %d byte limit", len(b), maxCommandSize)
	}
	newCmd, ok := commandTable[CommandType(b[0])]
	if !ok {
		return nil, 0, fmt.Errorf("decode command: unknown type %d", b[0])
	}
	if b[1] != commandVersion {
		return nil, 0, fmt.Errorf("decode command type %d: unsupported version %d", b[0], b[1])
	}
	cmd := newCmd()
	dec := json.NewDecoder(bytes.NewReader(b[entryHeader:]))
	dec.DisallowUnknownFields()
	if err := dec.Decode(cmd); err != nil {
		return nil, 0, fmt.Errorf("decode command type %d: %w", b[0], err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, 0, fmt.Errorf("decode command type %d: trailing data", b[0])
	}
	return cmd, binary.BigEndian.Uint64(b[2:entryHeader]), nil
}

// InitCluster sets the cluster id and first settings. The bootstrapping node
// draws the random values and proposes them, so every replica applies the
// same ones. It may be applied once.
type InitCluster struct {
	Settings Settings
}

// PutVIP adds a VIP; adding one that exists is a no-op.
type PutVIP struct {
	VIP netip.Addr
}

// RemoveVIP removes a VIP that no rule uses.
type RemoveVIP struct {
	VIP netip.Addr
}

// PutRule adds a port rule (Rule.ID 0: the FSM assigns the next id) or
// replaces the rule with Rule.ID, keeping the nodes' settings for it.
type PutRule struct {
	Rule filter.Rule
}

// RemoveRule removes a port rule and every node's settings for it.
type RemoveRule struct {
	ID filter.RuleID
}

// SetRuleState enables, drains or disables rules, cluster-wide (Node 0) or
// on one node only. Listing several rules (as `shoal disable all` does)
// changes them in one step.
type SetRuleState struct {
	Rules []filter.RuleID
	Node  filter.NodeID // 0: the rule itself, for every node
	State filter.RuleState
}

// WeightEqual asks SetWeight for the default ("equal") weight.
const WeightEqual = -1

// SetWeight sets a node's load weight on a rule: 0..100, or WeightEqual.
// Listing more rules or nodes (as `shoal weight set all node3,node4 0`
// does) sets the weight on every pair of them in one step, one view change
// for the cluster rather than one per pair; the lists need
// listedWeightLevel on every member (an older replica would read only Rule
// and Node), so a single pair is written without them.
type SetWeight struct {
	Rule   filter.RuleID
	Node   filter.NodeID
	Weight int
	Rules  []filter.RuleID `json:",omitempty"`
	Nodes  []filter.NodeID `json:",omitempty"`
}

// NewSetWeight returns the command that sets weight on every pair of the
// rules and nodes given (at least one of each).
func NewSetWeight(rules []filter.RuleID, nodes []filter.NodeID, weight int) *SetWeight {
	c := &SetWeight{Weight: weight}
	if len(rules) == 1 && len(nodes) == 1 {
		c.Rule, c.Node = rules[0], nodes[0]
		return c
	}
	c.Rules, c.Nodes = rules, nodes
	return c
}

// pairs returns the rules and the nodes the command names.
func (c *SetWeight) pairs() ([]filter.RuleID, []filter.NodeID) {
	rules, nodes := c.Rules, c.Nodes
	if c.Rule != 0 || len(rules) == 0 {
		rules = append([]filter.RuleID{c.Rule}, rules...)
	}
	if c.Node != 0 || len(nodes) == 0 {
		nodes = append([]filter.NodeID{c.Node}, nodes...)
	}
	return rules, nodes
}

// SetHandlingPriority sets a node's handling priority on a rule (1..64, or 1..32 until every member is at command level 5; 0
// goes back to the node's host priority). Single-host rules go to the
// eligible node with the lowest.
type SetHandlingPriority struct {
	Rule     filter.RuleID
	Node     filter.NodeID
	Priority int
}

// SetHostPriority sets a node's host priority (1..64, or 1..32 until every member is at command level 5; unique).
type SetHostPriority struct {
	Node     filter.NodeID
	Priority int
}

// RegisterNode adds a node to the registry and returns its id. Registering
// again under the same name and Raft address returns the existing id (a
// retried join), updating the other addresses.
type RegisterNode struct {
	Info  NodeInfo
	Admin AdminState
}

// RemoveNode removes a node from the registry.
type RemoveNode struct {
	ID filter.NodeID
}

// SetAdminState sets a node's admin state.
type SetAdminState struct {
	Node  filter.NodeID
	State AdminState
}

// SetSettings changes the cluster settings that are set (non-nil).
type SetSettings struct {
	HashSeed           *uint32        `json:",omitempty"`
	HeartbeatPeriod    *time.Duration `json:",omitempty"`
	HeartbeatTolerance *int           `json:",omitempty"`
}

// SetMACMode sets the cluster's MAC mode: which cluster MAC every VIP
// resolves to. It is a command of its own (not a SetSettings field) so that
// a replica of an older shoal never meets it: it needs command level 2.
type SetMACMode struct {
	Mode MACMode
}

// Type implements Command.
func (*InitCluster) Type() CommandType { return TypeInitCluster }

// Type implements Command.
func (*PutVIP) Type() CommandType { return TypePutVIP }

// Type implements Command.
func (*RemoveVIP) Type() CommandType { return TypeRemoveVIP }

// Type implements Command.
func (*PutRule) Type() CommandType { return TypePutRule }

// Type implements Command.
func (*RemoveRule) Type() CommandType { return TypeRemoveRule }

// Type implements Command.
func (*SetRuleState) Type() CommandType { return TypeSetRuleState }

// Type implements Command.
func (*SetWeight) Type() CommandType { return TypeSetWeight }

// Type implements Command.
func (*SetHandlingPriority) Type() CommandType { return TypeSetHandlingPriority }

// Type implements Command.
func (*SetHostPriority) Type() CommandType { return TypeSetHostPriority }

// Type implements Command.
func (*RegisterNode) Type() CommandType { return TypeRegisterNode }

// Type implements Command.
func (*RemoveNode) Type() CommandType { return TypeRemoveNode }

// Type implements Command.
func (*SetAdminState) Type() CommandType { return TypeSetAdminState }

// Type implements Command.
func (*SetSettings) Type() CommandType { return TypeSetSettings }

// Type implements Command.
func (*SetMACMode) Type() CommandType { return TypeSetMACMode }
