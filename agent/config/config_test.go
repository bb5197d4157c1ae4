package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shoalnet/shoal/heartbeat"
)

const goodConfig = `
node_name: node1
interface: eth0
vips: [198.18.7.100]
data_dir: /tmp/x
key_file: /tmp/key
heartbeat_addr: 198.18.7.11:7946
raft_addr: 198.18.7.11:7947
peer_addr: 198.18.7.11:7948
bootstrap: true
`

func writeConfig(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "shoal.yaml")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigValid(t *testing.T) {
	c, err := Load(writeConfig(t, goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("valid config rejected: %v", err)
	}
	if c.Socket != DefaultSocket || c.Health.Fall != 3 {
		t.Errorf("defaults not filled: socket %q fall %d", c.Socket, c.Health.Fall)
	}
}

// TestConfigIPv6VIP: an IPv6 VIP is accepted beside an IPv4 one.
func TestConfigIPv6VIP(t *testing.T) {
	c, err := Load(writeConfig(t, strings.Replace(goodConfig, "[198.18.7.100]", "[198.18.7.100, '2001:db8:0:7::100']", 1)))
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Validate(); err != nil {
		t.Fatalf("a dual-stack config rejected: %v", err)
	}
	if len(c.VIPs) != 2 || !c.VIPs[1].Is6() {
		t.Errorf("vips %v, want the IPv4 and the IPv6 one", c.VIPs)
	}
}

func TestConfigErrorsNameTheField(t *testing.T) {
	tests := []struct {
		name, replace, with, want string
	}{
		{"no node name", "node_name: node1", "node_name: ''", "node_name"},
		{"bad vip", "[198.18.7.100]", "[300.1.1.1]", "vips"},
		{"multicast vip", "[198.18.7.100]", "[224.0.0.1]", "vips"},
		{"ipv6 multicast vip", "[198.18.7.100]", "['ff02::1']", "vips"},
		{"link-local vip", "[198.18.7.100]", "['fe80::1']", "vips"},
		{"v4-mapped vip", "[198.18.7.100]", "['::ffff:198.18.7.100']", "vips"},
		{"no port", "198.18.7.11:7946", "198.18.7.11", "heartbeat_addr"},
		{"hostname for raft", "198.18.7.11:7947", "node1:7947", "raft_addr"},
		{"bootstrap and join", "bootstrap: true", "bootstrap: true\njoin: [198.18.7.12:7948]", "bootstrap/join"},
		{"neither", "bootstrap: true", "", "bootstrap/join"},
		{"short period", "bootstrap: true", "bootstrap: true\nheartbeat_period: 1ms", "heartbeat_period"},
		{"unknown profile", "bootstrap: true", "bootstrap: true\nprofile: turbo", "profile"},
		{"health both", "bootstrap: true", "bootstrap: true\nhealth: {url: 'http://x/', tcp: '127.0.0.1:80'}", "health"},
		{"health url", "bootstrap: true", "bootstrap: true\nhealth: {url: 'ftp://x/'}", "health.url"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			text := strings.Replace(goodConfig, tc.replace, tc.with, 1)
			c, err := Load(writeConfig(t, text))
			if err == nil {
				err = c.Validate()
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %v, want one naming %q", err, tc.want)
			}
		})
	}
}

func TestConfigRejectsUnknownField(t *testing.T) {
	_, err := Load(writeConfig(t, goodConfig+"vipz: [1.2.3.4]\n"))
	if err == nil || !strings.Contains(err.Error(), "vipz") {
		t.Errorf("unknown field accepted or not named: %v", err)
	}
}

func TestConfigEnvAndSet(t *testing.T) {
	c, err := Load(writeConfig(t, goodConfig))
	if err != nil {
		t.Fatal(err)
	}
	env := map[string]string{"SHOAL_NODE_NAME": "fromenv", "SHOAL_VIPS": "198.18.7.100, 198.18.7.101"}
	if err := c.ApplyEnv(func(k string) string { return env[k] }); err != nil {
		t.Fatal(err)
	}
	if err := c.Set("heartbeat_period", "50ms"); err != nil {
		t.Fatal(err)
	}
	if c.NodeName != "fromenv" || len(c.VIPs) != 2 || c.HeartbeatPeriod.Milliseconds() != 50 {
		t.Errorf("overrides not applied: %+v", c)
	}
	if err := c.ApplyEnv(func(k string) string {
		if k == "SHOAL_BOOTSTRAP" {
			return "maybe"
		}
		return ""
	}); err == nil || !strings.Contains(err.Error(), "SHOAL_BOOTSTRAP") {
		t.Errorf("bad env value accepted or not named: %v", err)
	}
	if err := c.Set("nope", "1"); err == nil {
		t.Error("unknown setting accepted")
	}
}

func TestReadKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good")
	os.WriteFile(good, []byte(strings.Repeat("ab", 32)+"\n"), 0o600)
	if k, err := ReadKey(good); err != nil || len(k) != 32 {
		t.Errorf("good key: %v (%d bytes)", err, len(k))
	}
	short := filepath.Join(dir, "short")
	os.WriteFile(short, []byte("abcd"), 0o600)
	if _, err := ReadKey(short); err == nil {
		t.Error("short key accepted")
	}
	open := filepath.Join(dir, "open")
	os.WriteFile(open, []byte(strings.Repeat("ab", 32)), 0o644)
	if _, err := ReadKey(open); err == nil || !strings.Contains(err.Error(), "chmod 600") {
		t.Errorf("world-readable key accepted: %v", err)
	}
}

func TestBootstrapHeartbeatProfile(t *testing.T) {
	tests := []struct {
		name      string
		cfg       Config
		period    time.Duration
		tolerance int
	}{
		{"default", Config{}, heartbeat.DefaultPeriod, heartbeat.DefaultTolerance},
		{"fast", Config{Profile: "fast"}, heartbeat.FastProfile.Period, heartbeat.FastProfile.Tolerance},
		{"fast, period set", Config{Profile: "fast", HeartbeatPeriod: 30 * time.Millisecond}, 30 * time.Millisecond, heartbeat.FastProfile.Tolerance},
		{"period set", Config{HeartbeatPeriod: 50 * time.Millisecond}, 50 * time.Millisecond, heartbeat.DefaultTolerance},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p, tol := tt.cfg.BootstrapHeartbeat()
			if p != tt.period || tol != tt.tolerance {
				t.Errorf("BootstrapHeartbeat() = %v, %d; want %v, %d", p, tol, tt.period, tt.tolerance)
			}
		})
	}
	c := &Config{}
	if err := c.Set("profile", "fast"); err != nil || c.Profile != "fast" {
		t.Errorf("Set(profile, fast): %v, profile %q", err, c.Profile)
	}
}
