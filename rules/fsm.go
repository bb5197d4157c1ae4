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

// maxRecent is how many request results the FSM remembers for retries; a
// retry comes within seconds, while hundreds of writes are rare.
const maxRecent = 1024

// applyResult is what fsm.Apply hands back through the raft future.
type applyResult struct {
	res Result
	err error
}

// recentResult is the remembered outcome of a request id. Errors keep their
// wire code and message, which every replica computes alike.
type recentResult struct {
	ID     uint64
	Result Result
	Code   string `json:",omitempty"`
	Error  string `json:",omitempty"`
}

func (r recentResult) applyResult() applyResult {
	return applyResult{res: r.Result, err: decodeError(r.Code, r.Error)}
}

// fsm is the Raft state machine. It keeps the state immutable once
// published: a command is applied to a copy, which replaces the state only
// when the command succeeds, so a failed command leaves nothing half done.
// Its methods stay off the public Store type.
type fsm struct {
	mu     sync.RWMutex
	state  *State
	halt   *Halt          // set when an entry could not be applied; nil: healthy
	recent []recentResult // oldest first, at most maxRecent; in snapshots
	byID   map[uint64]int // request id -> position in recent
	notify func()         // called after every apply and restore, without f.mu held
	onHalt func(Halt)     // called once when application stops, without f.mu held
}

func (h Halt) err() error {
	return fmt.Errorf("%w at raft index %d: %s; this node keeps the rules of index %d and resumes once it runs a shoal that can apply the entry (upgrade it)", ErrStopped, h.Index, h.Reason, h.Index-1)
}

// halted returns where application stopped, if it did.
func (f *fsm) halted() (Halt, bool) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halt == nil {
		return Halt{}, false
	}
	return *f.halt, true
}

func newFSM(notify func()) *fsm {
	if notify == nil {
		notify = func() {}
	}
	return &fsm{state: &State{}, byID: map[uint64]int{}, notify: notify, onHalt: func(Halt) {}}
}

// Halt says where and why a replica stopped applying the log.
type Halt struct {
	Index  uint64 // the entry it could not apply
	Reason string
}

