package heartbeat

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// IncarnationFile is the file in the data directory that holds the node's
// last incarnation.
const IncarnationFile = "heartbeat-incarnation"

// LoadIncarnation returns the incarnation for this start of the node: the one
// stored in dir plus one, which it stores (written to a temporary file,
// synced, renamed over the old one, the directory synced) before returning,
// so incarnations grow across restarts and crashes. Only the very first one
// comes from the clock (its Unix seconds), so that a node whose data
// directory was lost still starts above what its peers remember; a clock set
// back later changes nothing.
func LoadIncarnation(dir string) (uint64, error) {
	path := filepath.Join(dir, IncarnationFile)
	var last uint64
	b, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		last = uint64(max(time.Now().Unix(), 0))
	case err != nil:
		return 0, fmt.Errorf("read heartbeat incarnation: %w", err)
	default:
		last, err = strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
		if err != nil || last == ^uint64(0) {
			return 0, fmt.Errorf("heartbeat incarnation file %s is damaged (%q): remove it to start from the clock", path, b)
		}
	}
	inc := last + 1
	if err := writeFileSync(path, []byte(strconv.FormatUint(inc, 10)+"\n")); err != nil {
		return 0, fmt.Errorf("store heartbeat incarnation: %w", err)
	}
	return inc, nil
}

// writeFileSync replaces path with data durably.
func writeFileSync(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	defer os.Remove(tmp) // after the rename there is nothing left to remove
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
