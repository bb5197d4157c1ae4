package lab

import (
	"fmt"
	"os"
	"syscall"
	"time"
)

// procStat returns a process's state letter and start time (in clock ticks
// since boot) from /proc/<pid>/stat.
func procStat(pid int) (state byte, start uint64, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, 0, err
	}
	return parseStat(string(b))
}

// alive reports whether p is still running (not gone, not a zombie, and its
// PID not recycled).
func alive(p Proc) bool {
	st, start, err := procStat(p.PID)
	return err == nil && st != 'Z' && st != 'X' && start == p.Start
}

// stopProcs sends SIGTERM to every live process, waits up to grace for them
// to exit, then SIGKILLs the rest. It returns the processes it had to kill.
func stopProcs(procs []Proc, grace time.Duration) []Proc {
	var live []Proc
	for _, p := range procs {
		if alive(p) {
			syscall.Kill(p.PID, syscall.SIGTERM)
			live = append(live, p)
		}
	}
	deadline := time.Now().Add(grace)
	for len(live) > 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
		live = filterAlive(live)
	}
	for _, p := range live {
		syscall.Kill(p.PID, syscall.SIGKILL)
	}
	return live
}

func filterAlive(ps []Proc) []Proc {
	var out []Proc
	for _, p := range ps {
		if alive(p) {
			out = append(out, p)
		}
	}
	return out
}
