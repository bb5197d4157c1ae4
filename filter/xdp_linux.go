//go:build linux

package filter

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

const (
	maxSlots = MaxRules + 1
	vipDir   = 256 // VIP directory entries per version, by last octet
	// tableVersions is how many copies of every table the program has
	// (NUM_VERSIONS in xdp/shoal.c).
	tableVersions = 3
	// handShift places a bucket's hand-over index above its state (ST_MASK,
	// HAND_SHIFT); handedCounter indexes the SYNs handed over (C_HANDED),
	// the next two those handed in (C_HANDED_IN, C_HANDED_REFUSED).
	handShift     = 2
	handedCounter = int(NumDropReasons)
)

// noVersion stands for no table version.
const noVersion = ^uint32(0)

// retirement is the wait until no packet is judged by a table version.
type retirement struct {
	done chan struct{}
	err  error // set before done is closed
}

// AttachMode is how the program is attached to an interface.
type AttachMode string

// Attach modes.
const (
	AttachNone    AttachMode = ""        // not attached
	AttachNative  AttachMode = "native"  // in the driver (XDP_FLAGS_DRV_MODE)
	AttachTC      AttachMode = "tc"      // tc ingress through tcx: the tc build, accepted skbs marked the host's
	AttachGeneric AttachMode = "generic" // on the skb (XDP_FLAGS_SKB_MODE), where tcx is missing
)

// XDP is the loaded data plane: the program, its tables and, once
// attached, its link to an interface. Its methods are safe for concurrent
// use.
type XDP struct {
	mu   sync.Mutex
	objs shoalObjects
	// tc is the tc-ingress build over objs' maps, loaded when first
	// attached that way (nil until then).
	tc      *shoalTcObjects
	link    link.Link
	mode    AttachMode
	version uint32                  // the version packets are judged by
	slots   map[RuleID]uint32       // rule -> table slot and counter index
	vipDir  [tableVersions][]uint32 // vips entries that may hold VIPs, per version
	vip6Dir [tableVersions][]uint32 // the same of vips6
	// prevSlots are the slots of the version before the active one, which
	// packets may still be counted by while it retires.
	prevSlots map[RuleID]uint32
	// retired[v] says when no packet is judged by version v any more,
	// since the flip away from it or since no version names it as its
	// prev (nil: never used, or known retired).
	retired [tableVersions]*retirement
	// written[v] is the tables version v holds (nil: none, or half
	// written); flips counts the flips, and left[v] is the flip that made
	// v inactive, so the version written next is the one left longest ago.
	written [tableVersions]*Tables
	flips   uint64
	left    [tableVersions]uint64
	// prevOf is the version the active one judges remapped SYNs by (its
	// settings' prev), which no Update writes; noVersion: none.
	prevOf  uint32
	hbPeers map[shoalHbPeer]bool
	members map[uint32]bool // fwd_stats keys: the members forwarded packets are taken from
	// ifindex is the interface attached to (0: none); egress the MSS
	// clamp at its tcx egress, attached while the tables forward.
	ifindex int
	egress  link.Link
	// pendingEgress is an MSS clamp link adopted from pins, moved to this
	// program by the first tables that forward.
	pendingEgress link.Link
	clampErr      error // the clamp could not be attached (ForwardCounters)
	// pending is a link adopted from pins (LoadPinnedXDP), attached with
	// pendingMode; Attach moves it to this program.
	pending     link.Link
	pendingMode AttachMode
	pinned      bool // Pin pinned everything; Release leaves it in the kernel

	// putVIPs writes one VIP directory entry; tests make it fail.
	putVIPs func(key uint32, vb *shoalVipBucket) error
	// noTCX attaches as on a kernel without tcx (tests).
	noTCX bool
}

// LoadXDP loads the XDP program and its tables into the kernel. It judges
// nothing until Update gives it tables (until then all traffic passes), and
// sees no packets until Attach. Needs CAP_BPF and CAP_NET_ADMIN.
func LoadXDP() (*XDP, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("load xdp: remove memlock limit: %w", err)
	}
	x := &XDP{slots: map[RuleID]uint32{DefaultRule: 0}, hbPeers: map[shoalHbPeer]bool{}, members: map[uint32]bool{}, prevOf: noVersion}
	x.putVIPs = func(k uint32, vb *shoalVipBucket) error { return x.objs.Vips.Update(k, vb, ebpf.UpdateAny) }
	if err := loadShoalObjects(&x.objs, nil); err != nil {
		var ve *ebpf.VerifierError
		if errors.As(err, &ve) {
			return nil, fmt.Errorf("load xdp: %+v", ve)
		}
		return nil, fmt.Errorf("load xdp (are you root, on a kernel with BPF?): %w", err)
	}
	return x, nil
}

