package heartbeat

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"time"
)

// Wire format (big endian), protocol version 3 (and 2):
//
//	version u8 | flags u8 (bit 0 healthy, bit 1 settled, bit 2 leaving, bit 3 deaf, bit 4 keeping) | admin u8 | 0 u8
//	key id u32 | cluster id u32 | node id u32 | incarnation u64 | sequence u64
//	rules index applied u64 | restart window ms u16
//	view: rules index u64 | seed u32 | digest u64 | n u16 | n x node id u32
//	draining: rules u16 | per rule: rule id u32 | form u8 |
//	          form 0 (list): n u16 | n x bucket u16
//	          form 1 (bitmap): 512 bytes, bit k of byte k/8 = bucket k
//	acks: n u16 | n x (node id u32 | incarnation u32 | sequence u32 | age in periods u8)
//	      (version 2: n x (node id u32 | incarnation u64 | sequence u64 | age u8))
//	counters: accepted u64 | dropped u64 | connections u64
//	HMAC-SHA256 of everything above under the heartbeat subkey of key id, 32 bytes
//
// Rule ids and acked node ids increase strictly; bucket lists and node ids
// are sorted and unique; the digest must match the view; the restart window
// is at most MaxRestartWindow. Version 1 (no key id, acks, leaving or restart
// window; HMAC under the cluster key itself) is not accepted.
//
// Version 3 carries the low 32 bits of an acknowledgement's incarnation and
// sequence (13 bytes instead of 21): a heartbeat of N nodes all heard is
// 111 + 17N bytes, against 103 + 25N, so a 64-node cluster's fits one
// 1,500-byte packet (1,199 bytes; version 2: 1,703, two IP fragments past
// 54 nodes). The receiver widens them (Machine.Receive) from what it knows:
// its own incarnation and sequence, and its peers' incarnations, which is
// all an acknowledgement is compared with. Decode takes both versions;
// Encode writes version 3 for a message with CompactAcks, which a node
// sets once every member decodes it (the agent: every registered node at
// rules.CompactHeartbeatLevel).
const (
	// ProtocolVersion is the newest heartbeat format version this package
	// speaks; protocolV2 is the one before it, still spoken.
	ProtocolVersion = 3
	protocolV2      = 2
	// MaxMessageSize is the largest heartbeat accepted or produced.
	MaxMessageSize = 64 << 10

	macSize     = sha256.Size
	headerSize  = 4 + 4 + 4 + 4 + 8 + 8 + 8 + 2
	minSize     = headerSize + 22 + 2 + 2 + 24 + macSize
	bitmapBytes = NumBuckets / 8
	ackSize     = 4 + 8 + 8 + 1 // version 2
	compactAck  = 4 + 4 + 4 + 1 // version 3

	flagHealthy = 1 << 0
	flagSettled = 1 << 1
	flagLeaving = 1 << 2
	flagDeaf    = 1 << 3
	flagKeeping = 1 << 4

	formList   = 0
	formBitmap = 1
)

// Rejections. Decode and Machine.Receive return errors that wrap one of
// these (or ErrUnknownKey); ReasonOf maps them to a Reason for counting.
var (
	ErrTruncated      = errors.New("heartbeat truncated")
	ErrOversized      = errors.New("heartbeat oversized")
	ErrBadVersion     = errors.New("heartbeat protocol version unknown")
	ErrForeignCluster = errors.New("heartbeat from another cluster")
	ErrBadMAC         = errors.New("heartbeat not authenticated by the cluster key")
	ErrMalformed      = errors.New("heartbeat malformed")
	ErrStale          = errors.New("heartbeat stale or replayed")
	ErrUnknownNode    = errors.New("heartbeat from a node not in the registry")
	ErrSelf           = errors.New("heartbeat carries this node's id")
	ErrOldIncarnation = errors.New("heartbeat of an older incarnation of its node")
	ErrWrongAddress   = errors.New("heartbeat not from its node's registered address")
)

// Reason is why a heartbeat was rejected, for counters.
type Reason uint8

// Rejection reasons.
const (
	ReasonTruncated Reason = iota
	ReasonOversized
	ReasonBadVersion
	ReasonForeignCluster
	ReasonBadMAC
	ReasonMalformed
	ReasonStale // same incarnation, sequence number not above the last
	ReasonUnknownNode
	ReasonSelf
	ReasonOldIncarnation // an incarnation below the highest seen of the node, ever
	ReasonWrongAddress   // not from the node's registered address
	ReasonUnknownKey     // key id of no key in the keyring
	NumReasons           // number of reasons, for arrays of counters
)

