package rules

import (
	"encoding/json"
	"fmt"
	"io"
	"sync"

	"github.com/hashicorp/raft"
)

// snapshotVersion heads every snapshot so a later format can be told apart.
const snapshotVersion = 1

// applyResult is what fsm.Apply hands back through the raft future.
type applyResult struct {
	res Result
	err error
}

// fsm is the Raft state machine. It keeps the state immutable once
// published: a command is applied to a copy, which replaces the state only
// when the command succeeds, so a failed command leaves nothing half done.
// Its methods stay off the public Store type.
type fsm struct {
	mu     sync.RWMutex
	state  *State
	notify func() // called after every apply and restore, without f.mu held
}

func newFSM(notify func()) *fsm {
	if notify == nil {
		notify = func() {}
	}
	return &fsm{state: &State{}, notify: notify}
}

// Apply implements raft.FSM. An entry that does not decode panics: a replica
// that skipped it would silently diverge from the others.
func (f *fsm) Apply(l *raft.Log) any {
	cmd, err := DecodeCommand(l.Data)
	if err != nil {
		panic(fmt.Sprintf("rules: raft log entry %d: %v", l.Index, err))
	}
	f.mu.Lock()
	next := f.state.Clone()
	res, err := applyTo(next, cmd)
	if err != nil {
		next = f.state.Clone()
	}
	next.Index = l.Index
	f.state = next
	f.mu.Unlock()
	f.notify()
	res.Index = l.Index
	return applyResult{res: res, err: err}
}

// current returns the published state; callers must not modify it.
func (f *fsm) current() *State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state
}

// Snapshot implements raft.FSM. It only copies; Persist does the IO, off
// the FSM's goroutine.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	return &snapshot{state: f.current().Clone()}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	s, err := decodeSnapshot(rc)
	if err != nil {
		return err
	}
	f.mu.Lock()
	f.state = s
	f.mu.Unlock()
	f.notify()
	return nil
}

func decodeSnapshot(r io.Reader) (*State, error) {
	var v [1]byte
	if _, err := io.ReadFull(r, v[:]); err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	if v[0] != snapshotVersion {
		return nil, fmt.Errorf("restore rules snapshot: unsupported version %d", v[0])
	}
	s := new(State)
	if err := json.NewDecoder(r).Decode(s); err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	if err := s.validate(); err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	return s, nil
}

// snapshot is a point-in-time state; Persist does the IO.
type snapshot struct {
	state *State
}

// Persist implements raft.FSMSnapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	err := func() error {
		if _, err := sink.Write([]byte{snapshotVersion}); err != nil {
			return err
		}
		return json.NewEncoder(sink).Encode(s.state)
	}()
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("persist rules snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (*snapshot) Release() {}
