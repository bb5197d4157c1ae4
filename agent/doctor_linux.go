package agent

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
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
	probeMagic      = "SHOALDR1"
	probePayloadLen = len(probeMagic) + 4 + 8
	probeWait       = time.Second // how long a node waits for a probe frame
	probeSeenMax    = 256         // nonces remembered
)

// frameProbe sends and receives the doctor's probe frames on the cluster
// interface. Its goroutine owns the socket (reopened after a failure, as
// when the interface is recreated); seen is shared under mu.
type frameProbe struct {
	ifname    string
	clusterID uint32
	ownMAC    func() net.HardwareAddr

	mu   sync.Mutex
	conn *packet.Conn
	seen map[uint64]time.Time
	wake chan struct{} // closed and replaced when a nonce arrives
}

func newFrameProbe(ifname string, clusterID uint32, ownMAC func() net.HardwareAddr) *frameProbe {
	return &frameProbe{ifname: ifname, clusterID: clusterID, ownMAC: ownMAC, seen: map[uint64]time.Time{}, wake: make(chan struct{})}
}

// run receives probe frames until ctx ends.
func (f *frameProbe) run(ctx context.Context) {
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

func (f *frameProbe) read(c *packet.Conn) {
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
func (f *frameProbe) send(ctx context.Context, dst net.HardwareAddr, nonce uint64) error {
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

// waitSeen waits up to probeWait for nonce.
func (f *frameProbe) waitSeen(ctx context.Context, nonce uint64) bool {
	deadline := time.NewTimer(probeWait)
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

func newNonce() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// probeDst is where probe frames go: the cluster MAC of the first VIP (an
// IPv4 one if there is one) in the cluster's MAC mode.
func probeDst(st *rules.State) (net.HardwareAddr, error) {
	if len(st.VIPs) == 0 {
		return nil, errors.New("no VIP: no cluster MAC to probe")
	}
	v := firstIPv4(st.VIPs)
	if !v.IsValid() {
		v = st.VIPs[0]
	}
	return ClusterMAC(v, st.Settings.MACMode), nil
}

// doctorPeerPath is the peer API's doctor endpoints.
const doctorPeerPath = "/v1/peer/doctor"

type probeRequest struct {
	Nonce uint64 `json:"nonce"`
}

type probeSeen struct {
	Seen bool `json:"seen"`
}

// doctorPeerHandlers serves the probe-frame endpoints and this node's
// report to members.
func (a *Agent) doctorPeerHandlers(mux *http.ServeMux) {
	ready := func(next http.Handler) http.Handler {
		return a.store.Authorize(rules.MembersOnly, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if a.running.Load() == nil || a.probe == nil {
				writeJSON(w, http.StatusServiceUnavailable, APIError{Error: "the agent is starting"})
				return
			}
			next.ServeHTTP(w, r)
		}))
	}
	mux.Handle("POST "+doctorPeerPath+"/send", ready(handle(func(ctx context.Context, r probeRequest) error {
		dst, err := probeDst(a.store.State())
		if err != nil {
			return err
		}
		return a.probe.send(ctx, dst, r.Nonce)
	})))
	mux.Handle("GET "+doctorPeerPath+"/seen", ready(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n, err := strconv.ParseUint(r.URL.Query().Get("nonce"), 10, 64)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, APIError{Error: "nonce: want a number"})
			return
		}
		writeJSON(w, http.StatusOK, probeSeen{Seen: a.probe.waitSeen(r.Context(), n)})
	})))
	mux.Handle("GET "+doctorPeerPath, ready(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusOK, a.doctorNode(r.Context()))
	})))
}

// doctorClient is the doctor's peer client: mutual TLS, bounded.
func (a *Agent) doctorClient() *http.Client {
	return &http.Client{Transport: &http.Transport{TLSClientConfig: a.sec.certs.ClientConfig()}, Timeout: 15 * time.Second}
}

// peerJSON sends a request to a peer's API and decodes the answer into out
// (nil: none expected).
func peerJSON(ctx context.Context, cl *http.Client, method, api, path string, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, rules.PeerURL(api, path), body)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := cl.Do(req)
	if err != nil {
		return fmt.Errorf("peer api %s: %w", api, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("peer api %s %s: %s: %s", method, path, resp.Status, strings.TrimSpace(string(b)))
	}
	if out != nil {
		return json.Unmarshal(b, out)
	}
	return nil
}

// doctor runs the checks on this node, and with cluster on every
// registered peer too (over the peer API), this node's report first.
func (a *Agent) doctor(ctx context.Context, cluster bool) []DoctorReport {
	out := []DoctorReport{a.doctorNode(ctx)}
	if !cluster {
		return out
	}
	st := a.store.State()
	cl := a.doctorClient()
	var peers []rules.Node
	for _, n := range st.Nodes {
		if n.ID != a.self {
			peers = append(peers, n)
		}
	}
	reps := make([]DoctorReport, len(peers))
	var wg sync.WaitGroup
	for i, n := range peers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := peerJSON(ctx, cl, http.MethodGet, n.APIAddr, doctorPeerPath, nil, &reps[i]); err != nil {
				reps[i] = DoctorReport{Node: n.Name, Checks: []DoctorCheck{{Name: "peer_api", Verdict: VerdictFail,
					Detail: fmt.Sprintf("this node's doctor did not answer: %v", err),
					Fix:    "check the node runs (shoal query) and that TCP peer_addr is open between the nodes"}}}
			}
		}()
	}
	wg.Wait()
	return append(out, reps...)
}

