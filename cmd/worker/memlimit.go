package main

import (
	"os"
	"strconv"
	"strings"
)

// The files holding the container's memory limit, as the process sees it
// from inside: cgroup v2's, else cgroup v1's (its "no limit" is a number
// near 2^63).
const (
	cgroupMemoryMax   = "/sys/fs/cgroup/memory.max"
	cgroupV1MemoryMax = "/sys/fs/cgroup/memory/memory.limit_in_bytes"
)

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
// its memory.max (or v1 limit_in_bytes); none without a limit. A worker
// that holds thousands of runs otherwise grows to twice its live heap
// and is killed by the container before the collector minds the limit.
func autoMemLimit(gomemlimit string, memoryMax []byte) memLimit {
	if gomemlimit != "" {
		return memLimit{} // the operator's wins
	}
	s := strings.TrimSpace(string(memoryMax))
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n <= 0 || n >= 1<<60 {
		return memLimit{} // "max" or v1's near 2^63: none
	}
	return memLimit{Bytes: int64(float64(n) * cgroupShare), Cgroup: n}
}

// readMemoryMax reads the first of paths that can be read; nil if none.
func readMemoryMax(paths ...string) []byte {
	for _, p := range paths {
		if b, err := os.ReadFile(p); err == nil {
			return b
		}
	}
	return nil
}
