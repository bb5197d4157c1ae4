package heartbeat

import (
	"bytes"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func sampleMessage() *Message {
	big := make([]uint16, 0, 1000)
	for k := uint16(0); k < 2000; k += 2 {
		big = append(big, k)
	}
	return &Message{
		KeyID:     simRing.Primary(),
		ClusterID: 42, Node: 3, Incarnation: 1_700_000_000, Seq: 99,
		Admin: Draining, Healthy: true, Settled: true, Deaf: true, Leaving: true, Keeping: true, RestartWindow: 2500 * time.Millisecond, RulesIndex: 1234,
		View:     View{Eligible: []uint32{1, 3, 9}, RulesIndex: 1234, Seed: 0xdeadbeef},
		Draining: Buckets{1: {0, 5, 4095}, 7: big},
		Acks:     []Ack{{Node: 1, Incarnation: 5, Seq: 7}, {Node: 9, Incarnation: 1 << 40, Seq: 1 << 50}},
		Counters: Counters{Accepted: 1, Dropped: 2, Connections: 3},
	}
}

func TestCodecRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		msg  *Message
	}{
		{"full", sampleMessage()},
		{"empty view and draining", &Message{KeyID: simRing.Primary(), ClusterID: 42, Node: 1, Incarnation: 1, Seq: 1}},
		{"all flags off", &Message{KeyID: simRing.Primary(), ClusterID: 42, Node: 65535, Admin: Suspended, View: View{Eligible: []uint32{65535}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := Encode(tt.msg, simRing)
			if err != nil {
				t.Fatal(err)
			}
			got, err := Decode(b, simRing, 42)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.msg, got); diff != "" {
				t.Errorf("round trip (-want +got):\n%s", diff)
			}
		})
	}
}

// TestDrainingForm checks the compact form: a list while it is smaller
// than the 512-byte bitmap, the bitmap past that.
func TestDrainingForm(t *testing.T) {
	// n buckets from 0 on; -n: n buckets spread over every 64-bit word
	// of the bitmap (1, 4, 7, ...) and the last one.
	for _, n := range []int{1, 255, 256, 4096, -1300} {
		l := make([]uint16, max(n, -n))
		for i := range l {
			l[i] = uint16(i)
		}
		if n < 0 {
			n = -n
			for i := range n - 1 {
				l[i] = uint16(3*i + 1)
			}
			l[n-1] = NumBuckets - 1
		}
		b, err := Encode(&Message{ClusterID: 1, Node: 1, Draining: Buckets{5: l}}, simRing)
		if err != nil {
			t.Fatal(err)
		}
		want := minSize + 5 + min(2+2*n, 512)
		if len(b) != want {
			t.Errorf("%d buckets: %d bytes, want %d", n, len(b), want)
		}
		got, err := Decode(b, simRing, 1)
		if err != nil {
			t.Fatal(err)
		}
		if diff := cmp.Diff(l, got.Draining[5]); diff != "" {
			t.Errorf("%d buckets (-want +got):\n%s", n, diff)
		}
	}
}

// TestDrainingBitmapsKept: decoded with a bitmapCache, as the transport
// does, a stream of heartbeats from several senders whose draining
// bitmaps change, repeat and move between rules gives every message the
// lists a plain Decode gives; a repeated bitmap from the same sender and
// rule comes back as the same list, a changed one never as the old list;
// the cache stays within its bound.
func TestDrainingBitmapsKept(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 4096))
	bitmapOf := func(density int) []uint16 {
		var l []uint16
		for k := range NumBuckets {
			if rng.IntN(100) < density {
				l = append(l, uint16(k))
			}
		}
		if len(l) < 300 { // the list form below that: not a bitmap
			return nil
		}
		return l
	}
	sets := [][]uint16{bitmapOf(100), bitmapOf(50), bitmapOf(30), bitmapOf(90)}
	var kept bitmapCache
	last := map[bitmapKey][]uint16{}
	shared := 0
	for i := range 2000 {
		node := uint32(1 + rng.IntN(5))
		d := Buckets{}
		for _, rule := range []uint32{1, 2, 9} {
			if rng.IntN(3) > 0 {
				d[rule] = sets[rng.IntN(len(sets))]
			}
		}
		wire, err := Encode(&Message{ClusterID: 1, Node: node, Seq: uint64(i + 1), Draining: d}, simRing)
		if err != nil {
			t.Fatal(err)
		}
		plain, err := Decode(wire, simRing, 1)
		if err != nil {
			t.Fatal(err)
		}
		got, err := decode(wire, simRing, 1, &kept)
		if err != nil {
			t.Fatal(err)
		}
		if !got.Draining.Equal(plain.Draining) || len(got.Draining) != len(plain.Draining) {
			t.Fatalf("message %d from node %d: kept decode's draining differs from Decode's", i, node)
		}
		for rule, l := range got.Draining {
			if diff := cmp.Diff(plain.Draining[rule], l); diff != "" {
				t.Fatalf("message %d, node %d, rule %d (-plain +kept):\n%s", i, node, rule, diff)
			}
			k := bitmapKey{node, rule}
			prev := last[k]
			same := len(prev) > 0 && &prev[0] == &l[0]
			switch {
			case same && !slices.Equal(prev, d[rule]):
				t.Fatalf("message %d, node %d, rule %d: a changed bitmap came back as the old list", i, node, rule)
			case same:
				shared++
			}
			last[k] = l
		}
		if len(kept.m) > maxCachedBitmaps {
			t.Fatalf("%d bitmaps kept, the bound is %d", len(kept.m), maxCachedBitmaps)
		}
	}
	if shared == 0 {
		t.Fatal("no repeated bitmap was served from the cache")
	}
	// Past the bound, it starts afresh and still decodes right.
	for n := range maxCachedBitmaps + 10 {
		wire, _ := Encode(&Message{ClusterID: 1, Node: uint32(100 + n), Seq: 1, Draining: Buckets{1: sets[0]}}, simRing)
		got, err := decode(wire, simRing, 1, &kept)
		if err != nil || !slices.Equal(got.Draining[1], sets[0]) {
			t.Fatalf("sender %d past the bound: %v", 100+n, err)
		}
		if len(kept.m) > maxCachedBitmaps {
			t.Fatalf("%d bitmaps kept, the bound is %d", len(kept.m), maxCachedBitmaps)
		}
	}
}

