package filter

import (
	"encoding/binary"
	"math/bits"
	"net/netip"
)

// NumBuckets is the number of hash buckets per rule.
const NumBuckets = 4096

// BucketMask turns a hash into a bucket number.
const BucketMask = NumBuckets - 1

// Hash is the cluster's flow hash of an IPv4 flow key: HashWords of the two
// key words.
func Hash(seed, a, b uint32) uint32 {
	return HashWords(seed, []uint32{a, b})
}

// HashWords is the cluster's flow hash: MurmurHash3 (x86, 32-bit) of the key
// words, little-endian, under seed. The XDP program computes the same
// function (filter/xdp/shoal.c, shoal_hash); a differential test keeps them
// equal. An IPv4 key has 2 words and an IPv6 key 5 (the length is hashed
// too, so the families never share a key).
func HashWords(seed uint32, w []uint32) uint32 {
	h := seed
	for _, k := range w {
		h = murmurRound(h, k)
	}
	return finish(h, len(w))
}

// finish is HashWords' last step, after the rounds of n words.
func finish(h uint32, n int) uint32 {
	h ^= uint32(4 * n)
	h ^= h >> 16
	h *= 0x85ebca6b
	h ^= h >> 13
	h *= 0xc2b2ae35
	h ^= h >> 16
	return h
}

func murmurRound(h, k uint32) uint32 {
	k *= 0xcc9e2d51
	k = bits.RotateLeft32(k, 15)
	k *= 0x1b873593
	h ^= k
	h = bits.RotateLeft32(h, 13)
	return h*5 + 0xe6546b64
}

// FlowKey returns the two key words that affinity selects from a client's
// IPv4 address (as a big-endian uint32) and port.
func FlowKey(aff Affinity, clientIP uint32, clientPort uint16) (uint32, uint32) {
	switch aff {
	case AffinityNone:
		return clientIP, uint32(clientPort)
	case AffinityNetwork:
		return clientIP & 0xffffff00, 0
	default:
		return clientIP, 0
	}
}

// Bucket returns the bucket of an IPv4 flow under a rule's affinity.
func Bucket(seed uint32, aff Affinity, clientIP uint32, clientPort uint16) uint16 {
	a, b := FlowKey(aff, clientIP, clientPort)
	return uint16(Hash(seed, a, b) & BucketMask)
}

// Key is a flow key: the words the hash takes, as affinity selects them
// from the client's address and port. An IPv4 key is (address, port or 0),
// its address masked to /24 for network affinity. An IPv6 key is the
// address's four big-endian words and the port or 0: the whole /128 and the
// port for none, the /128 for single, the /64 (the last two address words
// zero) for network.
type Key struct {
	w [5]uint32
	n uint8
}

// MaxKeyWords is the length of the longest flow key, an IPv6 one.
const MaxKeyWords = 5

// KeyOf returns the flow key of a client address and port under affinity.
// An IPv4-mapped IPv6 address is keyed as the IPv4 address it maps.
func KeyOf(aff Affinity, client netip.Addr, port uint16) Key {
	return keyFor(aff, client.Unmap(), port)
}

// keyFor is KeyOf for an address as a packet carries it: an IPv4-mapped
// source of an IPv6 packet stays an IPv6 key, as in the XDP program.
func keyFor(aff Affinity, client netip.Addr, port uint16) Key {
	var k Key
	if client.Is4() {
		b := client.As4()
		k.w[0], k.w[1] = FlowKey(aff, binary.BigEndian.Uint32(b[:]), port)
		k.n = 2
		return k
	}
	b := client.As16()
	return key6(aff, b[:], port)
}

// key6 returns the IPv6 flow key of the 16 address bytes a.
func key6(aff Affinity, a []byte, port uint16) Key {
	k := Key{n: 5}
	words := 4
	if aff == AffinityNetwork {
		words = 2
	}
	for i := 0; i < words; i++ {
		k.w[i] = binary.BigEndian.Uint32(a[4*i:])
	}
	if aff == AffinityNone {
		k.w[4] = uint32(port)
	}
	return k
}

// Words returns the key's words.
func (k *Key) Words() []uint32 { return k.w[:k.n] }

// Hash returns the flow hash of the key under seed.
func (k *Key) Hash(seed uint32) uint32 { return HashWords(seed, k.w[:k.n]) }

// Bucket returns the bucket of the key under seed.
func (k *Key) Bucket(seed uint32) uint16 { return uint16(k.Hash(seed) & BucketMask) }