// Program returns the XDP program, for prog.Run and prog.Benchmark.
func (x *XDP) Program() *ebpf.Program { return x.objs.ShoalXdp }

// Run runs the program on frame (in the network namespace of the calling
// thread, which the socket lookup uses) and returns the XDP action and the
// frame as the program left it.
func (x *XDP) Run(frame []byte) (action uint32, out []byte, err error) {
	out = make([]byte, len(frame)+256)
	opts := ebpf.RunOptions{Data: frame, DataOut: out}
	ret, err := x.objs.ShoalXdp.Run(&opts)
	if err != nil {
		return 0, nil, fmt.Errorf("run xdp program: %w", err)
	}
	return ret, opts.DataOut, nil
}

// Attach attaches the program to interface ifname in a mode that delivers
// accepted packets to the stack: native XDP where the driver has it (not
// veth: native XDP on veth keeps the stale multicast packet type after the
// MAC rewrite, and TCP drops the packet), else the tc build on tc ingress
// (tcx), which judges the same frames after the skb is built and marks an
// accepted one as the host's; generic XDP only on a kernel without tcx
// (before 6.6). On veth, tc ingress costs 25-55 ns a packet less than
// generic XDP, which reallocates every skb for its headroom
// (docs/BENCHMARKS.md). Call Update first.
func (x *XDP) Attach(ifname string) error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.link != nil {
		return fmt.Errorf("attach xdp to %s: already attached", ifname)
	}
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return fmt.Errorf("attach xdp to %s: %w", ifname, err)
	}
	x.ifindex = ifc.Index
	if x.attachPending(ifname) {
		return nil
	}
	opts := link.XDPOptions{Program: x.objs.ShoalXdp, Interface: ifc.Index}
	if driverOf(ifname) != "veth" {
		opts.Flags = link.XDPDriverMode
		if l, err := link.AttachXDP(opts); err == nil {
			x.link, x.mode = l, AttachNative
			return nil
		}
	}
	l, tcErr := x.attachTC(ifc.Index)
	if tcErr == nil {
		x.link, x.mode = l, AttachTC
		return nil
	}
	opts.Flags = link.XDPGenericMode
	l, err = link.AttachXDP(opts)
	if err != nil {
		return fmt.Errorf("attach to %s: tc ingress: %v; generic xdp: %w", ifname, tcErr, err)
	}
	x.link, x.mode = l, AttachGeneric
	return nil
}

// attachTC attaches the tc build at tcx ingress of interface ifindex.
// Called with x.mu held.
func (x *XDP) attachTC(ifindex int) (link.Link, error) {
	if x.noTCX {
		return nil, errors.New("tcx not used")
	}
	prog, err := x.tcProgram()
	if err != nil {
		return nil, err
	}
	return link.AttachTCX(link.TCXOptions{Program: prog, Interface: ifindex, Attach: ebpf.AttachTCXIngress})
}

// tcProgram returns the tc build of the program, loading it over x's maps
// the first time. Called with x.mu held.
func (x *XDP) tcProgram() (*ebpf.Program, error) {
	if x.tc == nil {
		repl := map[string]*ebpf.Map{}
		for name, m := range mapFields(&x.objs.shoalMaps) {
			repl[name] = *m
		}
		var tc shoalTcObjects
		if err := loadShoalTcObjects(&tc, &ebpf.CollectionOptions{MapReplacements: repl}); err != nil {
			return nil, fmt.Errorf("load the tc build: %w", err)
		}
		x.tc = &tc
	}
	return x.tc.ShoalTc, nil
}

// attached returns the program the link runs (the XDP one or the tc
// build), nil if not attached. Called with x.mu held.
func (x *XDP) attached() *ebpf.Program {
	switch {
	case x.link == nil:
		return nil
	case x.mode == AttachTC:
		return x.tc.ShoalTc
	}
	return x.objs.ShoalXdp
}

