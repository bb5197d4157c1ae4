package config

import (
	"bytes"
	"cmp"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/shoalnet/shoal/heartbeat"
	"github.com/shoalnet/shoal/rules"
)

// Config is an agent's configuration, read from a YAML file, then the
// environment (SHOAL_<FIELD>), then flags, each overriding the last.
type Config struct {
	NodeName string `yaml:"node_name"`
	// Zone says where the node is (a rack, a room; optional): the Raft
	// voters are spread over zones.
	Zone            string        `yaml:"zone"`
	Interface       string        `yaml:"interface"`
	VIPs            VIPList       `yaml:"vips"`
	DataDir         string        `yaml:"data_dir"`
	KeyFile         string        `yaml:"key_file"`
	HeartbeatAddr   string        `yaml:"heartbeat_addr"`
	RaftAddr        string        `yaml:"raft_addr"`
	PeerAddr        string        `yaml:"peer_addr"`
	Socket          string        `yaml:"socket"`
	MetricsAddr     string        `yaml:"metrics_addr"`
	Bootstrap       bool          `yaml:"bootstrap"`
	Join            []string      `yaml:"join"`
	HeartbeatPeriod time.Duration `yaml:"heartbeat_period"` // a new cluster's heartbeat period (bootstrap only)
	// Profile picks a new cluster's heartbeat settings (bootstrap only):
	// "default", or "fast" (heartbeat.FastProfile); heartbeat_period, when
	// set, overrides the profile's period.
	Profile string `yaml:"profile"`
	Health  Health `yaml:"health"`
	TLS     TLS    `yaml:"tls"`
	// BGP is the routed mode's speaker (bgp.go).
	BGP BGP `yaml:"bgp"`
	// AcceptKeyFiles are further cluster keys accepted (heartbeats, TLS)
	// but not signed with, for a key rotation (docs/SECURITY.md).
	AcceptKeyFiles []string `yaml:"accept_key_files"`
	// Drills enables the drill endpoint of the peer API (pulling this
	// node's virtual plug from `shoal drill`); off by default.
	Drills bool `yaml:"drills"`
	// PinDir is where the data plane is pinned across a restart (`shoal
	// restart`), on a bpf filesystem; empty: /sys/fs/bpf/shoal/<a hash of
	// data_dir>, distinct for every node on one kernel.
	PinDir string `yaml:"pin_dir"`

	// Reread, if set, reads the configuration again from where it came
	// from (file, environment, flags). A key reload takes key_file and
	// accept_key_files from it, so adding or removing a key in the config
	// takes effect without a restart.
	Reread func() (*Config, error) `yaml:"-" json:"-"`
}

// TLS selects the operator CA mode: the CA certificates to trust
// and this node's certificate and key (`shoal tls ca create`, `shoal tls
// cert create`). Empty: certificates under a CA derived from the cluster key.
type TLS struct {
	CAFile   string `yaml:"ca_file"`
	CertFile string `yaml:"cert_file"`
	KeyFile  string `yaml:"key_file"`
}

// Health is the application health check that drains a sick node.
// With neither URL nor TCP set the node is always healthy.
type Health struct {
	URL      string        `yaml:"url"`      // HTTP GET; healthy on 2xx/3xx
	TCP      string        `yaml:"tcp"`      // host:port; healthy when it connects
	Interval time.Duration `yaml:"interval"` // default 1s
	Timeout  time.Duration `yaml:"timeout"`  // default 500ms
	Fall     int           `yaml:"fall"`     // failures in a row to turn sick, default 3
	Rise     int           `yaml:"rise"`     // successes in a row to turn healthy, default 2
}

// VIPList is the VIPs of a config; its YAML errors name the field.
type VIPList []netip.Addr

