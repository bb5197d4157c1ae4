package heartbeat

import (
	"math/bits"
	"slices"
)

// NumBuckets is the number of buckets per rule; bucket numbers are 0..4095.
const NumBuckets = 4096

// Buckets is a set of buckets per rule: rule id -> sorted, unique bucket
// numbers. A node advertises the buckets it is draining (holds connections in
// but no longer accepts new ones) in this form. A nil or empty Buckets is the
// empty set; a rule with no buckets is the same as a missing rule.
type Buckets map[uint32][]uint16

// Equal reports whether b and o hold the same buckets.
func (b Buckets) Equal(o Buckets) bool {
	if b.count() != o.count() {
		return false
	}
	for id, l := range b {
		if !slices.Equal(l, o[id]) {
			return false
		}
	}
	return true
}

func (b Buckets) count() int {
	n := 0
	for _, l := range b {
		n += len(l)
	}
	return n
}

// Has reports whether bucket k of rule id is in the set.
func (b Buckets) Has(id uint32, k uint16) bool {
	_, ok := slices.BinarySearch(b[id], k)
	return ok
}

// Union returns the buckets in any of the sets, as a new Buckets.
func Union(sets ...Buckets) Buckets {
	out := Buckets{}
	var maps map[uint32]*[NumBuckets / 64]uint64
	for _, s := range sets {
		for id, l := range s {
			if len(l) == 0 {
				continue
			}
			if maps == nil {
				maps = map[uint32]*[NumBuckets / 64]uint64{}
			}
			m := maps[id]
			if m == nil {
				m = new([NumBuckets / 64]uint64)
				maps[id] = m
			}
			for _, k := range l {
				if k < NumBuckets {
					m[k/64] |= 1 << (k % 64)
				}
			}
		}
	}
	for id, m := range maps {
		out[id] = bitmapList(m)
	}
	return out
}

// valid reports whether every rule's list is sorted, unique and in range.
func (b Buckets) valid() bool {
	for _, l := range b {
		for i, k := range l {
			if k >= NumBuckets || (i > 0 && l[i-1] >= k) {
				return false
			}
		}
	}
	return true
}

func bitmapList(m *[NumBuckets / 64]uint64) []uint16 {
	var l []uint16
	for w, word := range m {
		for word != 0 {
			l = append(l, uint16(w*64+bits.TrailingZeros64(word)))
			word &= word - 1
		}
	}
	return l
}