// Apply implements raft.FSM. An entry that does not decode (corrupt, or a
// command type or version this binary does not know) stops application at
// its index: skipping it would let this replica diverge from the others,
// and panicking would crash-loop the node (Raft replays the same entry on
// every start). The state stays as it was, every later entry is refused
// alike, and snapshots are refused so the log from that index is kept: a
// binary that knows the entry resumes from there when it starts, as Raft
// replays the log after the last snapshot.
func (f *fsm) Apply(l *raft.Log) any {
	f.mu.Lock()
	if f.halt != nil {
		h := *f.halt
		f.mu.Unlock()
		return applyResult{err: h.err()}
	}
	cmd, reqID, err := decodeEntry(l.Data)
	if err != nil {
		f.halt = &Halt{Index: l.Index, Reason: err.Error()}
		h := *f.halt
		f.mu.Unlock()
		f.onHalt(h)
		f.notify()
		return applyResult{err: h.err()}
	}
	if i, dup := f.byID[reqID]; dup && reqID != 0 {
		// A retry of a request that already committed: answer as the first
		// time, change nothing but the index.
		next := f.state.Clone()
		next.Index = l.Index
		f.state = next
		ar := f.recent[i].applyResult()
		f.mu.Unlock()
		f.notify()
		return ar
	}
	next := f.state.Clone()
	res, err := applyTo(next, cmd)
	if err != nil {
		next = f.state.Clone()
	}
	next.Index = l.Index
	f.state = next
	res.Index = l.Index
	if reqID != 0 {
		f.remember(recentResult{ID: reqID, Result: res, Code: errorCode(err), Error: errString(err)})
	}
	f.mu.Unlock()
	f.notify()
	return applyResult{res: res, err: err}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// remember records a result, forgetting the oldest beyond maxRecent.
// Callers hold f.mu.
func (f *fsm) remember(r recentResult) {
	if len(f.recent) >= maxRecent {
		drop := len(f.recent) - maxRecent + 1
		for _, old := range f.recent[:drop] {
			delete(f.byID, old.ID)
		}
		f.recent = append(f.recent[:0:0], f.recent[drop:]...)
		for i, r := range f.recent {
			f.byID[r.ID] = i
		}
	}
	f.byID[r.ID] = len(f.recent)
	f.recent = append(f.recent, r)
}

// lookup returns the result of request id if it was applied recently.
func (f *fsm) lookup(reqID uint64) (applyResult, bool) {
	if reqID == 0 {
		return applyResult{}, false
	}
	f.mu.RLock()
	defer f.mu.RUnlock()
	i, ok := f.byID[reqID]
	if !ok {
		return applyResult{}, false
	}
	return f.recent[i].applyResult(), true
}

// current returns the published state; callers must not modify it.
func (f *fsm) current() *State {
	f.mu.RLock()
	defer f.mu.RUnlock()
	return f.state
}

// snapshotData is what a snapshot holds after its version byte.
type snapshotData struct {
	State  *State
	Recent []recentResult `json:",omitempty"`
}

// Snapshot implements raft.FSM. It only copies; Persist does the IO, off
// the FSM's goroutine.
func (f *fsm) Snapshot() (raft.FSMSnapshot, error) {
	f.mu.RLock()
	defer f.mu.RUnlock()
	if f.halt != nil {
		// A snapshot would claim entries this replica never applied, and
		// the log they are in would be compacted away.
		return nil, f.halt.err()
	}
	return &snapshot{data: snapshotData{State: f.state.Clone(), Recent: append([]recentResult(nil), f.recent...)}}, nil
}

// Restore implements raft.FSM.
func (f *fsm) Restore(rc io.ReadCloser) error {
	defer rc.Close()
	d, err := decodeSnapshot(rc)
	if err != nil {
		return err
	}
	byID := make(map[uint64]int, len(d.Recent))
	for i, r := range d.Recent {
		byID[r.ID] = i
	}
	f.mu.Lock()
	f.state, f.recent, f.byID = d.State, d.Recent, byID
	f.halt = nil // a leader's snapshot carries what this replica could not apply
	f.mu.Unlock()
	f.notify()
	return nil
}

// Bounds a snapshot must respect before it is validated, so decoding and
// validation cost is bounded whatever the input (validation is at worst
// quadratic in the rules, on at most maxSnapshotRules). Real snapshots are
// a few kB: the data plane holds 16 VIPs and 127 rules, and host
// priorities (1-64, unique) bound the nodes.
const (
	maxSnapshotSize     = 4 << 20
	maxSnapshotVIPs     = 256
	maxSnapshotRules    = 1024
	maxSnapshotNodes    = MaxHostPriority
	maxSnapshotNodeRule = maxSnapshotRules // settings per node
)

func decodeSnapshot(r io.Reader) (*snapshotData, error) {
	b, err := io.ReadAll(io.LimitReader(r, maxSnapshotSize+1))
	if err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	if len(b) > maxSnapshotSize {
		return nil, fmt.Errorf("restore rules snapshot: over %d bytes", maxSnapshotSize)
	}
	if len(b) == 0 {
		return nil, fmt.Errorf("restore rules snapshot: empty")
	}
	if b[0] != snapshotVersion {
		return nil, fmt.Errorf("restore rules snapshot: unsupported version %d", b[0])
	}
	d := new(snapshotData)
	if err := json.Unmarshal(b[1:], d); err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	if d.State == nil {
		return nil, fmt.Errorf("restore rules snapshot: no state")
	}
	if err := d.checkCounts(); err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	if err := d.State.validate(); err != nil {
		return nil, fmt.Errorf("restore rules snapshot: %w", err)
	}
	return d, nil
}

// checkCounts checks the sizes of everything in a decoded snapshot, before
// any validation whose cost grows with them.
func (d *snapshotData) checkCounts() error {
	s := d.State
	switch {
	case len(d.Recent) > maxRecent:
		return fmt.Errorf("%w: %d recent results, over %d", ErrInvalid, len(d.Recent), maxRecent)
	case len(s.VIPs) > maxSnapshotVIPs:
		return fmt.Errorf("%w: %d vips, over %d", ErrInvalid, len(s.VIPs), maxSnapshotVIPs)
	case len(s.Rules) > maxSnapshotRules:
		return fmt.Errorf("%w: %d rules, over %d", ErrInvalid, len(s.Rules), maxSnapshotRules)
	case len(s.Nodes) > maxSnapshotNodes:
		return fmt.Errorf("%w: %d nodes, over %d", ErrInvalid, len(s.Nodes), maxSnapshotNodes)
	}
	for i := range s.Nodes {
		if n := len(s.Nodes[i].Rules); n > maxSnapshotNodeRule {
			return fmt.Errorf("%w: node %d has settings for %d rules, over %d", ErrInvalid, s.Nodes[i].ID, n, maxSnapshotNodeRule)
		}
	}
	return nil
}

// snapshot is a point-in-time copy of the FSM; Persist does the IO.
type snapshot struct {
	data snapshotData
}

// Persist implements raft.FSMSnapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	err := func() error {
		if _, err := sink.Write([]byte{snapshotVersion}); err != nil {
			return err
		}
		return json.NewEncoder(sink).Encode(s.data)
	}()
	if err != nil {
		sink.Cancel()
		return fmt.Errorf("persist rules snapshot: %w", err)
	}
	return sink.Close()
}

// Release implements raft.FSMSnapshot.
func (*snapshot) Release() {}