// resign recomputes the HMAC after a test edits the body.
func resign(b []byte) []byte {
	body := b[:len(b)-macSize]
	out, _ := hmacAppend(append([]byte(nil), body...))
	return out
}

func TestDecodeRejects(t *testing.T) {
	good, err := Encode(sampleMessage(), simRing)
	if err != nil {
		t.Fatal(err)
	}
	edit := func(f func(b []byte) []byte) []byte { return f(bytes.Clone(good)) }
	viewCount := headerSize + 20 // offset of the view's node count
	tests := []struct {
		name string
		in   []byte
		want error
	}{
		{"empty", nil, ErrTruncated},
		{"short", good[:minSize-1], ErrTruncated},
		{"oversized", make([]byte, MaxMessageSize+1), ErrOversized},
		{"version 1", edit(func(b []byte) []byte { b[0] = 1; return b }), ErrBadVersion},
		{"unknown key id", edit(func(b []byte) []byte { b[4] ^= 1; return b }), ErrUnknownKey},
		{"foreign cluster", edit(func(b []byte) []byte { b[11] ^= 1; return b }), ErrForeignCluster},
		{"wrong key", func() []byte {
			b, _ := Encode(sampleMessage(), otherRing)
			binary.BigEndian.PutUint32(b[4:], simRing.Primary())
			return b
		}(), ErrBadMAC},
		{"cluster key itself", func() []byte {
			// Version 1 signed with the cluster key; a subkey must be used.
			b := bytes.Clone(good[:len(good)-macSize])
			mac := hmac.New(sha256.New, simKey)
			mac.Write(b)
			return mac.Sum(b)
		}(), ErrBadMAC},
		{"flipped body bit", edit(func(b []byte) []byte { b[20] ^= 1; return b }), ErrBadMAC},
		{"cut tag", good[:len(good)-1], ErrBadMAC},
		{"unknown flag", edit(func(b []byte) []byte { b[1] |= 0x80; return resign(b) }), ErrMalformed},
		{"admin state", edit(func(b []byte) []byte { b[2] = 9; return resign(b) }), ErrMalformed},
		{"node 0", edit(func(b []byte) []byte { binary.BigEndian.PutUint32(b[12:], 0); return resign(b) }), ErrMalformed},
		{"restart window", edit(func(b []byte) []byte { binary.BigEndian.PutUint16(b[40:], 10001); return resign(b) }), ErrMalformed},
		{"acks unsorted", edit(func(b []byte) []byte {
			acks := len(b) - macSize - 24 - 2*ackSize // the first of the two acks
			binary.BigEndian.PutUint32(b[acks:], 9)
			return resign(b)
		}), ErrMalformed},
		{"acks past end", edit(func(b []byte) []byte {
			binary.BigEndian.PutUint16(b[len(b)-macSize-24-2*ackSize-2:], 1000)
			return resign(b)
		}), ErrMalformed},
		{"digest", edit(func(b []byte) []byte { b[headerSize+12] ^= 1; return resign(b) }), ErrMalformed},
		{"view count past end", edit(func(b []byte) []byte { binary.BigEndian.PutUint16(b[viewCount:], 60000); return resign(b) }), ErrMalformed},
		{"trailing byte", edit(func(b []byte) []byte { return resign(append(b[:len(b)-macSize], 0, 0)) }), ErrMalformed},
	}
	reasons := map[Reason]bool{}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := Decode(tt.in, simRing, 42)
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decode = %v, want %v", err, tt.want)
			}
			reasons[ReasonOf(err)] = true
		})
	}
	for _, r := range []Reason{ReasonTruncated, ReasonOversized, ReasonBadVersion, ReasonForeignCluster, ReasonBadMAC, ReasonMalformed, ReasonUnknownKey} {
		if !reasons[r] {
			t.Errorf("no case rejects with reason %v", r)
		}
	}
}

