package heartbeat

import "slices"

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
		ol := o[id]
		if len(l) > 0 && len(l) == len(ol) && &l[0] == &ol[0] {
			continue // one list, shared by two messages (bitmapCache)
		}
		if !slices.Equal(l, ol) {
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