// Attached says what is attached to interface ifname of the calling
// thread's network namespace, by any process: an XDP program (native or
// generic), a program at tcx ingress, or nothing.
func Attached(ifname string) (AttachMode, error) {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return AttachNone, fmt.Errorf("attached to %s: %w", ifname, err)
	}
	if xa := l.Attrs().Xdp; xa != nil && xa.Attached {
		if xa.AttachMode == xdpAttachedDrv {
			return AttachNative, nil
		}
		return AttachGeneric, nil
	}
	q, err := link.QueryPrograms(link.QueryOptions{Target: l.Attrs().Index, Attach: ebpf.AttachTCXIngress})
	if err != nil {
		return AttachNone, fmt.Errorf("attached to %s: %w", ifname, err)
	}
	if len(q.Programs) > 0 {
		return AttachTC, nil
	}
	return AttachNone, nil
}

// Mode returns how the program is attached, AttachNone when it is not.
func (x *XDP) Mode() AttachMode {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.mode
}

// Detach removes the program from its interface; the tables stay loaded.
func (x *XDP) Detach() error {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.egress != nil {
		x.egress.Close()
		x.egress = nil
	}
	if x.pendingEgress != nil {
		x.pendingEgress.Close()
		x.pendingEgress = nil
	}
	x.ifindex = 0
	if x.link == nil {
		return nil
	}
	x.link.Unpin() // a pinned link outlives its last descriptor
	err := x.link.Close()
	x.link, x.mode = nil, AttachNone
	if err != nil {
		return fmt.Errorf("detach xdp: %w", err)
	}
	return nil
}

// Close detaches the program and frees it and its tables.
func (x *XDP) Close() error {
	x.mu.Lock()
	for v := range uint32(tableVersions) {
		x.waitRetired(v) // the wait uses the barrier map
	}
	x.unpin()
	if x.pending != nil {
		x.pending.Close()
		x.pending = nil
	}
	x.mu.Unlock()
	err := x.Detach()
	if cerr := x.closeObjs(); cerr != nil && err == nil {
		err = fmt.Errorf("close xdp objects: %w", cerr)
	}
	return err
}

// closeObjs frees x's programs and tables; what a link or a pin still
// references lives on in the kernel.
func (x *XDP) closeObjs() error {
	var err error
	if x.tc != nil {
		err = x.tc.Close()
		x.tc = nil
	}
	return errors.Join(x.objs.Close(), err)
}

