package main

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/shoalnet/shoal/peer"
)

func TestTLSCreateCAAndCert(t *testing.T) {
	dir := t.TempDir()
	if out, code := run(t, "tls", "ca", "create", "--dir", dir); code != 0 {
		t.Fatalf("ca create: exit %d: %s", code, out)
	}
	if out, code := run(t, "tls", "ca", "create", "--dir", dir); code == 0 {
		t.Fatalf("a second ca create overwrote the CA: %s", out)
	}
	ca, caKey := filepath.Join(dir, "shoal-ca.pem"), filepath.Join(dir, "shoal-ca-key.pem")
	if st, err := os.Stat(caKey); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("CA key: %v, mode %v; want 0600", err, st.Mode())
	}
	if out, code := run(t, "tls", "cert", "create", "--dir", dir, "--ca", ca, "--ca-key", caKey, "--ip", "198.18.0.1", "node1"); code != 0 {
		t.Fatalf("cert create: exit %d: %s", code, out)
	}
	if _, code := run(t, "tls", "cert", "create", "--dir", dir, "--ca", ca, "--ca-key", caKey, "bad\x1b[2Jname"); code != exitUsage {
		t.Errorf("a name with an escape sequence: exit %d, want %d", code, exitUsage)
	}
	c, err := peer.NewCerts(peer.TLSOptions{Name: "node1", CAFile: ca,
		CertFile: filepath.Join(dir, "node1.pem"), KeyFile: filepath.Join(dir, "node1-key.pem")})
	if err != nil {
		t.Fatalf("a node loads its certificate: %v", err)
	}
	if !c.Operator() || c.Name() != "node1" {
		t.Errorf("operator %v, name %q", c.Operator(), c.Name())
	}
}