func TestEncodeRefuses(t *testing.T) {
	tests := []struct {
		name string
		msg  *Message
	}{
		{"unsorted draining", &Message{Node: 1, Draining: Buckets{1: {5, 4}}}},
		{"bucket out of range", &Message{Node: 1, Draining: Buckets{1: {4096}}}},
		{"unsorted acks", &Message{Node: 1, Acks: []Ack{{Node: 3}, {Node: 2}}}},
		{"ack of node 0", &Message{Node: 1, Acks: []Ack{{Node: 0}}}},
		{"restart window too long", &Message{Node: 1, RestartWindow: MaxRestartWindow + time.Millisecond}},
		{"too many rules", func() *Message {
			d := Buckets{}
			for i := range 200 {
				d[uint32(i)] = make4096()
			}
			return &Message{Node: 1, Draining: d}
		}()},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := Encode(tt.msg, simRing); err == nil {
				t.Error("Encode succeeded")
			}
		})
	}
}

func make4096() []uint16 {
	l := make([]uint16, NumBuckets)
	for i := range l {
		l[i] = uint16(i)
	}
	return l
}

func TestReasonNames(t *testing.T) {
	for r := range NumReasons {
		if ReasonOf(reasonErrs[r]) != r || r.String() == "" {
			t.Errorf("reason %d: ReasonOf = %v, name %q", r, ReasonOf(reasonErrs[r]), r.String())
		}
	}
}

// hmacAppend appends the HMAC of body under simRing's heartbeat subkey.
func hmacAppend(body []byte) ([]byte, error) {
	mac := hmac.New(sha256.New, simRing.subkey(simRing.Primary()))
	mac.Write(body)
	return mac.Sum(body), nil
}

// TestCompactAcks: a 64-node heartbeat with compact acknowledgements
// (protocol 3) fits the UDP payload of one 1,500-byte IPv6 packet, where
// protocol 2's does not; Decode takes both, says which, and protocol 3
// carries the low 32 bits of incarnations and sequences.
func TestCompactAcks(t *testing.T) {
	msg := benchMessage()
	msg.Acks[3].Incarnation, msg.Acks[3].Seq = 1<<33+7, 1<<32+9
	v2, err := Encode(msg, simRing)
	if err != nil {
		t.Fatal(err)
	}
	msg.CompactAcks = true
	v3, err := Encode(msg, simRing)
	if err != nil {
		t.Fatal(err)
	}
	const ipv6Payload = 1500 - 40 - 8
	if len(v3) > ipv6Payload || len(v2) <= ipv6Payload {
		t.Fatalf("64 nodes: protocol 3 %d bytes, protocol 2 %d; want 3 within %d and 2 past it", len(v3), len(v2), ipv6Payload)
	}
	if v2[0] != 2 || v3[0] != ProtocolVersion {
		t.Fatalf("versions %d and %d, want 2 and %d", v2[0], v3[0], ProtocolVersion)
	}
	got2, err := Decode(v2, simRing, 1)
	if err != nil {
		t.Fatal(err)
	}
	got3, err := Decode(v3, simRing, 1)
	if err != nil {
		t.Fatal(err)
	}
	if got2.CompactAcks || !got3.CompactAcks {
		t.Fatalf("decoded CompactAcks %v and %v, want false and true", got2.CompactAcks, got3.CompactAcks)
	}
	for i, a := range msg.Acks {
		if got2.Acks[i] != a {
			t.Fatalf("protocol 2 ack %d: %+v, want %+v", i, got2.Acks[i], a)
		}
		want := Ack{Node: a.Node, Incarnation: uint64(uint32(a.Incarnation)), Seq: uint64(uint32(a.Seq)), Age: a.Age}
		if got3.Acks[i] != want {
			t.Fatalf("protocol 3 ack %d: %+v, want %+v", i, got3.Acks[i], want)
		}
	}
	// A protocol 3 heartbeat cut in its acks is refused, as any other.
	if _, err := Decode(v3[:len(v3)-macSize-30], simRing, 1); err == nil {
		t.Fatal("a truncated protocol 3 heartbeat decoded")
	}
}
