package heartbeat

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestLeaving: a leaving node leaves its own view and releases at once,
// tells its peers at once, and is released once they all advertise a view
// without it; a peer drops a leaving node at once and acquires without a
// hold.
func TestLeaving(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	h.local.Leaving = true
	t1 := now.Add(10 * time.Millisecond)
	h.m.SetLocal(t1, h.local)
	st := h.m.Status()
	if st.View.Has(1) || toyCount(st.Accept) != 0 || h.m.NextSend().After(t1) {
		t.Fatalf("leaving: view %v accept %d next send %v; want out, empty, at once", st.View.Eligible, toyCount(st.Accept), h.m.NextSend())
	}
	if st.Released {
		t.Fatal("released before the peer advertised a view without this node")
	}
	if msg := h.m.Outgoing(t1); !msg.Leaving {
		t.Error("the heartbeat does not say it is leaving")
	}
	h.recv(t1.Add(time.Millisecond), h.hb(2, 2))
	if !h.m.Status().Released {
		t.Error("not released once the only peer advertises {2}")
	}

	// Two nodes stopped at once: the other one's view still holds this
	// node (it left only its own), but a leaving peer takes nothing again,
	// so this node need not wait T periods for it to die.
	b := newHarness(t, 1, 2)
	now = converge2(b)
	b.local.Leaving = true
	b.m.SetLocal(now.Add(time.Millisecond), b.local)
	both := b.hb(2, 1)
	both.Leaving = true
	b.recv(now.Add(2*time.Millisecond), both)
	if !b.m.Status().Released {
		t.Error("not released while the only peer, leaving too, advertises {1}")
	}

	// The peer's side.
	g := newHarness(t, 1, 2)
	now = converge2(g)
	leave := g.hb(2, 1)
	leave.Leaving = true
	g.recv(now.Add(5*time.Millisecond), leave)
	g.step(now.Add(6 * time.Millisecond))
	st = g.m.Status()
	if !slices.Equal(st.View.Eligible, []uint32{1}) || toyCount(st.Accept) != 16 {
		t.Fatalf("peer left: view %v accept %d, want {1} with all 16 at once", st.View.Eligible, toyCount(st.Accept))
	}
}

// TestRestartWindow: a peer that announces a restart stays in the view,
// silent, for its window (not for ever), and its new incarnation takes over
// once settled.
func TestRestartWindow(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	bye := h.hb(2, 1, 2)
	bye.RestartWindow = 2 * time.Second
	last := now.Add(5 * time.Millisecond)
	h.recv(last, bye)
	h.runTo(last.Add(10 * tP)) // T = 6 periods: it would be dead by now
	st := h.m.Status()
	if !st.View.Has(2) || st.Deaths != 0 || !st.Peers[0].Restarting || toyCount(st.Accept) != 8 {
		t.Fatalf("in the window: view %v deaths %d restarting %v accept %d; want it kept with its buckets", st.View.Eligible, st.Deaths, st.Peers[0].Restarting, toyCount(st.Accept))
	}
	// The new incarnation, still listening: the old one is kept.
	h.incs[2], h.seqs[2] = 2, 0
	hello := h.hb(2, 2)
	hello.Settled = false
	h.recv(last.Add(11*tP), hello)
	if st := h.m.Status(); !st.View.Has(2) || st.Excluded {
		t.Fatalf("new incarnation listening: view %v excluded %v; want it kept, no yield", st.View.Eligible, st.Excluded)
	}
	h.recv(last.Add(12*tP), h.hb(2, 1, 2))
	if st := h.m.Status(); st.Peers[0].Restarting || !st.View.Has(2) {
		t.Fatalf("new incarnation settled: restarting %v view %v", st.Peers[0].Restarting, st.View.Eligible)
	}

	// A restart that does not come back in time is a failure.
	g := newHarness(t, 1, 2)
	now = converge2(g)
	bye = g.hb(2, 1, 2)
	bye.RestartWindow = time.Second
	g.recv(now, bye)
	g.runTo(now.Add(time.Second - time.Millisecond))
	if !g.m.Status().View.Has(2) {
		t.Fatal("dropped before the window ended")
	}
	g.runTo(now.Add(time.Second))
	if st := g.m.Status(); st.View.Has(2) || st.Deaths != 1 {
		t.Fatalf("after the window: view %v deaths %d; want it gone, one death", st.View.Eligible, st.Deaths)
	}
}

