package heartbeat

import (
	"crypto/sha256"
	"encoding/binary"
	"slices"
)

// View is what every node must agree on before it takes new connections: the
// eligible nodes (live, started, healthy, not lagging), the rules index the
// owner table is computed from, and the hash seed. Eligible is sorted and
// holds no duplicates. A View is treated as immutable once built.
type View struct {
	Eligible   []uint32
	RulesIndex uint64
	Seed       uint32
}

// Digest returns a 64-bit hash of the view (the first 8 bytes of a SHA-256
// over its canonical encoding), for logs, metrics and quick comparisons.
func (v View) Digest() uint64 {
	h := sha256.New()
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v.RulesIndex)
	h.Write(b[:])
	binary.BigEndian.PutUint32(b[:4], v.Seed)
	h.Write(b[:4])
	for _, id := range v.Eligible {
		binary.BigEndian.PutUint32(b[:4], id)
		h.Write(b[:4])
	}
	return binary.BigEndian.Uint64(h.Sum(nil))
}

// Equal reports whether v and o are exactly the same view.
func (v View) Equal(o View) bool {
	return v.RulesIndex == o.RulesIndex && v.Seed == o.Seed && slices.Equal(v.Eligible, o.Eligible)
}

// Has reports whether node id is in the eligible set.
func (v View) Has(id uint32) bool {
	_, ok := slices.BinarySearch(v.Eligible, id)
	return ok
}