// Update makes t the tables packets are judged by, and ifMAC the
// destination MAC accepted frames get. The switch is atomic: it writes an
// inactive copy of every table and flips the index the program reads once
// per packet. When Update returns every packet that arrives is judged by t;
// a packet whose judgement began before the flip (an XDP run lasts well
// under a microsecond) may still finish under the old copy. The wait until
// no packet uses the old copy (an RCU grace period, 5-30 ms on a busy
// machine) runs in the background; there are three copies, so the copy the
// next Update writes is the one retired two flips ago, and two pushes in a
// row (a handoff's release, then its acquisition) never wait for it. On
// error the active tables are unchanged, and what was half written to the
// inactive copy is cleared by the next Update.
//
// t.Prev, when set, must be the tables of an earlier Update still held:
// the active ones or the Prev of the active ones. Their copy is then kept
// as it is, unwritten, for as long as the tables pushed name it as Prev
// (so a push meanwhile may wait for a flip to retire). When t.Prev is not
// held (the tables were adopted from a previous agent), remapped rules'
// SYNs are judged by t alone and none is handed over or kept: a gap, never
// a SYN taken twice.
func (x *XDP) Update(t *Tables, ifMAC net.HardwareAddr) error {
	c := t.Config
	switch {
	case len(ifMAC) != 6:
		return fmt.Errorf("update xdp tables: interface mac %q is not 6 bytes", ifMAC)
	case len(c.VIPs) > MaxVIPs:
		return fmt.Errorf("update xdp tables: %d VIPs, at most %d: %w", len(c.VIPs), MaxVIPs, ErrCapacity)
	case len(c.Rules) > MaxRules:
		return fmt.Errorf("update xdp tables: %d port rules, at most %d: %w", len(c.Rules), MaxRules, ErrCapacity)
	}
	for _, v := range c.VIPs {
		if err := checkFamily(v); err != nil {
			return fmt.Errorf("update xdp tables: vip %w", err)
		}
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	prev := noVersion
	if t.Prev != nil {
		for _, v := range []uint32{x.version, x.prevOf} {
			if v != noVersion && x.written[v] == t.Prev {
				prev = v
			}
		}
	}
	next := x.nextVersion(prev)
	if err := x.waitRetired(next); err != nil {
		return err
	}
	x.written[next] = nil
	remapped := t.Remapped()
	slots, fresh := x.assignSlots(c)
	for _, s := range fresh {
		if err := x.zeroCounters(s); err != nil {
			return err
		}
	}

	set := shoalSettings{Seed: c.Seed}
	copy(set.Mac[:], ifMAC)
	if prev != noVersion {
		set.Prev = uint8(prev + 1)
	}
	if t.Routed {
		set.Routed = 1
	}
	if err := x.objs.Settings.Update(next, &set, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update xdp settings: %w", err)
	}
	if err := x.objs.Hand.Update(next, &shoalHandTable{Mac: t.HandMACs}, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update xdp hand-over macs: %w", err)
	}
	ft, err := fwdTable(t)
	if err != nil {
		return err
	}
	if err := x.objs.Fwd.Update(next, ft, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("update xdp forwarding: %w", err)
	}
	var bt shoalBucketTable
	for id, s := range slots {
		ri := shoalRuleInfo{Id: uint32(id), Affinity: uint8(c.Affinity(id))}
		if remapped[id] {
			ri.Remap = 1
		}
		if r := c.Rule(id); r != nil && (r.Mode == ModeDisabled || r.State == RuleDisabled) {
			ri.Disabled = 1
		}
		key := next*maxSlots + s
		if err := x.objs.Rules.Update(key, &ri, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update xdp rule %d: %w", id, err)
		}
		// A rule without states is NOT_OWNED throughout; its hand-over
		// indexes still apply.
		bt = shoalBucketTable{}
		if st := t.States[id]; st != nil {
			for b, v := range st {
				bt.State[b] = uint8(v)
			}
		}
		if hand := t.HandTo[id]; hand != nil {
			for b, h := range hand {
				if h < MaxHandTo {
					bt.State[b] |= h << handShift
				}
			}
		}
		if err := x.objs.Buckets.Update(key, &bt, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update xdp buckets of rule %d: %w", id, err)
		}
		bt = shoalBucketTable{}
		if fw := t.Forward[id]; fw != nil && ft.Self != 0 {
			bt.State = *fw
		}
		if err := x.objs.FwdBuckets.Update(key, &bt, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update xdp forward targets of rule %d: %w", id, err)
		}
	}
	var every [2]*[65536]uint16 // ports of the every-VIP rules, by protocol
	for pi, p := range []Protocol{ProtoTCP, ProtoUDP} {
		every[pi] = new([65536]uint16)
		fillPorts(every[pi], c, netip.Addr{}, p, slots)
	}
	pt := new(shoalPortTable)
	for i, v := range c.VIPs {
		for pi, p := range []Protocol{ProtoTCP, ProtoUDP} {
			pt.Slot = *every[pi]
			fillPorts(&pt.Slot, c, v, p, slots)
			key := (next*MaxVIPs+uint32(i))*2 + uint32(pi)
			if err := x.objs.Ports.Update(key, pt, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("update xdp ports of vip %s: %w", v, err)
			}
		}
	}
	if err := x.writeVIPs(next, c.VIPs); err != nil {
		return err
	}
	if err := x.writeVIPs6(next, c.VIPs); err != nil {
		return err
	}

	// Without the clamp, full-size segments a peer forwards here would be
	// dropped as too big; the tables go in anyway (a data plane that takes
	// no tables would take nothing at all), and ForwardCounters says why.
	x.clampErr = x.clampMSS(ft.Mss4 != 0 || ft.Mss6 != 0)
	if err := x.objs.Active.Update(uint32(0), next, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("flip xdp tables: %w", err)
	}
	old, oldPin := x.version, x.prevOf
	x.version, x.prevSlots, x.slots, x.prevOf = next, x.slots, slots, prev
	x.written[next] = t
	x.flips++
	x.left[old] = x.flips
	x.retire(old)
	if oldPin != noVersion && oldPin != prev && oldPin != old {
		x.retire(oldPin) // packets judged by old may still look it up
	}
	return nil
}

// fwdTable returns the forwarding settings of t: all zero when t does not
// forward.
func fwdTable(t *Tables) (*shoalFwdTable, error) {
	ft := &shoalFwdTable{}
	if !t.Forwarding() {
		return ft, nil
	}
	if !t.Self.Unmap().Is4() {
		return nil, fmt.Errorf("update xdp tables: forwarding from %s: want an IPv4 address", t.Self)
	}
	if t.MTU < 0 || t.MTU > 65535 {
		return nil, fmt.Errorf("update xdp tables: mtu %d: want 0 to 65535", t.MTU)
	}
	ft.Self = wire4(t.Self.Unmap())
	for i, p := range t.Peers {
		if !p.IsValid() {
			continue
		}
		if !p.Unmap().Is4() {
			return nil, fmt.Errorf("update xdp tables: forward target %s: want an IPv4 address", p)
		}
		ft.Peer[i] = wire4(p.Unmap())
		ft.Mac[i] = t.PeerMACs[i]
	}
	ft.Mtu = uint16(t.MTU)
	ft.Mss4, ft.Mss6 = t.MSS()
	return ft, nil
}

// clampMSS attaches the MSS clamp to the interface's egress when on and
// it is not yet, and removes it when not on. Called with x.mu held.
func (x *XDP) clampMSS(on bool) error {
	if p := x.pendingEgress; p != nil {
		x.pendingEgress = nil
		if on && x.egress == nil && egressOn(p, x.ifindex) {
			if _, err := x.tcProgram(); err == nil && p.Update(x.tc.ShoalMss) == nil {
				x.egress = p
				return nil
			}
		}
		p.Close()
	}
	switch {
	case on && x.egress == nil && x.ifindex != 0:
		if x.noTCX {
			return errors.New("update xdp tables: forwarding needs tcx (Linux 6.6) for its MSS clamp")
		}
		if _, err := x.tcProgram(); err != nil {
			return fmt.Errorf("update xdp tables: mss clamp: %w", err)
		}
		l, err := link.AttachTCX(link.TCXOptions{Program: x.tc.ShoalMss, Interface: x.ifindex, Attach: ebpf.AttachTCXEgress})
		if err != nil {
			return fmt.Errorf("update xdp tables: attach the mss clamp at egress: %w", err)
		}
		x.egress = l
	case !on && x.egress != nil:
		err := x.egress.Close()
		x.egress = nil
		if err != nil {
			return fmt.Errorf("update xdp tables: detach the mss clamp: %w", err)
		}
	}
	return nil
}

// egressOn reports whether tcx link l is attached to interface ifindex.
func egressOn(l link.Link, ifindex int) bool {
	info, err := l.Info()
	if err != nil {
		return false
	}
	t := info.TCX()
	return t != nil && int(t.Ifindex) == ifindex
}

// SetMembers makes addrs (IPv4) the only sources a packet forwarded to
// this node is taken from (routed mode); one from another address is
// dropped and counted (ForwardCounters). Each member's forwarding counters
// start at zero when it is added.
func (x *XDP) SetMembers(addrs []netip.Addr) error {
	if len(addrs) > MaxHeartbeatPeers {
		return fmt.Errorf("set members: %d members, at most %d: %w", len(addrs), MaxHeartbeatPeers, ErrCapacity)
	}
	want := map[uint32]bool{}
	for _, a := range addrs {
		if !a.Unmap().Is4() {
			return fmt.Errorf("set members: %s is not IPv4", a)
		}
		want[wire4(a.Unmap())] = true
	}
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("set members: count cpus: %w", err)
	}
	zero := make([]shoalPeerCounters, n)
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range want {
		if !x.members[k] {
			if err := x.objs.FwdStats.Update(k, zero, ebpf.UpdateAny); err != nil {
				return fmt.Errorf("set members: %w", err)
			}
			x.members[k] = true
		}
	}
	for k := range x.members {
		if !want[k] {
			if err := x.objs.FwdStats.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("set members: %w", err)
			}
			delete(x.members, k)
		}
	}
	return nil
}

