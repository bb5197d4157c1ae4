//go:build linux

package filter

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/link"
	"github.com/cilium/ebpf/rlimit"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// A restarting agent pins its data plane (Pin, then Release) so that the
// program stays attached and its tables stay in the kernel while no agent
// runs; the next agent adopts it (LoadPinnedXDP). Pins exist only for that
// gap: an adopted data plane is unpinned at once, so an agent that dies
// later still takes its program with it (the node fails safe).

// Names in a pin directory besides the maps (pinned by their C names). A
// bpf filesystem holds nothing but objects and directories, so what the
// loader knew of the tables (Pinned) is kept by the caller.
const (
	pinProg   = "prog"
	pinLink   = "link"
	pinEgress = "egress" // the MSS clamp's link (routed forwarding)
)

// xdpAttachedDrv is IFLA_XDP_ATTACHED's value for a program in the driver.
const xdpAttachedDrv = 1

// programStamp names the embedded program: pinned tables are adopted only
// by a binary with the same program (and so the same table layout and
// meaning); another one loads fresh tables and takes over the link.
func programStamp() string {
	h := sha256.New()
	h.Write(_ShoalBytes)
	h.Write(_ShoalTcBytes)
	return hex.EncodeToString(h.Sum(nil)[:8])
}

// Adoption says what LoadPinnedXDP found.
type Adoption struct {
	// Link: a pinned link was found; Attach moves it to this program
	// (bpf_link_update) instead of attaching anew, so the interface is
	// never without a program.
	Link bool
	// Tables: the pinned tables were adopted as they are; packets are
	// judged by them until the next Update. Else the tables are fresh.
	Tables bool
	// MAC is the MAC accepted frames are rewritten to in adopted tables.
	MAC net.HardwareAddr
	// Lease is what is left of the adopted data-plane lease (0: none or
	// ended).
	Lease time.Duration
	// Why says why pinned tables were not adopted, if they were not.
	Why string
}

// LoadPinnedXDP loads the data plane, adopting what an agent left pinned in
// dir (see Pin): the tables when the program is the same, the link in any
// case. Stale pins (another program, a half-written directory) are
// replaced cleanly. The directory's pins are removed, so a later crash of
// this process takes the data plane with it. With nothing pinned it is
// LoadXDP.
func LoadPinnedXDP(dir string, rec *Pinned) (*XDP, Adoption, error) {
	var ad Adoption
	var old link.Link
	if l, err := link.LoadPinnedLink(filepath.Join(dir, pinLink), nil); err == nil {
		old, ad.Link = l, true
	}
	var egress link.Link
	if l, err := link.LoadPinnedLink(filepath.Join(dir, pinEgress), nil); err == nil {
		egress = l
	}
	var x *XDP
	switch {
	case rec == nil && !ad.Link:
		// Nothing pinned (or nothing usable): an ordinary start.
	case rec == nil:
		ad.Why = "no record of the pins"
	case rec.Program != programStamp():
		ad.Why = fmt.Sprintf("pinned by another program (%s, this is %s)", rec.Program, programStamp())
	case !ad.Link:
		ad.Why = "no pinned link"
	default:
		var err error
		if x, err = adoptTables(dir, *rec); err != nil {
			ad.Why, x = err.Error(), nil
		}
	}
	removePins(dir)
	if x == nil {
		var err error
		if x, err = LoadXDP(); err != nil {
			if old != nil {
				old.Close()
			}
			if egress != nil {
				egress.Close()
			}
			return nil, ad, err
		}
	} else {
		ad.Tables = true
		ad.MAC, ad.Lease = x.adoptedMAC(), x.leaseLeft()
	}
	x.unpin() // objects loaded from pins remember their paths
	if egress != nil {
		// Kept clamping the MSS until the first tables that forward move
		// it to this program (or that do not, remove it).
		egress.Unpin()
		x.pendingEgress = egress
	}
	if old != nil {
		old.Unpin()
		x.pending = old
		if rec != nil {
			x.pendingMode = AttachMode(rec.Mode)
		}
	}
	return x, ad, nil
}

