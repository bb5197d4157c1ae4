package host

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
)

// hostRecordFile is the name, in the data directory, of the record of what
// the agent changed on the host.
const hostRecordFile = "host-state.json"

// hostRecord is what the agent changed on the host, written before each
// change so that an agent starting after a crash knows what its predecessor
// left: which VIPs on lo are the agent's, and what each sysctl was before
// the first change (the current value is already the agent's own).
type hostRecord struct {
	path string

	// Sysctls holds the value of each sysctl the agent changed, as it was
	// before the first change, in the order of the changes.
	Sysctls []sysctlOriginal `json:"sysctls,omitempty"`
	// VIPs are the addresses the agent put on lo (sorted).
	VIPs []netip.Addr `json:"vips_on_lo,omitempty"`
	// MACs are cluster MACs the agent added to the interface's multicast
	// list for the time of a restart (the ARP socket's memberships end
	// with it); the next agent removes them once its socket holds them.
	MACs []string `json:"multicast,omitempty"`
	// Restart is what an agent that stopped for a restart left for the
	// next one: the pinned data plane and the state its tables hold.
	Restart *RestartRecord `json:"restart,omitempty"`
}

type sysctlOriginal struct {
	Path  string `json:"path"`
	Value string `json:"value"`
}

// loadHostRecord reads the record in dir; a missing file is an empty record.
func loadHostRecord(dir string) (*hostRecord, error) {
	path := filepath.Join(dir, hostRecordFile)
	r := &hostRecord{path: path}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return r, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read host record: %w", err)
	}
	if err := json.Unmarshal(b, r); err != nil {
		return nil, fmt.Errorf("host record %s is unreadable (%w): restore the host by hand (VIPs on lo, arp_ignore, arp_announce) and remove it", path, err)
	}
	for _, s := range r.Sysctls {
		if !validSysctlPath(s.Path) {
			return nil, fmt.Errorf("host record %s names %q, not a sysctl of the agent's: restore the host by hand and remove it", path, s.Path)
		}
	}
	slices.SortFunc(r.VIPs, netip.Addr.Compare)
	r.VIPs = slices.Compact(r.VIPs)
	return r, nil
}

// validSysctlPath keeps a damaged record from making the agent write any
// file but an interface's IPv4 sysctl.
func validSysctlPath(p string) bool {
	dir, name := filepath.Split(p)
	return filepath.Clean(p) == p && filepath.Dir(filepath.Clean(dir)) == "/proc/sys/net/ipv4/conf" &&
		(name == "arp_ignore" || name == "arp_announce")
}

// original returns the recorded value of a sysctl before the agent's first
// change.
func (r *hostRecord) original(path string) (string, bool) {
	for _, s := range r.Sysctls {
		if s.Path == path {
			return s.Value, true
		}
	}
	return "", false
}

// hasVIP reports whether the record says the agent put vip on lo.
func (r *hostRecord) hasVIP(vip netip.Addr) bool {
	_, ok := slices.BinarySearchFunc(r.VIPs, vip, netip.Addr.Compare)
	return ok
}

// addSysctl records a sysctl's value before the first change and saves the
// record; a sysctl already recorded keeps its first value.
func (r *hostRecord) addSysctl(path, value string) error {
	if _, ok := r.original(path); ok {
		return nil
	}
	r.Sysctls = append(r.Sysctls, sysctlOriginal{Path: path, Value: value})
	return r.save()
}

// dropSysctl forgets a restored sysctl and saves the record.
func (r *hostRecord) dropSysctl(path string) error {
	r.Sysctls = slices.DeleteFunc(r.Sysctls, func(s sysctlOriginal) bool { return s.Path == path })
	return r.save()
}

// addVIP records that the agent is putting vip on lo and saves the record.
func (r *hostRecord) addVIP(vip netip.Addr) error {
	i, ok := slices.BinarySearchFunc(r.VIPs, vip, netip.Addr.Compare)
	if ok {
		return nil
	}
	r.VIPs = slices.Insert(r.VIPs, i, vip)
	return r.save()
}

// dropVIP forgets a VIP taken off lo and saves the record.
func (r *hostRecord) dropVIP(vip netip.Addr) error {
	i, ok := slices.BinarySearchFunc(r.VIPs, vip, netip.Addr.Compare)
	if !ok {
		return nil
	}
	r.VIPs = slices.Delete(r.VIPs, i, i+1)
	return r.save()
}

// setMACs records the cluster MACs joined for a restart and saves.
func (r *hostRecord) setMACs(macs []string) error {
	r.MACs = slices.Clone(macs)
	return r.save()
}

// setRestart records (or, nil, forgets) a restart and saves.
func (r *hostRecord) setRestart(rr *RestartRecord) error {
	r.Restart = rr
	return r.save()
}

// empty reports whether the agent has nothing left to undo.
func (r *hostRecord) empty() bool {
	return len(r.Sysctls) == 0 && len(r.VIPs) == 0 && len(r.MACs) == 0 && r.Restart == nil
}

// save writes the record atomically: a crash leaves the old record or the
// new one, never a part. An empty record removes the file.
func (r *hostRecord) save() error {
	if r.empty() {
		if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove host record: %w", err)
		}
		return syncDir(filepath.Dir(r.path))
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encode host record: %w", err)
	}
	tmp, err := os.CreateTemp(filepath.Dir(r.path), hostRecordFile+".*")
	if err != nil {
		return fmt.Errorf("write host record: %w", err)
	}
	defer os.Remove(tmp.Name()) // fails harmlessly once renamed
	_, err = tmp.Write(append(b, '\n'))
	if err == nil {
		err = tmp.Sync()
	}
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp.Name(), r.path)
	}
	if err != nil {
		return fmt.Errorf("write host record: %w", err)
	}
	return syncDir(filepath.Dir(r.path))
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}