// PeerCounters counts what one member and this node forwarded to each
// other (routed mode).
type PeerCounters struct {
	Forwarded    uint64 // to the member, as its bucket's owner
	SecondChance uint64 // to the member, as a previous owner that may hold the connection
	Received     uint64 // from the member, decapsulated here
}

// ForwardCounters are the data plane's forwarding counts.
type ForwardCounters struct {
	Peers    map[netip.Addr]PeerCounters
	Foreign  uint64 // forwarded packets from an address that is no member's, or carrying no VIP traffic: dropped
	NoRoute  uint64 // not forwarded: no route or neighbour to the target, or an 802.1Q-tagged frame
	HopLimit uint64 // not forwarded: MaxHops made, or the target is this node
	TooBig   uint64 // not forwarded: over the MTU once encapsulated
	// Clamp is why the SYN-ACKs' MSS is not clamped though the tables
	// forward (no tcx on this kernel, say); "" when it is, or need not be.
	Clamp string
}

// ForwardCounters returns the forwarding counts, summed over CPUs.
func (x *XDP) ForwardCounters() (ForwardCounters, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := ForwardCounters{Peers: map[netip.Addr]PeerCounters{}}
	if x.clampErr != nil {
		out.Clamp = x.clampErr.Error()
	}
	var per []shoalPeerCounters
	for k := range x.members {
		if err := x.objs.FwdStats.Lookup(k, &per); err != nil {
			return out, fmt.Errorf("read forwarding counters: %w", err)
		}
		var pc PeerCounters
		for _, c := range per {
			pc.Forwarded += c.N[0]
			pc.SecondChance += c.N[1]
			pc.Received += c.N[2]
		}
		var b [4]byte
		binary.NativeEndian.PutUint32(b[:], k)
		out.Peers[netip.AddrFrom4(b)] = pc
	}
	for i, dst := range []*uint64{&out.Foreign, &out.NoRoute, &out.HopLimit, &out.TooBig} {
		var n []uint64
		if err := x.objs.FwdDrops.Lookup(uint32(i), &n); err != nil {
			return out, fmt.Errorf("read forwarding drops: %w", err)
		}
		for _, v := range n {
			*dst += v
		}
	}
	return out, nil
}