var reasonErrs = [NumReasons]error{ErrTruncated, ErrOversized, ErrBadVersion, ErrForeignCluster, ErrBadMAC, ErrMalformed, ErrStale, ErrUnknownNode, ErrSelf, ErrOldIncarnation, ErrWrongAddress, ErrUnknownKey}

var reasonNames = [NumReasons]string{"truncated", "oversized", "bad_version", "foreign_cluster", "bad_mac", "malformed", "stale", "unknown_node", "self", "old_incarnation", "wrong_address", "unknown_key"}

// String returns the reason's name, usable as a metric label.
func (r Reason) String() string {
	if r < NumReasons {
		return reasonNames[r]
	}
	return fmt.Sprintf("reason(%d)", uint8(r))
}

// ReasonOf returns the reason for a rejection error; errors it does not
// know count as malformed.
func ReasonOf(err error) Reason {
	for r, e := range reasonErrs {
		if errors.Is(err, e) {
			return Reason(r)
		}
	}
	return ReasonMalformed
}

// Encode returns msg in wire form, signed with the keyring's primary key
// (msg.KeyID is ignored). It fails only when msg cannot be represented: too
// many eligible nodes, draining rules or acks, an invalid bucket or ack list,
// a restart window out of range, or a message over MaxMessageSize.
func Encode(msg *Message, kr *Keyring) ([]byte, error) {
	return AppendEncode(make([]byte, 0, encodedSize(msg)), msg, kr)
}

// AppendEncode is Encode appending to dst.
func AppendEncode(dst []byte, msg *Message, kr *Keyring) ([]byte, error) {
	if len(msg.View.Eligible) > 0xffff || len(msg.Draining) > 0xffff || len(msg.Acks) > 0xffff {
		return nil, fmt.Errorf("encode heartbeat: %w: too many nodes, rules or acks", ErrOversized)
	}
	if !msg.Draining.valid() {
		return nil, fmt.Errorf("encode heartbeat: draining buckets must be sorted, unique and below %d", NumBuckets)
	}
	if !acksValid(msg.Acks) {
		return nil, errors.New("encode heartbeat: acks must be sorted by node, unique and not node 0")
	}
	if msg.RestartWindow < 0 || msg.RestartWindow > MaxRestartWindow {
		return nil, fmt.Errorf("encode heartbeat: restart window %v is not within 0-%v", msg.RestartWindow, MaxRestartWindow)
	}
	if n := encodedSize(msg); n > MaxMessageSize {
		return nil, fmt.Errorf("encode heartbeat: %w: %d bytes, the limit is %d", ErrOversized, n, MaxMessageSize)
	}
	key := kr.subkey(kr.Primary())
	if key == nil {
		return nil, errors.New("encode heartbeat: the keyring is empty")
	}
	start := len(dst)
	var flags byte
	if msg.Healthy {
		flags |= flagHealthy
	}
	if msg.Settled {
		flags |= flagSettled
	}
	if msg.Leaving {
		flags |= flagLeaving
	}
	if msg.Deaf {
		flags |= flagDeaf
	}
	if msg.Keeping {
		flags |= flagKeeping
	}
	version := byte(protocolV2)
	if msg.CompactAcks {
		version = ProtocolVersion
	}
	b := append(dst, version, flags, byte(msg.Admin), 0)
	b = binary.BigEndian.AppendUint32(b, kr.Primary())
	b = binary.BigEndian.AppendUint32(b, msg.ClusterID)
	b = binary.BigEndian.AppendUint32(b, msg.Node)
	b = binary.BigEndian.AppendUint64(b, msg.Incarnation)
	b = binary.BigEndian.AppendUint64(b, msg.Seq)
	b = binary.BigEndian.AppendUint64(b, msg.RulesIndex)
	b = binary.BigEndian.AppendUint16(b, uint16(msg.RestartWindow/time.Millisecond))
	v := &msg.View
	b = binary.BigEndian.AppendUint64(b, v.RulesIndex)
	b = binary.BigEndian.AppendUint32(b, v.Seed)
	b = binary.BigEndian.AppendUint64(b, v.Digest())
	b = binary.BigEndian.AppendUint16(b, uint16(len(v.Eligible)))
	for _, id := range v.Eligible {
		b = binary.BigEndian.AppendUint32(b, id)
	}
	rules := drainingRules(msg.Draining)
	b = binary.BigEndian.AppendUint16(b, uint16(len(rules)))
	for _, id := range rules {
		l := msg.Draining[id]
		b = binary.BigEndian.AppendUint32(b, id)
		if listSize(len(l)) <= bitmapBytes {
			b = append(b, formList)
			b = binary.BigEndian.AppendUint16(b, uint16(len(l)))
			for _, k := range l {
				b = binary.BigEndian.AppendUint16(b, k)
			}
			continue
		}
		b = append(b, formBitmap)
		var bm [bitmapBytes]byte
		for _, k := range l {
			bm[k/8] |= 1 << (k % 8)
		}
		b = append(b, bm[:]...)
	}
	b = binary.BigEndian.AppendUint16(b, uint16(len(msg.Acks)))
	for _, a := range msg.Acks {
		b = binary.BigEndian.AppendUint32(b, a.Node)
		if msg.CompactAcks {
			b = binary.BigEndian.AppendUint32(b, uint32(a.Incarnation))
			b = binary.BigEndian.AppendUint32(b, uint32(a.Seq))
		} else {
			b = binary.BigEndian.AppendUint64(b, a.Incarnation)
			b = binary.BigEndian.AppendUint64(b, a.Seq)
		}
		b = append(b, a.Age)
	}
	b = binary.BigEndian.AppendUint64(b, msg.Counters.Accepted)
	b = binary.BigEndian.AppendUint64(b, msg.Counters.Dropped)
	b = binary.BigEndian.AppendUint64(b, msg.Counters.Connections)
	out, _ := kr.sign(b, b[start:], kr.Primary())
	return out, nil
}