// adoptTables loads this program over the pinned maps and takes the
// loader's state from the record.
func adoptTables(dir string, st Pinned) (*XDP, error) {
	if err := rlimit.RemoveMemlock(); err != nil {
		return nil, fmt.Errorf("remove memlock limit: %w", err)
	}
	repl := map[string]*ebpf.Map{}
	closeAll := func() {
		for _, m := range repl {
			m.Close()
		}
	}
	for name := range mapFields(&shoalMaps{}) {
		m, err := ebpf.LoadPinnedMap(filepath.Join(dir, name), nil)
		if err != nil {
			closeAll()
			return nil, fmt.Errorf("pinned map %s: %w", name, err)
		}
		repl[name] = m
	}
	x := &XDP{slots: st.Slots, vipDir: st.VIPDir, vip6Dir: st.VIP6Dir, hbPeers: map[shoalHbPeer]bool{}, members: map[uint32]bool{},
		prevOf: noVersion}
	x.putVIPs = func(k uint32, vb *shoalVipBucket) error { return x.objs.Vips.Update(k, vb, ebpf.UpdateAny) }
	err := loadShoalObjects(&x.objs, &ebpf.CollectionOptions{MapReplacements: repl})
	closeAll() // the objects hold their own references
	if err != nil {
		return nil, fmt.Errorf("load the program over the pinned maps: %w", err)
	}
	if x.slots == nil {
		x.slots = map[RuleID]uint32{}
	}
	x.slots[DefaultRule] = 0
	if err := x.objs.Active.Lookup(uint32(0), &x.version); err != nil {
		x.objs.Close()
		return nil, fmt.Errorf("read the active tables: %w", err)
	}
	if x.version != st.Version {
		x.objs.Close()
		return nil, fmt.Errorf("pinned tables at version %d, recorded %d", x.version, st.Version)
	}
	// The active tables may judge remapped SYNs by another version: it is
	// not written until a flip leaves it (the adopted tables are not known
	// as anyone's Prev, so the next Update leaves it).
	var set shoalSettings
	if err := x.objs.Settings.Lookup(x.version, &set); err != nil {
		x.objs.Close()
		return nil, fmt.Errorf("read the active settings: %w", err)
	}
	if p := uint32(set.Prev); p >= 1 && p <= tableVersions && p-1 != x.version {
		x.prevOf = p - 1
	}
	// The agent that pinned them may have flipped just before it stopped:
	// wait once until no packet is judged by an old copy, which the next
	// Update may write.
	if err := x.barrier(); err != nil {
		x.objs.Close()
		return nil, fmt.Errorf("adopt the pinned tables: %w", err)
	}
	var k shoalHbPeer
	var v uint8
	for it := x.objs.HbPeers.Iterate(); it.Next(&k, &v); {
		x.hbPeers[k] = true
	}
	// The members forwarded packets are taken from, with their counters.
	var m uint32
	var per []shoalPeerCounters
	for it := x.objs.FwdStats.Iterate(); it.Next(&m, &per); {
		x.members[m] = true
	}
	return x, nil
}

// mapFields returns the maps of ms by their C names.
func mapFields(ms *shoalMaps) map[string]**ebpf.Map {
	out := map[string]**ebpf.Map{}
	v := reflect.ValueOf(ms).Elem()
	for i := range v.NumField() {
		if name := v.Type().Field(i).Tag.Get("ebpf"); name != "" {
			out[name] = v.Field(i).Addr().Interface().(**ebpf.Map)
		}
	}
	return out
}

// removePins removes what a pin directory holds; objects still referenced
// (by this process, or a link by the interface) live on.
func removePins(dir string) {
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		os.Remove(filepath.Join(dir, e.Name()))
	}
	os.Remove(dir)
}

func (x *XDP) adoptedMAC() net.HardwareAddr {
	var set shoalSettings
	if err := x.objs.Settings.Lookup(x.version, &set); err != nil {
		return nil
	}
	return net.HardwareAddr(set.Mac[:])
}

// leaseLeft is what is left of the lease in the tables (0: none or ended).
func (x *XDP) leaseLeft() time.Duration {
	var deadline uint64
	var ts unix.Timespec
	if x.objs.Lease.Lookup(uint32(0), &deadline) != nil || unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts) != nil {
		return 0
	}
	return max(time.Duration(int64(deadline)-ts.Nano()), 0)
}

// Pin pins the program, its link and its tables in dir (on a bpf
// filesystem, mounted at /sys/fs/bpf if it is not), for the next agent to
// adopt (LoadPinnedXDP, given what Pinned returns after the last Update).
// Call Release next, instead of Close. On error nothing stays pinned.
func (x *XDP) Pin(dir string) (err error) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if x.link == nil {
		return errors.New("pin xdp: not attached")
	}
	removePins(dir)
	if err := mountBPF(dir); err != nil {
		return fmt.Errorf("pin xdp: %w", err)
	}
	defer func() {
		if err != nil {
			x.unpin()
			removePins(dir)
			err = fmt.Errorf("pin xdp: %w", err)
		}
	}()
	for name, m := range mapFields(&x.objs.shoalMaps) {
		if err := (*m).Pin(filepath.Join(dir, name)); err != nil {
			return err
		}
	}
	if err := x.attached().Pin(filepath.Join(dir, pinProg)); err != nil {
		return err
	}
	if err := x.link.Pin(filepath.Join(dir, pinLink)); err != nil {
		return err
	}
	if x.egress != nil {
		if err := x.egress.Pin(filepath.Join(dir, pinEgress)); err != nil {
			return err
		}
	}
	x.pinned = true
	return nil
}