// nextVersion returns the version the next Update writes: neither the
// active one nor one a version in use names as prev (nor prev, which the
// new tables will), and of the others the one left longest ago.
func (x *XDP) nextVersion(prev uint32) uint32 {
	best := noVersion
	for v := range uint32(tableVersions) {
		if v == x.version || v == x.prevOf || v == prev {
			continue
		}
		if best == noVersion || x.left[v] < x.left[best] {
			best = v
		}
	}
	return best // never noVersion: at most two of three are excluded
}

// retire starts the wait until no packet is judged by version v.
func (x *XDP) retire(v uint32) {
	r := &retirement{done: make(chan struct{})}
	x.retired[v] = r
	go func() {
		r.err = x.barrier()
		close(r.done)
	}()
}

// barrier returns once every BPF program running when it was called has
// finished: a map-in-map update waits for that (synchronize_rcu).
func (x *XDP) barrier() error {
	if err := x.objs.Barrier.Update(uint32(0), x.objs.BarrierInner, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("wait for xdp programs after flip: %w", err)
	}
	return nil
}

// waitRetired waits until no packet is judged by version v any more, so
// that it may be written; if the background wait failed it waits again.
// Call it with mu held.
func (x *XDP) waitRetired(v uint32) error {
	r := x.retired[v]
	if r == nil {
		return nil
	}
	<-r.done
	if r.err != nil {
		if err := x.barrier(); err != nil {
			return err
		}
	}
	x.retired[v] = nil
	return nil
}

// writeVIPs fills the VIP directory of version v: VIPs grouped by the last
// octet of their address, each with its index in vips. If a write fails,
// every entry it touched stays listed in vipDir, so that the next write of
// v clears what this one half wrote.
func (x *XDP) writeVIPs(v uint32, vips []netip.Addr) error {
	byKey := map[uint32]*shoalVipBucket{}
	for _, k := range x.vipDir[v] {
		byKey[k] = &shoalVipBucket{} // clear what the last use of v left
	}
	var written []uint32
	for i, vip := range vips {
		if !vip.Is4() {
			continue
		}
		b := vip.As4()
		k := v*vipDir + uint32(b[3])
		vb := byKey[k]
		if vb == nil || vb.N == 0 {
			vb = &shoalVipBucket{}
			byKey[k] = vb
			written = append(written, k)
		}
		vb.Addr[vb.N] = binary.NativeEndian.Uint32(b[:]) // the bytes as they sit in the packet
		vb.Idx[vb.N] = uint8(i)
		vb.N++
	}
	touched := make([]uint32, 0, len(byKey))
	for k := range byKey {
		touched = append(touched, k)
	}
	x.vipDir[v] = touched
	for k, vb := range byKey {
		if err := x.putVIPs(k, vb); err != nil {
			return fmt.Errorf("update xdp vips: %w", err)
		}
	}
	x.vipDir[v] = written
	return nil
}

