package lab

import (
	"strings"
	"testing"
)

// TestLoadNote: a lab that did not converge says the machine is starved
// of CPU only when its load is past four runnable threads a CPU.
func TestLoadNote(t *testing.T) {
	if n := loadNote(8, 2); n != "" {
		t.Errorf("load 8 on 2 CPUs: %q, want nothing", n)
	}
	n := loadNote(91.2, 2)
	if !strings.Contains(n, "load is 91 on 2 CPUs") || !strings.Contains(n, "try fewer nodes") {
		t.Errorf("load 91 on 2 CPUs: %q", n)
	}
}
