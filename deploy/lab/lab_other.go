//go:build !linux

package lab

import (
	"context"
	"errors"
	"log/slog"
)

// ErrUnsupported is returned off Linux: the lab is made of Linux network
// namespaces.
var ErrUnsupported = errors.New("lab: needs Linux network namespaces")

// Up fails off Linux.
func Up(ctx context.Context, o Options) (*Lab, error) { return nil, ErrUnsupported }

// Run fails off Linux.
func Run(ctx context.Context, o RunOptions) (*Report, error) { return nil, ErrUnsupported }

// Open fails off Linux.
func Open(base, id string, log *slog.Logger) (*Lab, error) { return nil, ErrUnsupported }

// List fails off Linux.
func List(base string) ([]string, error) { return nil, ErrUnsupported }

// DownAll fails off Linux.
func DownAll(ctx context.Context, base string, log *slog.Logger) ([]string, error) {
	return nil, ErrUnsupported
}

// Down fails off Linux.
func (l *Lab) Down(ctx context.Context) error { return ErrUnsupported }

// Status returns the recorded state only off Linux.
func (l *Lab) Status(ctx context.Context) Status { return Status{State: l.State} }