// writeVIPs6 fills the IPv6 VIP directory of version v as writeVIPs
// fills the IPv4 one, by the last byte of the address.
func (x *XDP) writeVIPs6(v uint32, vips []netip.Addr) error {
	byKey := map[uint32]*shoalVip6Bucket{}
	for _, k := range x.vip6Dir[v] {
		byKey[k] = &shoalVip6Bucket{}
	}
	var written []uint32
	for i, vip := range vips {
		if vip.Is4() {
			continue
		}
		b := vip.As16()
		k := v*vipDir + uint32(b[15])
		vb := byKey[k]
		if vb == nil || vb.N == 0 {
			vb = &shoalVip6Bucket{}
			byKey[k] = vb
			written = append(written, k)
		}
		for w := range 4 {
			vb.Addr[vb.N][w] = binary.NativeEndian.Uint32(b[4*w:])
		}
		vb.Idx[vb.N] = uint8(i)
		vb.N++
	}
	touched := make([]uint32, 0, len(byKey))
	for k := range byKey {
		touched = append(touched, k)
	}
	x.vip6Dir[v] = touched
	for k, vb := range byKey {
		if err := x.objs.Vips6.Update(k, vb, ebpf.UpdateAny); err != nil {
			return fmt.Errorf("update xdp ipv6 vips: %w", err)
		}
	}
	x.vip6Dir[v] = written
	return nil
}

// assignSlots gives each rule of c a table slot, keeping the slot a rule
// already has so its counters carry on. A new rule takes a slot no rule
// used in the active version or the one before if there is one, so that
// packets still being counted by an old version never land on it. fresh lists the new slots.
func (x *XDP) assignSlots(c *Config) (slots map[RuleID]uint32, fresh []uint32) {
	slots = map[RuleID]uint32{DefaultRule: 0}
	var inNew, inOld [maxSlots]bool
	inNew[0], inOld[0] = true, true
	for _, s := range x.slots {
		inOld[s] = true
	}
	for _, s := range x.prevSlots {
		inOld[s] = true
	}
	for _, r := range c.Rules {
		if s, ok := x.slots[r.ID]; ok {
			slots[r.ID] = s
			inNew[s] = true
		}
	}
	for _, r := range c.Rules {
		if _, ok := slots[r.ID]; ok {
			continue
		}
		s := pickSlot(&inNew, &inOld, true)
		if s == 0 {
			s = pickSlot(&inNew, &inOld, false)
		}
		slots[r.ID] = s
		inNew[s] = true
		fresh = append(fresh, s)
	}
	return slots, fresh
}

func pickSlot(inNew, inOld *[maxSlots]bool, avoidOld bool) uint32 {
	for s := uint32(1); s < maxSlots; s++ {
		if !inNew[s] && (!avoidOld || !inOld[s]) {
			return s
		}
	}
	return 0 // cannot happen: Update checked the rule count
}

// fillPorts writes into tbl, for every port, the slot of the rule of group
// (the rules for every VIP when vip is the zero Addr, else the rules for
// vip) that covers the port on protocol p, leaving other ports alone.
// Within a group the first rule in order wins, as in Config.Lookup, so
// rules are written last to first. Filling a table with the every-VIP
// group and then one VIP's group gives Config.Lookup's answer for that VIP.
func fillPorts(tbl *[65536]uint16, c *Config, vip netip.Addr, p Protocol, slots map[RuleID]uint32) {
	for i := len(c.Rules) - 1; i >= 0; i-- {
		r := &c.Rules[i]
		if r.VIP != vip || r.Proto&p == 0 {
			continue
		}
		s := uint16(slots[r.ID])
		for port := int(r.PortLo); port <= int(r.PortHi); port++ {
			tbl[port] = s
		}
	}
}

func (x *XDP) zeroCounters(slot uint32) error {
	n, err := ebpf.PossibleCPU()
	if err != nil {
		return fmt.Errorf("count cpus: %w", err)
	}
	zero := make([]shoalCounters, n)
	if err := x.objs.Counters.Update(slot, zero, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("reset xdp counters of slot %d: %w", slot, err)
	}
	return nil
}

// Counters returns the packets judged so far, summed over CPUs, by rule of
// the current tables. A removed rule's counts go with it.
func (x *XDP) Counters() (Counters, error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	out := make(Counters, len(x.slots))
	var per []shoalCounters
	for id, s := range x.slots {
		if err := x.objs.Counters.Lookup(s, &per); err != nil {
			return nil, fmt.Errorf("read xdp counters of rule %d: %w", id, err)
		}
		var rc RuleCounters
		for _, c := range per {
			rc.Accepted += c.N[0]
			for r := 1; r < int(NumDropReasons); r++ {
				rc.Dropped[r] += c.N[r]
			}
			rc.HandedOver += c.N[handedCounter]
			rc.HandedIn += c.N[handedCounter+1]
			rc.HandedRefused += c.N[handedCounter+2]
			rc.Forwarded += c.N[handedCounter+3]
		}
		out[id] = rc
	}
	return out, nil
}