// TestProbesAndDeafness: a peer silent for T/2 is a suspect until probed;
// a node that hears nobody while a probe finds a peer alive is deaf: not
// eligible, not settled, and says so.
func TestProbesAndDeafness(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	last := now.Add(time.Millisecond)
	h.step(last.Add(3*tP - time.Millisecond))
	if len(h.m.Suspects()) != 0 {
		t.Fatal("suspect before T/2 silent periods")
	}
	h.step(last.Add(3 * tP))
	if got := h.m.Status().Suspects; !slices.Equal(got, []uint32{2}) {
		t.Fatalf("suspects %v after T/2 silent periods, want [2]", got)
	}
	h.m.Probe(last.Add(3*tP+time.Millisecond), 2, ProbeAlive)
	if len(h.m.Suspects()) != 0 {
		t.Fatal("still a suspect right after a probe")
	}
	h.step(last.Add(6*tP + time.Millisecond)) // dead
	st := h.m.Status()
	if !st.Deaf || st.Settled || st.View.Has(1) || toyCount(st.Accept) != 0 {
		t.Fatalf("hears nobody, peer alive: deaf %v settled %v view %v accept %d", st.Deaf, st.Settled, st.View.Eligible, toyCount(st.Accept))
	}
	if msg := h.m.Outgoing(last.Add(6*tP + 2*time.Millisecond)); !msg.Deaf || msg.Settled {
		t.Errorf("heartbeat of a deaf node: deaf %v settled %v", msg.Deaf, msg.Settled)
	}
}

// TestMutualReachability: of two nodes that do not hear each other, only
// one stays in the view, the same at every node: the one that fails to hear
// the other goes, or on a tie the higher id.
func TestMutualReachability(t *testing.T) {
	h := newHarness(t, 1, 2, 3)
	now := converge2(h)
	h.step(now.Add(3 * time.Millisecond))
	// 3 does not hear 2; 2 hears 3.
	m2, m3 := h.hb(2, 1, 2, 3), h.hb(3, 1, 2, 3)
	m3.Acks = slices.DeleteFunc(m3.Acks, func(a Ack) bool { return a.Node == 2 })
	h.recv(now.Add(4*time.Millisecond), m2)
	h.recv(now.Add(5*time.Millisecond), m3)
	if got := h.m.View().Eligible; !slices.Equal(got, []uint32{1, 2}) {
		t.Fatalf("3 deaf to 2: view %v, want [1 2]", got)
	}
	// Neither hears the other: the higher id goes.
	m2 = h.hb(2, 1, 2)
	m2.Acks = slices.DeleteFunc(m2.Acks, func(a Ack) bool { return a.Node == 3 })
	h.recv(now.Add(6*time.Millisecond), m2)
	if got := h.m.View().Eligible; !slices.Equal(got, []uint32{1, 2}) {
		t.Fatalf("2 and 3 cut both ways: view %v, want [1 2]", got)
	}
}

