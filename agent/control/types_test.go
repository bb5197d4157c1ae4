package control

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/shoalnet/shoal/agent/config"
)

// TestParamsEncodeWithRereadHook: the agent's params carry its config, whose
// Reread hook (a func) must not make them unencodable.
func TestParamsEncodeWithRereadHook(t *testing.T) {
	c := config.Config{NodeName: "web1", Reread: func() (*config.Config, error) { return nil, nil }}
	b, err := json.Marshal(Params{Config: c})
	if err != nil {
		t.Fatalf("params with a Reread hook: %v", err)
	}
	if !strings.Contains(string(b), `"web1"`) {
		t.Errorf("encoded params lack the config: %s", b)
	}
}
