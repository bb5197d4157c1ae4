// Package mailbox passes the latest value of something from one goroutine
// to another without either waiting.
package mailbox

import "sync/atomic"

// Box passes the latest value put: Put never blocks and replaces what was
// not taken yet; a receive from Ready says there is one to Take.
type Box[T any] struct {
	Ready chan struct{}
	v     atomic.Pointer[T]
	// Notify, if set before the first Put, is called after every Put.
	Notify func()
}

// New returns an empty box.
func New[T any]() *Box[T] { return &Box[T]{Ready: make(chan struct{}, 1)} }

// Put replaces the value and signals Ready.
func (b *Box[T]) Put(v T) {
	b.v.Store(&v)
	select {
	case b.Ready <- struct{}{}:
	default:
	}
	if b.Notify != nil {
		b.Notify()
	}
}

// Take returns the latest value put; call it after a receive from Ready.
func (b *Box[T]) Take() T {
	if p := b.v.Load(); p != nil {
		return *p
	}
	var zero T
	return zero
}
