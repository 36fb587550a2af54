package intake

import "sync/atomic"

// RecordReadSkips holds, per queue, whether its first deliveries skip
// the record read at pickup (worker/internal/lease). The map is written
// once, before the pull loops start.
type RecordReadSkips map[string]*atomic.Bool

// Skip reports whether a first delivery of queue may skip the read.
func (p RecordReadSkips) Skip(queue string) bool {
	s := p[queue]
	return s != nil && s.Load()
}

// AllowsHandBack tells whether a consumer with this MaxDeliver lets a
// first delivery be handed back without giving the run up.
func AllowsHandBack(maxDeliver int) bool { return maxDeliver <= 0 || maxDeliver >= 3 }