// Pinned returns what LoadPinnedXDP needs beside the pins: call it after
// the last Update.
func (x *XDP) Pinned() *Pinned {
	x.mu.Lock()
	defer x.mu.Unlock()
	p := &Pinned{Program: programStamp(), Mode: string(x.mode), Version: x.version, Slots: maps.Clone(x.slots),
		VIPDir: x.vipDir, VIP6Dir: x.vip6Dir}
	for v := range p.VIPDir {
		p.VIPDir[v], p.VIP6Dir[v] = slices.Clone(p.VIPDir[v]), slices.Clone(p.VIP6Dir[v])
	}
	return p
}

// unpin removes every pin of x's objects (Unpin of an unpinned object does
// nothing).
func (x *XDP) unpin() {
	for _, m := range mapFields(&x.objs.shoalMaps) {
		if *m != nil {
			(*m).Unpin()
		}
	}
	if x.objs.ShoalXdp != nil {
		x.objs.ShoalXdp.Unpin()
	}
	if x.tc != nil {
		x.tc.ShoalTc.Unpin()
	}
	if x.link != nil {
		x.link.Unpin()
	}
	if x.egress != nil {
		x.egress.Unpin()
	}
	x.pinned = false
}

// Release lets go of the data plane without detaching it: what Pin pinned
// stays in the kernel, attached and judging packets by the last tables,
// after this process exits. Without Pin it is Close.
func (x *XDP) Release() error {
	x.mu.Lock()
	pinned := x.link != nil && x.pinned
	if pinned {
		x.link.Close()
		x.link, x.mode = nil, AttachNone
		if x.egress != nil {
			x.egress.Close() // pinned: it stays attached
			x.egress = nil
		}
	}
	x.mu.Unlock()
	if !pinned {
		return x.Close()
	}
	if err := x.closeObjs(); err != nil {
		return fmt.Errorf("release xdp objects: %w", err)
	}
	return nil
}

// attachPending moves an adopted link (LoadPinnedXDP) to this program when
// it is attached to ifname, and reports whether it did: an XDP link to the
// XDP program, a tcx link to the tc build. A link attached elsewhere, or
// one that refuses the update, is closed (detached). Called with x.mu held.
func (x *XDP) attachPending(ifname string) bool {
	old := x.pending
	if old == nil {
		return false
	}
	x.pending = nil
	mode, err := x.adoptLink(old, ifname)
	if err != nil {
		old.Close()
		return false
	}
	x.link, x.mode = old, mode
	return true
}

// adoptLink updates the adopted link l to this program and returns the
// mode it is attached in. Called with x.mu held.
func (x *XDP) adoptLink(l link.Link, ifname string) (AttachMode, error) {
	ifc, err := net.InterfaceByName(ifname)
	if err != nil {
		return AttachNone, err
	}
	info, err := l.Info()
	if err != nil {
		return AttachNone, err
	}
	switch xi, ti := info.XDP(), info.TCX(); {
	case xi != nil && int(xi.Ifindex) == ifc.Index:
		mode := x.pendingMode
		if mode != AttachNative && mode != AttachGeneric {
			mode = AttachGeneric
			if nl, err := netlink.LinkByName(ifname); err == nil && nl.Attrs().Xdp != nil && nl.Attrs().Xdp.AttachMode == xdpAttachedDrv {
				mode = AttachNative
			}
		}
		return mode, l.Update(x.objs.ShoalXdp)
	case ti != nil && int(ti.Ifindex) == ifc.Index:
		prog, err := x.tcProgram()
		if err != nil {
			return AttachNone, err
		}
		return AttachTC, l.Update(prog)
	}
	return AttachNone, fmt.Errorf("pinned link is not on %s", ifname)
}

// mountBPF makes sure dir exists on a bpf filesystem: when it cannot be
// made on one, it mounts one at /sys/fs/bpf (a host without systemd's
// mount) and tries again.
func mountBPF(dir string) error {
	if onBPF(dir) {
		return nil
	}
	const root = "/sys/fs/bpf"
	if !onBPF(root) {
		if err := unix.Mount("bpf", root, "bpf", 0, "mode=0700"); err != nil {
			return fmt.Errorf("%s is not on a bpf filesystem, and mounting one at %s failed: %w", dir, root, err)
		}
	}
	if !onBPF(dir) {
		return fmt.Errorf("%s is not on a bpf filesystem", dir)
	}
	return nil
}

// onBPF reports whether dir exists, or could be made, on a bpf filesystem.
func onBPF(dir string) bool {
	var fs unix.Statfs_t
	return os.MkdirAll(dir, 0o700) == nil && unix.Statfs(dir, &fs) == nil && fs.Type == unix.BPF_FS_MAGIC
}