// UnmarshalYAML parses a list of IPv4 addresses.
func (l *VIPList) UnmarshalYAML(n *yaml.Node) error {
	var raw []string
	if err := n.Decode(&raw); err != nil {
		return fmt.Errorf("vips: want a list of IPv4 addresses: %w", err)
	}
	*l = nil
	for _, s := range raw {
		a, err := netip.ParseAddr(s)
		if err != nil {
			return fmt.Errorf("vips: line %d: %w", n.Line, err)
		}
		*l = append(*l, a)
	}
	return nil
}

// BootstrapHeartbeat returns the heartbeat period and tolerance a new
// cluster starts with: the profile's, the period overridden by
// heartbeat_period when set.
func (c *Config) BootstrapHeartbeat() (time.Duration, int) {
	period, tolerance := heartbeat.DefaultPeriod, heartbeat.DefaultTolerance
	if c.Profile == "fast" {
		period, tolerance = heartbeat.FastProfile.Period, heartbeat.FastProfile.Tolerance
	}
	return cmp.Or(c.HeartbeatPeriod, period), tolerance
}

// DefaultSocket is where the local control API listens.
const DefaultSocket = "/run/shoal/shoal.sock"

// Load reads a YAML config file. Unknown fields are errors, so a typo
// does not silently fall back to a default.
func Load(path string) (*Config, error) {
	c := &Config{}
	if path != "" {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read config: %w", err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(b))
		dec.KnownFields(true)
		if err := dec.Decode(c); err != nil && !errors.Is(err, io.EOF) {
			return nil, fmt.Errorf("config %s: %w", path, err)
		}
	}
	return c, nil
}

// ApplyEnv overrides fields from SHOAL_* environment variables.
func (c *Config) ApplyEnv(getenv func(string) string) error {
	for _, f := range c.fields() {
		if v := getenv("SHOAL_" + strings.ToUpper(f.name)); v != "" {
			if err := f.set(v); err != nil {
				return fmt.Errorf("SHOAL_%s: %w", strings.ToUpper(f.name), err)
			}
		}
	}
	return nil
}

// Set overrides one field by its YAML name, as flags do.
func (c *Config) Set(name, value string) error {
	for _, f := range c.fields() {
		if f.name == name {
			if err := f.set(value); err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			return nil
		}
	}
	return fmt.Errorf("unknown setting %q", name)
}

// FieldNames lists the settings that ApplyEnv and Set accept.
func (c *Config) FieldNames() []string {
	var names []string
	for _, f := range c.fields() {
		names = append(names, f.name)
	}
	return names
}

type field struct {
	name string
	set  func(string) error
}

