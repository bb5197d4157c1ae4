package filter

import "math/bits"

// NumBuckets is the number of hash buckets per rule.
const NumBuckets = 4096

// BucketMask turns a hash into a bucket number.
const BucketMask = NumBuckets - 1

// Hash is the cluster's flow hash: MurmurHash3 (x86, 32-bit) of the two key
// words, little-endian, under seed. The XDP program computes the same
// function (filter.c, shoal_hash); a differential test keeps them equal.
func Hash(seed, a, b uint32) uint32 {
	h := seed
	h = murmurRound(h, a)
	h = murmurRound(h, b)
	h ^= 8
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

// Bucket returns the bucket of a flow under a rule's affinity.
func Bucket(seed uint32, aff Affinity, clientIP uint32, clientPort uint16) uint16 {
	a, b := FlowKey(aff, clientIP, clientPort)
	return uint16(Hash(seed, a, b) & BucketMask)
}
