package heartbeat

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"slices"
	"sync"
)

// subkeyInfo names the heartbeat subkey in HKDF, so that a key derived for
// another protocol (TLS, the peer API) never authenticates a heartbeat.
const subkeyInfo = "shoal heartbeat v2"

// MaxKeys is how many keys a Keyring holds: the primary and, during a
// rotation, the ones before or after it.
const MaxKeys = 4

// ErrUnknownKey wraps a heartbeat whose key id is in no key of the keyring.
var ErrUnknownKey = errors.New("heartbeat signed with a key this node does not have")

// KeyID is the 32-bit id of a cluster key: the first four bytes of its
// SHA-256. Every heartbeat carries the id of the key it is signed with; the
// id reveals nothing usable about a 32-byte random key.
func KeyID(key []byte) uint32 {
	h := sha256.Sum256(key)
	return binary.BigEndian.Uint32(h[:4])
}

type ringKey struct {
	id     uint32
	subkey []byte // HKDF(cluster key, "shoal heartbeat v2")
	// macs keeps HMACs under subkey for reuse: a new one costs two more
	// SHA-256 blocks and its allocations, per heartbeat sent or read.
	macs *sync.Pool
}

// Keyring is the set of cluster keys heartbeats are accepted under, and the
// primary one they are signed with. It is immutable: Add, SetPrimary and
// Remove return a new Keyring, so a Transport can swap it atomically while
// it sends and receives (Transport.SetKeyring).
type Keyring struct {
	keys    []ringKey // primary first
	primary uint32
}

// NewKeyring returns a keyring holding key as its primary and others as
// accepted keys.
func NewKeyring(key []byte, others ...[]byte) (*Keyring, error) {
	k := &Keyring{}
	var err error
	for _, o := range append([][]byte{key}, others...) {
		if k, err = k.Add(o); err != nil {
			return nil, err
		}
	}
	return k.SetPrimary(KeyID(key))
}

// Add returns the keyring with key accepted too (not primary; the first
// key added to an empty keyring is). Adding a key it has changes nothing.
func (k *Keyring) Add(key []byte) (*Keyring, error) {
	if len(key) != KeySize {
		return nil, fmt.Errorf("cluster key is %d bytes, want %d", len(key), KeySize)
	}
	id := KeyID(key)
	if k.has(id) {
		return k, nil
	}
	if len(k.keys) >= MaxKeys {
		return nil, fmt.Errorf("keyring holds %d keys already: remove one first", MaxKeys)
	}
	sub, err := hkdf.Key(sha256.New, key, nil, subkeyInfo, 32)
	if err != nil {
		return nil, fmt.Errorf("derive heartbeat key: %w", err)
	}
	macs := &sync.Pool{New: func() any { return hmac.New(sha256.New, sub) }}
	out := &Keyring{keys: append(slices.Clone(k.keys), ringKey{id: id, subkey: sub, macs: macs}), primary: k.primary}
	if len(k.keys) == 0 {
		out.primary = id
	}
	return out, nil
}

// SetPrimary returns the keyring signing with the key of id, which it must
// hold.
func (k *Keyring) SetPrimary(id uint32) (*Keyring, error) {
	i := k.index(id)
	if i < 0 {
		return nil, fmt.Errorf("no key %08x in the keyring: add it first", id)
	}
	keys := slices.Clone(k.keys)
	keys[0], keys[i] = keys[i], keys[0]
	return &Keyring{keys: keys, primary: id}, nil
}

// Remove returns the keyring without the key of id. The primary cannot be
// removed: make another key primary first.
func (k *Keyring) Remove(id uint32) (*Keyring, error) {
	if id == k.primary {
		return nil, fmt.Errorf("key %08x is the primary: make another primary first", id)
	}
	i := k.index(id)
	if i < 0 {
		return k, nil
	}
	return &Keyring{keys: slices.Delete(slices.Clone(k.keys), i, i+1), primary: k.primary}, nil
}

// Primary returns the id of the key heartbeats are signed with.
func (k *Keyring) Primary() uint32 { return k.primary }

// IDs returns the ids of the keys held, the primary first.
func (k *Keyring) IDs() []uint32 {
	ids := make([]uint32, len(k.keys))
	for i, rk := range k.keys {
		ids[i] = rk.id
	}
	return ids
}

func (k *Keyring) index(id uint32) int {
	for i, rk := range k.keys {
		if rk.id == id {
			return i
		}
	}
	return -1
}

func (k *Keyring) has(id uint32) bool { return k.index(id) >= 0 }

// sign appends to dst the HMAC of b under the heartbeat subkey of id; ok
// is false when the keyring has no key id.
func (k *Keyring) sign(dst, b []byte, id uint32) (out []byte, ok bool) {
	i := k.index(id)
	if i < 0 {
		return dst, false
	}
	mac := k.keys[i].macs.Get().(hash.Hash)
	mac.Reset()
	mac.Write(b)
	out = mac.Sum(dst)
	k.keys[i].macs.Put(mac)
	return out, true
}

// subkey returns the heartbeat subkey of id, or nil.
func (k *Keyring) subkey(id uint32) []byte {
	if i := k.index(id); i >= 0 {
		return k.keys[i].subkey
	}
	return nil
}