func (c *Config) fields() []field {
	str := func(p *string) func(string) error { return func(v string) error { *p = v; return nil } }
	return []field{
		{"node_name", str(&c.NodeName)},
		{"zone", str(&c.Zone)},
		{"interface", str(&c.Interface)},
		{"vips", func(v string) error {
			c.VIPs = nil
			for _, s := range strings.Split(v, ",") {
				a, err := netip.ParseAddr(strings.TrimSpace(s))
				if err != nil {
					return err
				}
				c.VIPs = append(c.VIPs, a)
			}
			return nil
		}},
		{"data_dir", str(&c.DataDir)},
		{"key_file", str(&c.KeyFile)},
		{"heartbeat_addr", str(&c.HeartbeatAddr)},
		{"raft_addr", str(&c.RaftAddr)},
		{"peer_addr", str(&c.PeerAddr)},
		{"socket", str(&c.Socket)},
		{"metrics_addr", str(&c.MetricsAddr)},
		{"pin_dir", str(&c.PinDir)},
		{"bootstrap", func(v string) error {
			b, err := strconv.ParseBool(v)
			c.Bootstrap = b
			return err
		}},
		{"join", func(v string) error { c.Join = strings.Split(v, ","); return nil }},
		{"heartbeat_period", func(v string) error {
			d, err := time.ParseDuration(v)
			c.HeartbeatPeriod = d
			return err
		}},
		{"profile", str(&c.Profile)},
		{"accept_key_files", func(v string) error { c.AcceptKeyFiles = strings.Split(v, ","); return nil }},
		{"tls_ca_file", str(&c.TLS.CAFile)},
		{"tls_cert_file", str(&c.TLS.CertFile)},
		{"tls_key_file", str(&c.TLS.KeyFile)},
		{"drills", func(v string) error {
			b, err := strconv.ParseBool(v)
			c.Drills = b
			return err
		}},
		{"health_url", str(&c.Health.URL)},
		{"health_tcp", str(&c.Health.TCP)},
		{"bgp_asn", func(v string) error {
			n, err := strconv.ParseUint(v, 10, 32)
			c.BGP.ASN = uint32(n)
			return err
		}},
		{"bgp_router_id", addr(&c.BGP.RouterID)},
		{"bgp_next_hop", addr(&c.BGP.NextHop)},
		{"bgp_next_hop6", addr(&c.BGP.NextHop6)},
		{"bgp_communities", func(v string) error { c.BGP.Communities = strings.Split(v, ","); return nil }},
		// bgp_neighbors: ADDR@ASN[,ADDR@ASN...], each with BFD at its
		// defaults when bgp_bfd is true; the YAML has every option.
		{"bgp_neighbors", func(v string) error {
			c.BGP.Neighbors = nil
			for _, s := range strings.Split(v, ",") {
				a, asn, ok := strings.Cut(strings.TrimSpace(s), "@")
				ip, err1 := netip.ParseAddr(a)
				n, err2 := strconv.ParseUint(asn, 10, 32)
				if !ok || err1 != nil || err2 != nil {
					return fmt.Errorf("%q: want ADDRESS@ASN", s)
				}
				c.BGP.Neighbors = append(c.BGP.Neighbors, BGPNeighbor{Address: ip, ASN: uint32(n)})
			}
			return nil
		}},
		{"bgp_no_forward", func(v string) error {
			b, err := strconv.ParseBool(v)
			c.BGP.NoForward = b
			return err
		}},
		{"bgp_bfd", func(v string) error {
			b, err := strconv.ParseBool(v)
			for i := range c.BGP.Neighbors {
				c.BGP.Neighbors[i].BFD.Enabled = b
			}
			return err
		}},
	}
}

// addr sets *p from an IP address.
func addr(p *netip.Addr) func(string) error {
	return func(v string) error {
		a, err := netip.ParseAddr(v)
		*p = a
		return err
	}
}

