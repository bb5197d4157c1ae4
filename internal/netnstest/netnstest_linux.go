// Package netnstest runs test code inside a network namespace the test made.
package netnstest

import (
	"runtime"
	"testing"

	"github.com/vishvananda/netns"
)

// Do runs f on a thread moved into namespace ns; sockets f opens live
// there. A thread that cannot return to its namespace stays locked and
// ends with its goroutine.
func Do(t testing.TB, ns string, f func() error) error {
	t.Helper()
	runtime.LockOSThread()
	orig, err := netns.Get()
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer orig.Close()
	target, err := netns.GetFromName(ns)
	if err != nil {
		runtime.UnlockOSThread()
		return err
	}
	defer target.Close()
	if err := netns.Set(target); err != nil {
		runtime.UnlockOSThread()
		return err
	}
	ferr := f()
	if err := netns.Set(orig); err != nil {
		t.Errorf("restore namespace: %v", err)
		return ferr
	}
	runtime.UnlockOSThread()
	return ferr
}
