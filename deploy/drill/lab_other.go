//go:build !linux

package drill

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/shoalnet/shoal/deploy/lab"
)

// LabOptions configure a drill in a lab built for it.
type LabOptions struct {
	Scenario      Scenario
	Traffic       Traffic
	Lab           lab.Options
	Node          string
	Weight        string
	SettleTimeout time.Duration
	Progress      io.Writer
}

// RunLab fails off Linux: the lab is made of Linux network namespaces.
func RunLab(ctx context.Context, o LabOptions) (*Report, error) {
	return nil, errors.New("drill: --lab needs Linux network namespaces")
}