// Validate fills defaults and checks every field, naming the one at fault.
func (c *Config) Validate() error {
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	h := &c.Health
	if h.Interval == 0 {
		h.Interval = time.Second
	}
	if h.Timeout == 0 {
		h.Timeout = 500 * time.Millisecond
	}
	if h.Fall == 0 {
		h.Fall = 3
	}
	if h.Rise == 0 {
		h.Rise = 2
	}
	var errs []error
	bad := func(field, format string, a ...any) {
		errs = append(errs, fmt.Errorf("%s: %s", field, fmt.Sprintf(format, a...)))
	}
	if err := rules.CheckNodeName(c.NodeName); err != nil {
		bad("node_name", "%v", err)
	}
	if err := rules.CheckZone(c.Zone); err != nil {
		bad("zone", "%v", err)
	}
	if t := c.TLS; (t.CAFile != "" || t.CertFile != "" || t.KeyFile != "") && (t.CAFile == "" || t.CertFile == "" || t.KeyFile == "") {
		bad("tls", "set all of ca_file, cert_file and key_file (operator CA), or none (a CA derived from the cluster key)")
	}
	if c.Interface == "" {
		bad("interface", "required: the interface that faces the clients and the other nodes")
	}
	if len(c.VIPs) == 0 {
		bad("vips", "at least one VIP is required")
	}
	for _, v := range c.VIPs {
		if err := usableVIP(v); err != nil {
			bad("vips", "%v", err)
		}
	}
	if c.DataDir == "" {
		bad("data_dir", "required: where the replicated rules are stored")
	}
	if c.KeyFile == "" {
		bad("key_file", "required: a file with the 32-byte cluster key as 64 hex characters (make one with `shoal keygen`)")
	}
	for name, addr := range map[string]string{"heartbeat_addr": c.HeartbeatAddr, "raft_addr": c.RaftAddr, "peer_addr": c.PeerAddr} {
		if err := checkHostPort(addr, true); err != nil {
			bad(name, "%v", err)
		}
	}
	if c.MetricsAddr != "" {
		if err := checkHostPort(c.MetricsAddr, false); err != nil {
			bad("metrics_addr", "%v", err)
		}
	}
	if c.Bootstrap == (len(c.Join) > 0) {
		bad("bootstrap/join", "set exactly one: bootstrap on the first node, join (peer addresses of members) on the others")
	}
	for _, j := range c.Join {
		if err := checkHostPort(j, true); err != nil {
			bad("join", "%v", err)
		}
	}
	if c.HeartbeatPeriod < 0 || (c.HeartbeatPeriod > 0 && c.HeartbeatPeriod < 10*time.Millisecond) {
		bad("heartbeat_period", "%s is too short (10ms at least)", c.HeartbeatPeriod)
	}
	if c.Profile != "" && c.Profile != "default" && c.Profile != "fast" {
		bad("profile", "%q is not a profile: want default or fast", c.Profile)
	}
	if h.URL != "" && h.TCP != "" {
		bad("health", "set url or tcp, not both")
	}
	if h.URL != "" && !strings.HasPrefix(h.URL, "http://") && !strings.HasPrefix(h.URL, "https://") {
		bad("health.url", "%q is not an http(s) URL", h.URL)
	}
	if h.TCP != "" {
		if err := checkHostPort(h.TCP, true); err != nil {
			bad("health.tcp", "%v", err)
		}
	}
	if h.Interval < 50*time.Millisecond || h.Timeout <= 0 || h.Timeout > h.Interval || h.Fall < 1 || h.Rise < 1 {
		bad("health", "need interval >= 50ms, 0 < timeout <= interval, fall >= 1, rise >= 1")
	}
	c.BGP.validate(c.HeartbeatAddr, bad)
	return errors.Join(errs...)
}

// checkHostPort checks an ip:port; with needIP the host must be a literal IP
// (peers must be told where to reach this node).
func checkHostPort(s string, needIP bool) error {
	if s == "" {
		return fmt.Errorf("required, as ip:port")
	}
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("%q: %v", s, err)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port must be 1-65535", s)
	}
	if needIP {
		if a, err := netip.ParseAddr(host); err != nil || a.IsUnspecified() {
			return fmt.Errorf("%q: host must be this node's IP address", s)
		}
	}
	return nil
}

// ReadKey reads a 32-byte cluster key stored as 64 hex characters.
func ReadKey(path string) ([]byte, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	if st.Mode().Perm()&0o077 != 0 {
		return nil, fmt.Errorf("cluster key %s: mode %o lets others read it; chmod 600 it", path, st.Mode().Perm())
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("cluster key: %w", err)
	}
	key, err := hex.DecodeString(strings.TrimSpace(string(b)))
	if err != nil || len(key) != 32 {
		return nil, fmt.Errorf("cluster key %s: want 64 hex characters (32 bytes)", path)
	}
	return key, nil
}

// usableVIP accepts a unicast IPv4 or IPv6 address clients can reach. An
// IPv6 VIP must not be link-local (clients beyond the link could not reach
// it, and a zone has no place in the rules) nor v4-mapped (write the IPv4
// address).
func usableVIP(v netip.Addr) error {
	switch {
	case v.Is4In6():
		return fmt.Errorf("%s is a v4-mapped address: write the IPv4 VIP %s", v, v.Unmap())
	case v.Zone() != "" || v.IsLinkLocalUnicast():
		return fmt.Errorf("%s is link-local: want an address clients beyond the link can reach", v)
	case !v.IsValid() || v.IsLoopback() || v.IsMulticast() || v.IsUnspecified() || v == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%s is not a usable unicast address", v)
	}
	return nil
}