// driverOf returns the kind of link ifname is ("veth", "device", ...), or
// "" when it cannot tell.
func driverOf(ifname string) string {
	l, err := netlink.LinkByName(ifname)
	if err != nil {
		return ""
	}
	return l.Type()
}

// RenewLease pushes the data-plane lease's deadline to d from now (on the
// kernel's monotonic clock, which bpf_ktime_get_ns reads). Once the deadline
// passes without another renewal, the program treats owned and owned-dirty
// buckets as draining: it takes no new connections and keeps the ones this
// node holds. Call it every heartbeat period with d about (T-1) periods, so
// a stalled agent stops taking new connections before its peers declare it
// dead and take its buckets. A d <= 0 ends the lease at once. Until the
// first call there is no lease and owned buckets stay owned.
func (x *XDP) RenewLease(d time.Duration) error {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return fmt.Errorf("renew xdp lease: read the monotonic clock: %w", err)
	}
	deadline := max(ts.Nano()+d.Nanoseconds(), 1) // 0 would mean no lease
	if err := x.objs.Lease.Update(uint32(0), uint64(deadline), ebpf.UpdateAny); err != nil {
		return fmt.Errorf("renew xdp lease: %w", err)
	}
	return nil
}

// SetHeartbeatPeers makes the program drop UDP sent to self (this node's
// heartbeat socket; an unspecified address stands for every local address)
// unless it comes from one of peers (the registered peers' heartbeat
// sockets, from which they send), counting the drops (HeartbeatDrops). A
// zero self turns the check off. Heartbeats of strangers then never reach
// the agent's socket, its HMAC check or its logs.
func (x *XDP) SetHeartbeatPeers(self netip.AddrPort, peers []netip.AddrPort) error {
	if len(peers) > MaxHeartbeatPeers {
		return fmt.Errorf("set heartbeat peers: %d peers, at most %d: %w", len(peers), MaxHeartbeatPeers, ErrCapacity)
	}
	var conf shoalHbConf
	if self.Port() != 0 {
		if !self.Addr().Unmap().Is4() && !self.Addr().IsUnspecified() {
			return fmt.Errorf("set heartbeat peers: own address %s is not IPv4", self)
		}
		if a := self.Addr().Unmap(); a.Is4() && !a.IsUnspecified() {
			conf.Addr = wire4(a)
		}
		conf.Port = wirePort(self.Port())
	}
	want := map[shoalHbPeer]bool{}
	for _, p := range peers {
		a := p.Addr().Unmap()
		if !a.Is4() {
			return fmt.Errorf("set heartbeat peers: peer %s is not IPv4", p)
		}
		want[shoalHbPeer{Addr: wire4(a), Port: wirePort(p.Port())}] = true
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	// New peers first, then the check, then stale peers out: a peer in
	// both the old and new sets is never refused.
	for k := range want {
		if !x.hbPeers[k] {
			if err := x.objs.HbPeers.Update(k, uint8(1), ebpf.UpdateAny); err != nil {
				return fmt.Errorf("set heartbeat peers: %w", err)
			}
			x.hbPeers[k] = true
		}
	}
	if err := x.objs.HbConf.Update(uint32(0), &conf, ebpf.UpdateAny); err != nil {
		return fmt.Errorf("set heartbeat port: %w", err)
	}
	for k := range x.hbPeers {
		if !want[k] {
			if err := x.objs.HbPeers.Delete(k); err != nil && !errors.Is(err, ebpf.ErrKeyNotExist) {
				return fmt.Errorf("set heartbeat peers: %w", err)
			}
			delete(x.hbPeers, k)
		}
	}
	return nil
}

// HeartbeatDrops returns how many packets to this node's heartbeat socket
// the program dropped because they came from no registered peer.
func (x *XDP) HeartbeatDrops() (uint64, error) {
	var per []uint64
	if err := x.objs.HbDrops.Lookup(uint32(0), &per); err != nil {
		return 0, fmt.Errorf("read xdp heartbeat drops: %w", err)
	}
	var n uint64
	for _, v := range per {
		n += v
	}
	return n, nil
}

// wire4 returns an IPv4 address as the program compares it: its bytes in
// packet order read as a native-endian word.
func wire4(a netip.Addr) uint32 {
	b := a.As4()
	return binary.NativeEndian.Uint32(b[:])
}

// wirePort returns a port in network byte order, read as a native word.
func wirePort(p uint16) uint16 {
	var b [2]byte
	binary.BigEndian.PutUint16(b[:], p)
	return binary.NativeEndian.Uint16(b[:])
}