func TestLoadIncarnation(t *testing.T) {
	dir := t.TempDir()
	first, err := LoadIncarnation(dir)
	if err != nil {
		t.Fatal(err)
	}
	if first < uint64(time.Now().Unix()) {
		t.Errorf("first incarnation %d is below the clock's seconds", first)
	}
	prev := first
	for range 3 {
		inc, err := LoadIncarnation(dir)
		if err != nil {
			t.Fatal(err)
		}
		if inc != prev+1 {
			t.Errorf("incarnation %d after %d, want +1", inc, prev)
		}
		prev = inc
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("data dir holds %d files, want only %s", len(entries), IncarnationFile)
	}
	if err := os.WriteFile(filepath.Join(dir, IncarnationFile), []byte("junk"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := LoadIncarnation(dir); err == nil || !strings.Contains(err.Error(), "damaged") {
		t.Errorf("damaged file: err %v, want a clear error", err)
	}
	if _, err := LoadIncarnation(filepath.Join(dir, "missing", "dir")); err == nil {
		t.Error("no error for a data dir that does not exist")
	}
}

// TestKeyring: rotation as the agent does it: add the new key (both
// accepted), make it primary (signed with it, old still accepted), remove
// the old one (old rejected).
func TestKeyring(t *testing.T) {
	oldKey, newKey := simKey, bytes.Repeat([]byte{7}, KeySize)
	kr, err := NewKeyring(oldKey)
	if err != nil {
		t.Fatal(err)
	}
	msg := &Message{ClusterID: 1, Node: 2, Incarnation: 1, Seq: 1}
	signedOld, _ := Encode(msg, kr)
	both, err := kr.Add(newKey)
	if err != nil {
		t.Fatal(err)
	}
	if both.Primary() != KeyID(oldKey) || !slices.Equal(both.IDs(), []uint32{KeyID(oldKey), KeyID(newKey)}) {
		t.Fatalf("after Add: primary %08x ids %x", both.Primary(), both.IDs())
	}
	rotated, err := both.SetPrimary(KeyID(newKey))
	if err != nil {
		t.Fatal(err)
	}
	signedNew, _ := Encode(msg, rotated)
	for _, c := range []struct {
		name string
		kr   *Keyring
		wire []byte
		want error
	}{
		{"old under old", kr, signedOld, nil},
		{"new under old only", kr, signedNew, ErrUnknownKey},
		{"old under both", rotated, signedOld, nil},
		{"new under both", both, signedNew, nil},
	} {
		got, err := Decode(c.wire, c.kr, 1)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: err %v, want %v", c.name, err, c.want)
		}
		if err == nil && got.Node != 2 {
			t.Errorf("%s: decoded %+v", c.name, got)
		}
	}
	if _, err := rotated.Remove(KeyID(newKey)); err == nil {
		t.Error("removed the primary key")
	}
	newOnly, err := rotated.Remove(KeyID(oldKey))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Decode(signedOld, newOnly, 1); !errors.Is(err, ErrUnknownKey) {
		t.Errorf("old key removed: err %v, want ErrUnknownKey", err)
	}
	if _, err := kr.SetPrimary(KeyID(newKey)); err == nil {
		t.Error("made primary a key the keyring does not hold")
	}
	if _, err := kr.Add(oldKey[:16]); err == nil {
		t.Error("added a short key")
	}
	full := kr
	for i := range MaxKeys {
		if full, err = full.Add(bytes.Repeat([]byte{byte(i + 20)}, KeySize)); err != nil && i < MaxKeys-1 {
			t.Fatal(err)
		}
	}
	if err == nil {
		t.Errorf("a keyring took more than %d keys", MaxKeys)
	}
}

// TestInherit: a node restarting after a restart window keeps the
// accepting set its previous incarnation left while it listens, then the
// usual rules apply: what its first view gives it is kept, the rest is
// released at once; if the window ends first, it is dropped.
func TestInherit(t *testing.T) {
	full := toyOwned(1)(View{Eligible: []uint32{1, 2, 3}, RulesIndex: 5, Seed: 9}) // 6 of 16
	stopped := func(h *harness, id uint32, elig ...uint32) *Message {
		m := h.hb(id, elig...)
		m.Admin = Stopped
		return m
	}
	for _, tc := range []struct {
		name string
		// peer3 is peer 3's heartbeat: nil while it stays silent.
		peer3      func(h *harness) *Message
		until      time.Time
		wantListen int // accepted while listening (heard 2 only)
		wantAfter  int // once peer 3 is heard, or at 6 periods
		wantOwn    int // once converged
	}{
		{"same view after settling", func(h *harness) *Message { return h.hb(3, 1, 2, 3) }, at(50), 6, 6, 6},
		{"a peer left meanwhile", func(h *harness) *Message { return stopped(h, 3, 1, 2) }, at(50), 6, 3, 8},
		{"the window ends before settling", nil, at(4), 6, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, 1, 2, 3)
			h.m.Inherit(t0, full, tc.until)
			if st := h.m.Status(); !st.Inheriting || toyCount(st.Accept) != 6 || st.View.Has(1) {
				t.Fatalf("inherited: inheriting %v accept %d view %v", st.Inheriting, toyCount(st.Accept), st.View.Eligible)
			}
			h.step(at(0.5))
			h.recv(at(1), h.hb(2, 1, 2, 3))
			h.step(at(1.1))
			if st := h.m.Status(); toyCount(st.Accept) != tc.wantListen || st.Settled {
				t.Fatalf("listening, view %v: accept %d settled %v; want %d kept", st.View.Eligible, toyCount(st.Accept), st.Settled, tc.wantListen)
			}
			if w := h.m.Wake(); w.After(tc.until) {
				t.Errorf("Wake %v after the end of the inheritance %v", w, tc.until)
			}
			if tc.peer3 != nil {
				h.recv(at(2), tc.peer3(h))
				h.recv(at(2.1), h.hb(2, 1, 2, 3)) // hears 3 now
			}
			h.step(at(6.1))
			st := h.m.Status()
			if toyCount(st.Accept) != tc.wantAfter || st.Inheriting {
				t.Fatalf("after: view %v accept %d inheriting %v; want %d", st.View.Eligible, toyCount(st.Accept), st.Inheriting, tc.wantAfter)
			}
			if tc.peer3 == nil {
				return
			}
			// Converged on the view: it owns what the view gives it.
			h.recv(at(6.2), h.hb(2, st.View.Eligible...))
			h.recv(at(6.3), tc.peer3(h))
			h.step(at(6.4))
			if st := h.m.Status(); !st.Converged || toyCount(st.Accept) != tc.wantOwn {
				t.Errorf("converged %v on %v, accept %d; want %d", st.Converged, st.View.Eligible, toyCount(st.Accept), tc.wantOwn)
			}
		})
	}
	t.Run("a settled node inherits nothing", func(t *testing.T) {
		h := newHarness(t, 1, 2)
		now := converge2(h)
		h.m.Inherit(now, full, now.Add(time.Second))
		if st := h.m.Status(); st.Inheriting || toyCount(st.Accept) != 8 {
			t.Errorf("inheriting %v accept %d; want its own 8", st.Inheriting, toyCount(st.Accept))
		}
	})
}

// TestRestartAcked: a node announcing a restart window knows once every
// live peer acknowledges a heartbeat that carried it.
func TestRestartAcked(t *testing.T) {
	h := newHarness(t, 1, 2)
	now := converge2(h)
	h.local.RestartWindow = 2 * time.Second
	h.m.SetLocal(now, h.local)
	h.recv(now.Add(time.Millisecond), h.hb(2, 1, 2)) // acknowledges an older heartbeat
	if h.m.RestartAcked() {
		t.Fatal("acknowledged before any heartbeat carried the window")
	}
	msg := h.m.Outgoing(now.Add(2 * time.Millisecond))
	if msg.RestartWindow != 2*time.Second {
		t.Fatalf("heartbeat window %v, want 2s", msg.RestartWindow)
	}
	h.sent = msg.Seq
	h.recv(now.Add(3*time.Millisecond), h.hb(2, 1, 2))
	if !h.m.Status().RestartAcked {
		t.Error("not acknowledged after the peer acknowledged the announcement")
	}
	h.local.RestartWindow = 0
	h.m.SetLocal(now.Add(4*time.Millisecond), h.local)
	if h.m.RestartAcked() {
		t.Error("still acknowledged after the restart was called off")
	}
}
