package lab

import (
	"fmt"
	"strconv"
	"strings"
)

// parseStat parses /proc/<pid>/stat; the command name may hold spaces and
// parentheses, so fields are counted from the last ')'.
func parseStat(s string) (state byte, start uint64, err error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, 0, fmt.Errorf("proc stat: no ')' in %q", s)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); starttime is field 22.
	if len(f) < 20 {
		return 0, 0, fmt.Errorf("proc stat: %d fields", len(f))
	}
	start, err = strconv.ParseUint(f[19], 10, 64)
	if err != nil {
		return 0, 0, fmt.Errorf("proc stat: starttime: %w", err)
	}
	return f[0][0], start, nil
}

// parseNeigh returns the lladdr of the first entry of `ip neigh show`.
func parseNeigh(out string) string {
	f := strings.Fields(out)
	for i := 0; i+1 < len(f); i++ {
		if f[i] == "lladdr" {
			return f[i+1]
		}
	}
	return ""
}
