package heartbeat

import (
	"slices"
	"time"
)

// Reachability. Every heartbeat lists the peers its sender hears (its
// acks). From its own hearing and the lists of the peers it hears, a node
// knows, for every pair of eligible nodes, whether each hears the other. Two
// nodes that do not both hear each other cannot both be in a view: of such a
// pair the rule below removes one, deterministically, so that every node
// with the same reports computes the same view. It removes the node with
// the most broken links among those left, then the one that fails to hear
// more nodes that hear it (a deaf side), then the higher id; and again until
// every pair left hears each other. Before all of these it removes a
// newcomer (a peer that became live within the last two periods, here)
// with a broken link between two others: that another node's last
// heartbeat does not acknowledge it yet says only that the heartbeat
// predates its return, and without this rule a member that hears
// everybody would be taken for the deaf side of a node coming back from a
// stall and dropped for a heartbeat. Not for links of this node's own: a
// node coming back itself finds every peer a newcomer, and must still
// leave itself out until they hear it. For the faults one meets (a link cut one
// or both ways, a deaf or mute node, a few links) that leaves a largest
// group of mutually hearing nodes.

// A node that every member reporting on it last heard T/2 periods ago or
// more (the acks' ages, and this node's own hearing) is silent everywhere:
// it is dying or dead, and the first node to declare it dead must not be
// taken for the deaf side of their broken link. Without this rule, each
// time a node died, every other node dropped the first peer to declare the
// death from its view (that peer heard one node fewer than the dead one
// claimed to hear), until it declared the death itself: on a busy 32-node
// lab that was a view change across the cluster for 100-500 ms, and the
// dropped peer, excluded, yielded all its buckets. Such a node goes first,
// before newcomers; a node heard recently by anyone is judged as before,
// so a link cut one way is not affected.

// reachCache remembers the last computation: recompute runs on every tick.
type reachCache struct {
	valid                bool
	version              uint64
	in, out, new, silent []uint32
}

// mutual returns the largest group of elig (sorted) in which every pair
// hears each other, chosen as described above.
func (m *Machine[S]) mutual(elig []uint32, now time.Time) []uint32 {
	var fresh []uint32 // the newcomers among elig
	for _, id := range elig {
		if p := m.peers[id]; id != m.cfg.Self && p != nil && now.Sub(p.liveSince) < m.period(2) {
			fresh = append(fresh, id)
		}
	}
	silent := m.silentEverywhere(elig, now)
	if c := &m.reach; c.valid && c.version == m.version && slices.Equal(c.in, elig) && slices.Equal(c.new, fresh) && slices.Equal(c.silent, silent) {
		return c.out
	}
	n := len(elig)
	hears := m.hearing(elig, now)
	broken := false
	for i := range n {
		for j := i + 1; j < n; j++ {
			broken = broken || !hears[i*n+j] || !hears[j*n+i]
		}
	}
	out := elig
	if broken {
		left := make([]bool, n)
		for i := range left {
			left[i] = true
		}
		for {
			worst, ws, wn, wb, wd := -1, false, false, 0, 0
			for i := range n {
				if !left[i] {
					continue
				}
				b, d := 0, 0
				for j := range n {
					if j == i || !left[j] {
						continue
					}
					if !hears[i*n+j] || !hears[j*n+i] {
						b++
					}
					if hears[j*n+i] && !hears[i*n+j] {
						d++
					}
				}
				nc := slices.Contains(fresh, elig[i]) && brokenAmongOthers(hears, left, n, i, slices.Index(elig, m.cfg.Self))
				sl := slices.Contains(silent, elig[i])
				// Nodes silent everywhere first, then newcomers; ties go
				// to the later (higher) id.
				better := false
				switch {
				case worst < 0:
					better = true
				case sl != ws:
					better = sl
				case nc != wn:
					better = nc
				default:
					better = b > wb || (b == wb && d >= wd)
				}
				if b > 0 && better {
					worst, ws, wn, wb, wd = i, sl, nc, b, d
				}
			}
			if worst < 0 {
				break
			}
			left[worst] = false
		}
		out = nil
		for i, id := range elig {
			if left[i] {
				out = append(out, id)
			}
		}
	}
	m.reach = reachCache{valid: true, version: m.version, in: elig, out: out, new: fresh, silent: silent}
	return out
}

// silentEverywhere returns the peers of elig (sorted) that this node has
// not heard for T/2 periods or more and that every other member of elig
// that acknowledges them last heard T/2 periods ago or more, by its last
// heartbeat's ages. A peer kept through a restart window is never silent.
func (m *Machine[S]) silentEverywhere(elig []uint32, now time.Time) []uint32 {
	half := max(m.cfg.Tolerance/2, 1)
	var out []uint32
	for _, id := range elig {
		p := m.peers[id]
		if id == m.cfg.Self || p == nil || p.msg == nil || m.kept(p, now) || now.Sub(p.lastHeard) < m.period(half) {
			continue
		}
		heard := false
		for _, j := range elig {
			q := m.peers[j]
			if j == id || j == m.cfg.Self || q == nil || q.msg == nil {
				continue
			}
			if a, ok := ackOf(q.msg.Acks, id); ok && a.Incarnation == p.msg.Incarnation && int(a.Age) < half {
				heard = true
				break
			}
		}
		if !heard {
			out = append(out, id)
		}
	}
	return out
}

// brokenAmongOthers reports whether node i of the reachability matrix has
// a broken link, among the nodes left, with a node other than self (the
// index of this node; -1 when it is not eligible).
func brokenAmongOthers(hears, left []bool, n, i, self int) bool {
	for j := range n {
		if j != i && j != self && left[j] && (!hears[i*n+j] || !hears[j*n+i]) {
			return true
		}
	}
	return false
}

// hearing returns, for the sorted ids elig, which hears which, as far as
// this node knows: hears[i*n+j] says whether elig[i] hears elig[j], by its
// own hearing for itself and the last heartbeat's acks for a peer; a peer
// kept through a restart window is taken to hear and be heard. Each node's
// acks are sorted by node, as elig is, so one walk of them answers a whole
// row: at 50 nodes, filling the matrix pair by pair (map lookups and a
// binary search each) was a tenth of an agent's CPU in a lab's join storm
// (docs/BENCHMARKS-LOG.md).
func (m *Machine[S]) hearing(elig []uint32, now time.Time) []bool {
	n := len(elig)
	self := m.cfg.Self
	ps := make([]*peer, n)
	incs := make([]uint64, n)
	kept := make([]bool, n)
	for j, b := range elig {
		if b == self {
			incs[j] = m.cfg.Incarnation
			continue
		}
		ps[j], incs[j] = m.peers[b], m.seen[b].inc
		kept[j] = ps[j] != nil && m.kept(ps[j], now)
	}
	hears := make([]bool, n*n)
	for i, a := range elig {
		var acks []Ack
		if a != self {
			acks = ps[i].msg.Acks
		}
		k := 0
		for j, b := range elig {
			switch {
			case j == i:
			case kept[i] || kept[j]:
				hears[i*n+j] = true
			case a == self:
				hears[i*n+j] = ps[j].live
			default:
				for k < len(acks) && acks[k].Node < b {
					k++
				}
				hears[i*n+j] = k < len(acks) && acks[k].Node == b && acks[k].Incarnation == incs[j]
			}
		}
	}
	return hears
}
