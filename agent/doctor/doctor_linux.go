package doctor

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"github.com/cilium/ebpf/features"
	"github.com/mdlayher/packet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/shoalnet/shoal/rules"
)

// Probe frames: the doctor's test of cluster MAC delivery. A frame to the
// cluster MAC with the IEEE local experimental EtherType, carrying a magic,
// the cluster id and a nonce. The XDP program passes it (not IP), and the
// agent's listener remembers the nonces it saw.
const (
	etherTypeProbe  = 0x88b5
	ethHeaderLen    = 14
	probeMagic      = "SHOALDR1"
	probePayloadLen = len(probeMagic) + 4 + 8
	ProbeWait       = time.Second // how long a node waits for a probe frame
	probeSeenMax    = 256         // nonces remembered
)

// FrameProbe sends and receives the doctor's probe frames on the cluster
// interface. Its goroutine owns the socket (reopened after a failure, as
// when the interface is recreated); seen is shared under mu.
type FrameProbe struct {
	ifname    string
	clusterID uint32
	ownMAC    func() net.HardwareAddr

	mu   sync.Mutex
	conn *packet.Conn
	seen map[uint64]time.Time
	wake chan struct{} // closed and replaced when a nonce arrives
}

func NewFrameProbe(ifname string, clusterID uint32, ownMAC func() net.HardwareAddr) *FrameProbe {
	return &FrameProbe{ifname: ifname, clusterID: clusterID, ownMAC: ownMAC, seen: map[uint64]time.Time{}, wake: make(chan struct{})}
}

// run receives probe frames until ctx ends.
func (f *FrameProbe) Run(ctx context.Context) {
	for ctx.Err() == nil {
		ifi, err := net.InterfaceByName(f.ifname)
		var c *packet.Conn
		if err == nil {
			c, err = packet.Listen(ifi, packet.Raw, etherTypeProbe, nil)
		}
		if err != nil {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		f.mu.Lock()
		f.conn = c
		f.mu.Unlock()
		stop := context.AfterFunc(ctx, func() { c.Close() })
		f.read(c)
		stop()
		c.Close()
		f.mu.Lock()
		f.conn = nil
		f.mu.Unlock()
	}
}

func (f *FrameProbe) read(c *packet.Conn) {
	buf := make([]byte, 256)
	for {
		n, _, err := c.ReadFrom(buf)
		if err != nil {
			return
		}
		p := buf[min(n, ethHeaderLen):n]
		if len(p) < probePayloadLen || string(p[:len(probeMagic)]) != probeMagic ||
			binary.BigEndian.Uint32(p[len(probeMagic):]) != f.clusterID {
			continue
		}
		nonce := binary.BigEndian.Uint64(p[len(probeMagic)+4:])
		f.mu.Lock()
		if len(f.seen) >= probeSeenMax {
			clear(f.seen)
		}
		f.seen[nonce] = time.Now()
		close(f.wake)
		f.wake = make(chan struct{})
		f.mu.Unlock()
	}
}

// send sends three probe frames with nonce to dst, 20 ms apart.
func (f *FrameProbe) Send(ctx context.Context, dst net.HardwareAddr, nonce uint64) error {
	f.mu.Lock()
	c := f.conn
	f.mu.Unlock()
	if c == nil {
		return errors.New("probe socket not open")
	}
	fr := make([]byte, ethHeaderLen, ethHeaderLen+probePayloadLen)
	copy(fr[0:6], dst)
	copy(fr[6:12], f.ownMAC())
	binary.BigEndian.PutUint16(fr[12:14], etherTypeProbe)
	fr = append(fr, probeMagic...)
	fr = binary.BigEndian.AppendUint32(fr, f.clusterID)
	fr = binary.BigEndian.AppendUint64(fr, nonce)
	for i := range 3 {
		if i > 0 {
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-time.After(20 * time.Millisecond):
			}
		}
		if _, err := c.WriteTo(fr, &packet.Addr{HardwareAddr: dst}); err != nil {
			return fmt.Errorf("send probe frame: %w", err)
		}
	}
	return nil
}