// doctorNode runs the checks of this node with the real probes.
func (a *Agent) doctorNode(ctx context.Context) DoctorReport {
	ms := a.node.mem.snap.Load()
	st, hb := ms.rs, ms.hb
	live := map[uint32][2]bool{}
	for _, p := range hb.Peers {
		live[p.ID] = [2]bool{p.Live, p.Hears}
	}
	env := doctorEnv{Node: a.cfg.NodeName, Interface: a.cfg.Interface, VIPs: st.VIPs, Mode: st.Settings.MACMode}
	for _, n := range st.Nodes {
		if n.ID == a.self {
			continue
		}
		lh := live[uint32(n.ID)]
		env.Peers = append(env.Peers, doctorPeer{Name: n.Name, HeartbeatAddr: n.HeartbeatAddr, RaftAddr: n.RaftAddr, APIAddr: n.APIAddr, Live: lh[0], Hears: lh[1]})
	}
	xdpMode := ""
	if a.host.xdp != nil {
		if m := a.host.xdp.Mode(); m != "" && m != "none" {
			xdpMode = string(m)
		}
	}
	env.Kernel = func() []Feature { return kernelFeatures(xdpMode != "") }
	env.XDP = func() (string, string, string) {
		t, d := linkDriver(a.cfg.Interface)
		return t, d, xdpMode
	}
	env.Sysctl = readSysctl
	env.Clock = clockSynced
	env.Dial = func(ctx context.Context, addr string) error {
		d := net.Dialer{Timeout: time.Second}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			return err
		}
		return c.Close()
	}
	cl := a.doctorClient()
	dst, dstErr := probeDst(st)
	env.FramesFrom = func(ctx context.Context, p doctorPeer) error {
		if dstErr != nil {
			return dstErr
		}
		n := newNonce()
		if err := peerJSON(ctx, cl, http.MethodPost, p.APIAddr, doctorPeerPath+"/send", probeRequest{n}, nil); err != nil {
			return err
		}
		if !a.probe.waitSeen(ctx, n) {
			return fmt.Errorf("none arrived within %v", probeWait)
		}
		return nil
	}
	env.FramesTo = func(ctx context.Context, p doctorPeer) error {
		if dstErr != nil {
			return dstErr
		}
		n := newNonce()
		if err := a.probe.send(ctx, dst, n); err != nil {
			return err
		}
		var seen probeSeen
		if err := peerJSON(ctx, cl, http.MethodGet, p.APIAddr, doctorPeerPath+"/seen?nonce="+strconv.FormatUint(n, 10), nil, &seen); err != nil {
			return err
		}
		if !seen.Seen {
			return fmt.Errorf("none arrived within %v", probeWait)
		}
		return nil
	}
	env.ARPAnswered = func() uint64 { return a.host.arpCounters()["replied"] + a.host.ndpCounters()["replied"] }
	return runDoctor(ctx, env)
}

// kernelFeatures probes what the XDP program needs; attached says whether
// the agent holds its bpf_link.
func kernelFeatures(attached bool) []Feature {
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

// linkDriver returns ifname's link type (netlink) and driver (sysfs).
func linkDriver(ifname string) (linkType, driver string) {
	if l, err := netlink.LinkByName(ifname); err == nil {
		linkType = l.Type()
	}
	if p, err := os.Readlink(filepath.Join("/sys/class/net", ifname, "device", "driver")); err == nil {
		driver = filepath.Base(p)
	}
	return linkType, driver
}

func readSysctl(key string) (string, error) {
	b, err := os.ReadFile(filepath.Join("/proc/sys", key))
	return strings.TrimSpace(string(b)), err
}

// clockSynced reports the kernel's NTP state (adjtimex, read only).
func clockSynced() (bool, error) {
	var tx unix.Timex
	if _, err := unix.Adjtimex(&tx); err != nil {
		return false, fmt.Errorf("adjtimex: %w", err)
	}
	return tx.Status&unix.STA_UNSYNC == 0, nil
}

// CheckNeighbour is `shoal doctor --neighbor`: it checks this host's
// neighbour entries for vip (a client's or a Linux router's, no agent
// needed) against vip's cluster MAC in mode.
func CheckNeighbour(vip netip.Addr, mode rules.MACMode) (DoctorCheck, error) {
	family := netlink.FAMILY_V4
	if vip.Is6() {
		family = netlink.FAMILY_V6
	}
	list, err := netlink.NeighList(0, family)
	if err != nil {
		return DoctorCheck{}, fmt.Errorf("list neighbours: %w", err)
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