func acksValid(acks []Ack) bool {
	for i, a := range acks {
		if a.Node == 0 || (i > 0 && acks[i-1].Node >= a.Node) {
			return false
		}
	}
	return true
}

// drainingRules returns the rules with buckets, sorted.
func drainingRules(d Buckets) []uint32 {
	ids := make([]uint32, 0, len(d))
	for id, l := range d {
		if len(l) > 0 {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

func listSize(n int) int { return 2 + 2*n }

// ackBytes is the size of an acknowledgement on the wire.
func ackBytes(compact bool) int {
	if compact {
		return compactAck
	}
	return ackSize
}

func encodedSize(msg *Message) int {
	n := minSize + 4*len(msg.View.Eligible) + ackBytes(msg.CompactAcks)*len(msg.Acks)
	for _, l := range msg.Draining {
		if len(l) > 0 {
			n += 5 + min(listSize(len(l)), bitmapBytes)
		}
	}
	return n
}

// Decode checks and parses one heartbeat: size, version, key id, cluster,
// then the HMAC under the heartbeat subkey of that key, then the body. It
// never panics; every error wraps one of the Err values above.
func Decode(b []byte, kr *Keyring, clusterID uint32) (*Message, error) {
	return decode(b, kr, clusterID, nil)
}

// decode is Decode, taking the draining bitmaps a sender sent before from
// drained when it is not nil.
func decode(b []byte, kr *Keyring, clusterID uint32, drained *bitmapCache) (*Message, error) {
	if len(b) > MaxMessageSize {
		return nil, fmt.Errorf("%w: %d bytes", ErrOversized, len(b))
	}
	if len(b) < minSize {
		return nil, fmt.Errorf("%w: %d bytes, the minimum is %d", ErrTruncated, len(b), minSize)
	}
	if b[0] != ProtocolVersion && b[0] != protocolV2 {
		return nil, fmt.Errorf("%w: %d", ErrBadVersion, b[0])
	}
	keyID := binary.BigEndian.Uint32(b[4:])
	key := kr.subkey(keyID)
	if key == nil {
		return nil, fmt.Errorf("%w: key id %08x", ErrUnknownKey, keyID)
	}
	if c := binary.BigEndian.Uint32(b[8:]); c != clusterID {
		return nil, fmt.Errorf("%w: cluster id %d", ErrForeignCluster, c)
	}
	body, tag := b[:len(b)-macSize], b[len(b)-macSize:]
	var sum [sha256.Size]byte
	if got, _ := kr.sign(sum[:0], body, keyID); !hmac.Equal(got, tag) {
		return nil, ErrBadMAC
	}
	r := reader{b: body, off: 1} // the version byte is checked above
	msg := &Message{CompactAcks: b[0] == ProtocolVersion}
	flags := r.u8()
	msg.Healthy = flags&flagHealthy != 0
	msg.Settled = flags&flagSettled != 0
	msg.Leaving = flags&flagLeaving != 0
	msg.Deaf = flags&flagDeaf != 0
	msg.Keeping = flags&flagKeeping != 0
	msg.Admin = AdminState(r.u8())
	reserved := r.u8()
	msg.KeyID = r.u32()
	msg.ClusterID = r.u32()
	msg.Node = r.u32()
	msg.Incarnation = r.u64()
	msg.Seq = r.u64()
	msg.RulesIndex = r.u64()
	msg.RestartWindow = time.Duration(r.u16()) * time.Millisecond
	switch {
	case flags&^(flagHealthy|flagSettled|flagLeaving|flagDeaf|flagKeeping) != 0 || reserved != 0:
		return nil, fmt.Errorf("%w: unknown flags", ErrMalformed)
	case !msg.Admin.Valid():
		return nil, fmt.Errorf("%w: admin state %d", ErrMalformed, msg.Admin)
	case msg.Node == 0:
		return nil, fmt.Errorf("%w: node id 0", ErrMalformed)
	case msg.RestartWindow > MaxRestartWindow:
		return nil, fmt.Errorf("%w: restart window %v over %v", ErrMalformed, msg.RestartWindow, MaxRestartWindow)
	}
	msg.View.RulesIndex = r.u64()
	msg.View.Seed = r.u32()
	digest := r.u64()
	n := int(r.u16())
	if r.left() < 4*n {
		return nil, fmt.Errorf("%w: view lists %d nodes past the end", ErrMalformed, n)
	}
	if n > 0 {
		msg.View.Eligible = make([]uint32, n)
	}
	for i := range msg.View.Eligible {
		id := r.u32()
		if id == 0 || (i > 0 && msg.View.Eligible[i-1] >= id) {
			return nil, fmt.Errorf("%w: view node ids must be sorted, unique and not 0", ErrMalformed)
		}
		msg.View.Eligible[i] = id
	}
	if msg.View.Digest() != digest {
		return nil, fmt.Errorf("%w: view digest does not match the view", ErrMalformed)
	}
	rules := int(r.u16())
	if rules > 0 {
		msg.Draining = make(Buckets, rules)
	}
	var last uint32
	for i := range rules {
		id, form := r.u32(), r.u8()
		if r.bad || (i > 0 && id <= last) {
			return nil, fmt.Errorf("%w: draining rules must be sorted and unique", ErrMalformed)
		}
		last = id
		var l []uint16
		switch form {
		case formList:
			k := int(r.u16())
			if k == 0 || r.left() < 2*k {
				return nil, fmt.Errorf("%w: draining list of rule %d", ErrMalformed, id)
			}
			l = make([]uint16, k)
			for j := range l {
				l[j] = r.u16()
			}
			if !(Buckets{id: l}).valid() {
				return nil, fmt.Errorf("%w: draining buckets of rule %d must be sorted, unique and below %d", ErrMalformed, id, NumBuckets)
			}
		case formBitmap:
			if bm := r.bytes(bitmapBytes); bm != nil {
				l = drained.buckets(msg.Node, id, bm)
			}
			if len(l) == 0 {
				return nil, fmt.Errorf("%w: empty draining bitmap of rule %d", ErrMalformed, id)
			}
		default:
			return nil, fmt.Errorf("%w: draining form %d", ErrMalformed, form)
		}
		msg.Draining[id] = l
	}
	n = int(r.u16())
	if r.left() < ackBytes(msg.CompactAcks)*n {
		return nil, fmt.Errorf("%w: acks of %d nodes past the end", ErrMalformed, n)
	}
	if n > 0 {
		msg.Acks = make([]Ack, n)
	}
	for i := range msg.Acks {
		if msg.CompactAcks {
			msg.Acks[i] = Ack{Node: r.u32(), Incarnation: uint64(r.u32()), Seq: uint64(r.u32()), Age: r.u8()}
			continue
		}
		msg.Acks[i] = Ack{Node: r.u32(), Incarnation: r.u64(), Seq: r.u64(), Age: r.u8()}
	}
	if !acksValid(msg.Acks) {
		return nil, fmt.Errorf("%w: acks must be sorted by node, unique and not node 0", ErrMalformed)
	}
	msg.Counters.Accepted = r.u64()
	msg.Counters.Dropped = r.u64()
	msg.Counters.Connections = r.u64()
	if r.bad {
		return nil, fmt.Errorf("%w: body ends early", ErrMalformed)
	}
	if r.left() != 0 {
		return nil, fmt.Errorf("%w: %d bytes after the body", ErrMalformed, r.left())
	}
	return msg, nil
}

// bitmapCache remembers, per sender and rule, the last draining bitmap
// decoded and its bucket list. Through a remap every peer sends every
// bucket of the rule as draining, as a bitmap, in every heartbeat for as
// long as it holds connections there: the same bitmap decoded into the
// same 4,096-bucket list at each heartbeat from each peer was 19 µs and
// 19 KB of garbage a heartbeat against 3.8 µs for one without
// (BenchmarkDecodeRemap), and a tenth of a 64-node lab's CPU in the second
// after a rule was added (docs/BENCHMARKS-LOG.md). A list it returns is
// shared by the messages that carried the same bitmap: nothing modifies a
// received message's lists. It holds only what authenticated heartbeats
// carried, at most maxCachedBitmaps of them (then it starts afresh). Not
// safe for concurrent use: the transport decodes on one goroutine.
type bitmapCache struct {
	m map[bitmapKey]*bitmapEntry
}

type bitmapKey struct{ node, rule uint32 }

type bitmapEntry struct {
	bm [bitmapBytes]byte
	l  []uint16
}

// maxCachedBitmaps bounds a bitmapCache: 64 nodes with 16 remapped rules
// each; about 4 MB at most.
const maxCachedBitmaps = 1024

// buckets returns the buckets of bitmap bm, which node sent for rule: the
// list decoded last time when the bitmap is the same.
func (c *bitmapCache) buckets(node, rule uint32, bm []byte) []uint16 {
	if c == nil {
		return bitmapBuckets(bm)
	}
	k := bitmapKey{node, rule}
	if e := c.m[k]; e != nil && bytes.Equal(e.bm[:], bm) {
		return e.l
	}
	l := bitmapBuckets(bm)
	if c.m == nil || len(c.m) >= maxCachedBitmaps {
		c.m = make(map[bitmapKey]*bitmapEntry)
	}
	e := &bitmapEntry{l: l}
	copy(e.bm[:], bm)
	c.m[k] = e
	return l
}

// bitmapBuckets lists the buckets set in a draining bitmap (bucket k is
// bit k%8 of byte k/8), in one allocation of the right size: a rule
// change that remaps flows sends every bucket of a rule this way, and the
// list grown bucket by bucket made such a heartbeat's decoding 8x that of
// one at rest (BenchmarkDecodeRemap).
func bitmapBuckets(bm []byte) []uint16 {
	n := 0
	for i := 0; i+8 <= len(bm); i += 8 {
		n += bits.OnesCount64(binary.LittleEndian.Uint64(bm[i:]))
	}
	if n == 0 {
		return nil
	}
	l := make([]uint16, 0, n)
	for i := 0; i+8 <= len(bm); i += 8 {
		for w := binary.LittleEndian.Uint64(bm[i:]); w != 0; w &= w - 1 {
			l = append(l, uint16(8*i+bits.TrailingZeros64(w)))
		}
	}
	return l
}

// reader reads big-endian fields; past the end it returns zeros and sets bad.
type reader struct {
	b   []byte
	off int
	bad bool
}

func (r *reader) left() int { return len(r.b) - r.off }

func (r *reader) bytes(n int) []byte {
	if r.bad || r.left() < n {
		r.bad = true
		return nil
	}
	s := r.b[r.off : r.off+n]
	r.off += n
	return s
}

func (r *reader) u8() uint8 {
	if s := r.bytes(1); s != nil {
		return s[0]
	}
	return 0
}

func (r *reader) u16() uint16 {
	if s := r.bytes(2); s != nil {
		return binary.BigEndian.Uint16(s)
	}
	return 0
}

func (r *reader) u32() uint32 {
	if s := r.bytes(4); s != nil {
		return binary.BigEndian.Uint32(s)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if s := r.bytes(8); s != nil {
		return binary.BigEndian.Uint64(s)
	}
	return 0
}