// waitSeen waits up to ProbeWait for nonce.
func (f *FrameProbe) WaitSeen(ctx context.Context, nonce uint64) bool {
	deadline := time.NewTimer(ProbeWait)
	defer deadline.Stop()
	for {
		f.mu.Lock()
		_, ok := f.seen[nonce]
		wake := f.wake
		f.mu.Unlock()
		if ok {
			return true
		}
		select {
		case <-wake:
		case <-deadline.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}

func NewNonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// KernelFeatures probes what the XDP program needs; attached says whether
// the agent holds its bpf_link.
func KernelFeatures(attached bool) []Feature {
	fs := []Feature{{Name: "BTF"}}
	if _, err := os.Stat("/sys/kernel/btf/vmlinux"); err != nil {
		fs[0].Err = fmt.Errorf("no /sys/kernel/btf/vmlinux")
	}
	fs = append(fs, Feature{Name: "XDP programs", Err: features.HaveProgramType(ebpf.XDP)})
	for _, h := range []struct {
		name string
		fn   asm.BuiltinFunc
	}{
		{"bpf_skc_lookup_tcp", asm.FnSkcLookupTcp}, {"bpf_tcp_check_syncookie", asm.FnTcpCheckSyncookie},
		{"bpf_sk_release", asm.FnSkRelease}, {"bpf_ktime_get_ns", asm.FnKtimeGetNs},
		{"bpf_map_lookup_elem", asm.FnMapLookupElem}, {"bpf_map_update_elem", asm.FnMapUpdateElem},
	} {
		fs = append(fs, Feature{Name: h.name, Err: features.HaveProgramHelper(ebpf.XDP, h.fn)})
	}
	// The tc build, attached at tc ingress where native XDP is not used.
	fs = append(fs, Feature{Name: "tc programs", Err: features.HaveProgramType(ebpf.SchedCLS)})
	for _, h := range []struct {
		name string
		fn   asm.BuiltinFunc
	}{{"bpf_skb_change_type", asm.FnSkbChangeType}, {"bpf_redirect", asm.FnRedirect}} {
		fs = append(fs, Feature{Name: h.name + " (tc)", Err: features.HaveProgramHelper(ebpf.SchedCLS, h.fn)})
	}
	fs = append(fs, Feature{Name: "LRU hash maps", Err: features.HaveMapType(ebpf.LRUHash)},
		Feature{Name: "per-CPU arrays", Err: features.HaveMapType(ebpf.PerCPUArray)})
	link := Feature{Name: "bpf_link for the data plane (XDP or tcx)"}
	if !attached {
		link.Err = errors.New("the agent holds no data-plane link")
	}
	return append(fs, link)
}

// LinkDriver returns ifname's link type (netlink) and driver (sysfs).
func LinkDriver(ifname string) (linkType, driver string) {
	if l, err := netlink.LinkByName(ifname); err == nil {
		linkType = l.Type()
	}
	if p, err := os.Readlink(filepath.Join("/sys/class/net", ifname, "device", "driver")); err == nil {
		driver = filepath.Base(p)
	}
	return linkType, driver
}

func ReadSysctl(key string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	return strings.TrimSpace(string(b)), err
}

// ClockSynced reports the kernel's NTP state (adjtimex, read only).
func ClockSynced() (bool, error) {
	var tx unix.Timex
	if _, err := unix.Adjtimex(&tx); err != nil {
		return false, fmt.Errorf("adjtimex: %w", err)
	}
	return tx.Status&unix.STA_UNSYNC == 0, nil
}

// CheckNeighbour is `shoal doctor --neighbor`: it checks this host's
// neighbour entries for vip (a client's or a Linux router's, no agent
// needed) against vip's cluster MAC in mode.
func CheckNeighbour(vip netip.Addr, mode rules.MACMode) (Check, error) {
	family := netlink.FAMILY_V4
	if vip.Is6() {
		family = netlink.FAMILY_V6
	}
	list, err := netlink.NeighList(0, family)
	if err != nil {
		return Check{}, fmt.Errorf("list neighbours: %w", err)
	}
	var entries []Neighbour
	for _, n := range list {
		ip, ok := netip.AddrFromSlice(n.IP)
		if !ok || ip.Unmap() != vip {
			continue
		}
		e := Neighbour{Interface: strconv.Itoa(n.LinkIndex), MAC: n.HardwareAddr, State: neighState(n.State)}
		if l, err := netlink.LinkByIndex(n.LinkIndex); err == nil {
			e.Interface = l.Attrs().Name
		}
		entries = append(entries, e)
	}
	return judgeNeighbour(vip, mode, entries), nil
}

func neighState(s int) string {
	for _, x := range []struct {
		bit  int
		name string
	}{
		{netlink.NUD_PERMANENT, "PERMANENT"}, {netlink.NUD_NOARP, "NOARP"}, {netlink.NUD_REACHABLE, "REACHABLE"},
		{netlink.NUD_STALE, "STALE"}, {netlink.NUD_DELAY, "DELAY"}, {netlink.NUD_PROBE, "PROBE"},
		{netlink.NUD_INCOMPLETE, "INCOMPLETE"}, {netlink.NUD_FAILED, "FAILED"},
	} {
		if s&x.bit != 0 {
			return x.name
		}
	}
	return "NONE"
}

// ProbeDst is where probe frames go: the cluster MAC of the first VIP (an
// IPv4 one if there is one) in the cluster's MAC mode.
func ProbeDst(st *rules.State) (net.HardwareAddr, error) {
	if len(st.VIPs) == 0 {
		return nil, errors.New("no VIP: no cluster MAC to probe")
	}
	v := firstIPv4(st.VIPs)
	if !v.IsValid() {
		v = st.VIPs[0]
	}
	return st.Settings.MACMode.ClusterMAC(v), nil
}
