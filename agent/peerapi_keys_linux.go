package agent

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/shoalnet/shoal/agent/config"
	"github.com/shoalnet/shoal/heartbeat"
)

// readKeys reads the primary key (key_file) and the keys also accepted
// (accept_key_files), the primary first.
func readKeys(cfg *config.Config) ([][]byte, error) {
	keys := make([][]byte, 0, 1+len(cfg.AcceptKeyFiles))
	for _, f := range append([]string{cfg.KeyFile}, cfg.AcceptKeyFiles...) {
		k, err := config.ReadKey(f)
		if err != nil {
			return nil, err
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// heartbeatKeyring is the keyring of keys, signing with the first.
func heartbeatKeyring(keys [][]byte) (*heartbeat.Keyring, error) {
	kr, err := heartbeat.NewKeyring(keys[0], keys[1:]...)
	if err != nil {
		return nil, fmt.Errorf("heartbeat keys: %w", err)
	}
	return kr, nil
}

// reloadKeys rereads the configuration's key_file and accept_key_files
// (when it can reread the configuration) and the key files, and swaps in
// the keys for heartbeats and TLS. Nothing changes unless the
// configuration and every file read and every key is good. Only the one
// goroutine of reloadOnSIGHUP calls it.
func (a *Agent) reloadKeys() error {
	cfg := *a.cfg
	if a.cfg.Reread != nil {
		fresh, err := a.cfg.Reread()
		if err != nil {
			return fmt.Errorf("reread the configuration: %w", err)
		}
		cfg.KeyFile, cfg.AcceptKeyFiles = fresh.KeyFile, fresh.AcceptKeyFiles
	}
	keys, err := readKeys(&cfg)
	if err != nil {
		return err
	}
	kr, err := heartbeatKeyring(keys)
	if err != nil {
		return err
	}
	opts := tlsOptions(&cfg, keys[0])
	opts.Keys = keys
	if err := a.sec.certs.Reload(opts); err != nil {
		return err
	}
	a.link.SetKeyring(kr)
	ids := make([]string, len(keys))
	for i, k := range keys {
		ids[i] = fmt.Sprintf("%08x", heartbeat.KeyID(k))
	}
	a.log.Info("cluster keys reloaded", "primary", ids[0], "accepted", ids[1:])
	return nil
}

// reloadOnSIGHUP rereads the key files on every SIGHUP until ctx ends.
func (a *Agent) reloadOnSIGHUP(ctx context.Context) {
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, syscall.SIGHUP)
	go func() {
		defer signal.Stop(ch)
		for {
			select {
			case <-ctx.Done():
				return
			case <-ch:
				if err := a.reloadKeys(); err != nil {
					a.log.Error("reload the cluster keys; keeping the ones in use", "err", err)
				}
			}
		}
	}()
}
