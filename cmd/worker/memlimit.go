package main

import (
	"os"
	"strconv"
	"strings"
)

// cgroupMemoryMax is the cgroup v2 file holding the container's memory
// limit, as the process sees it from inside.
const cgroupMemoryMax = "/sys/fs/cgroup/memory.max"

// memLimit is the memory limit the worker set for itself at its start
// (none: Bytes 0), and where it came from, for its startup log.
type memLimit struct {
	Bytes  int64 // the Go runtime's soft limit set (debug.SetMemoryLimit)
	Cgroup int64 // the container's limit it was derived from
}

// cgroupShare is the part of the container's limit the Go heap and
// stacks may use: the rest is for what the runtime does not count (the
// binary, C libraries, memory not yet returned to the system).
const cgroupShare = 0.9

// autoMemLimit is the soft limit for a worker whose environment sets no
// GOMEMLIMIT: cgroupShare of its container's limit as read from
// memory.max's contents (0: no limit, "max", or unreadable). A worker
// that holds thousands of runs otherwise grows to twice its live heap
// and is killed by the container before the collector minds the limit.
func autoMemLimit(gomemlimit string, memoryMax []byte) memLimit {
	if gomemlimit != "" {
		return memLimit{} // the operator's wins
	}
	s := strings.TrimSpace(string(memoryMax))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 {
		return memLimit{} // "max" (none) or not a cgroup v2 limit
	}
	return memLimit{Bytes: int64(float64(n) * cgroupShare), Cgroup: n}
}

// readMemoryMax reads path (cgroupMemoryMax); nil if it cannot.
func readMemoryMax(path string) []byte {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil
	}
	return b
}
