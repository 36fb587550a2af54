package intake

import (
	"fmt"
	"testing"
)

// The coverage's rules, one at a time.
func TestControlCoverage(t *testing.T) {
	t.Run("covers a later request not noted", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 2, 1, 5, 100)
		if !cv.Covers("x", 101, 2, 1) {
			t.Fatal("not covered")
		}
		if cv.Covers("x", 100, 2, 1) {
			t.Fatal("a request at the runs base is covered")
		}
	})
	t.Run("a noted run reads once", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 2, 1, 5, 100)
		cv.Saw(6, "x", false)
		cv.Saw(7, "y", true)
		if cv.Covers("x", 101, 2, 1) {
			t.Fatal("a noted run is covered")
		}
		if !cv.Covers("x", 102, 2, 1) || !cv.Covers("y", 101, 2, 1) {
			t.Fatal("not covered")
		}
	})
	t.Run("a sequence seen again still notes its run", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 0, 0, 5, 100)
		cv.Saw(6, "y", true) // a copy that claimed the number first
		cv.Saw(6, "x", false)
		if cv.Covers("x", 101, 0, 0) {
			t.Fatal("the run of the message seen second is covered")
		}
	})
	t.Run("a gap ends the epoch", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 0, 0, 5, 100)
		cv.Saw(6, "x", true)
		cv.Saw(8, "y", true)
		if cv.Covers("z", 101, 0, 0) {
			t.Fatal("covered after a gap")
		}
		select {
		case <-cv.renew:
		default:
			t.Fatal("no renew due")
		}
		// A renew counts what came since the gap: 7, lost, is at or
		// below a base of 7 (its run's request at or below the runs
		// base), not below one of 6.
		epoch := cv.epoch
		cv.Renewed(epoch, 0, 0, 6, 120)
		if cv.valid {
			t.Fatal("valid though 7 came after the base and was not seen")
		}
		cv.Saw(9, "y", true)
		cv.Renewed(cv.epoch, 0, 0, 9, 120)
		if !cv.valid || !cv.Covers("z", 121, 0, 0) {
			t.Fatal("not valid after a renew above the gap")
		}
	})
	t.Run("a renew sees every message after its base", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Saw(9, "x", false)
		cv.Renewed(cv.epoch, 0, 0, 7, 100) // 8 not seen
		if cv.valid {
			t.Fatal("valid with sequence 8 unseen")
		}
		cv = NewControlCoverage()
		cv.Saw(8, "x", false)
		cv.Saw(9, "y", false)
		cv.Renewed(cv.epoch, 0, 0, 7, 100)
		if !cv.valid || cv.Covers("x", 101, 0, 0) || cv.Covers("y", 101, 0, 0) || !cv.Covers("z", 101, 0, 0) {
			t.Fatal("messages after the base are not noted")
		}
	})
	t.Run("a gap right after an empty renew ends it", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 0, 0, 5, 100)
		cv.Saw(8, "y", false) // 6 and 7 lost
		if cv.Covers("x", 101, 0, 0) {
			t.Fatal("covered though 6 and 7 were not seen")
		}
		cv = NewControlCoverage()
		cv.Renewed(cv.epoch, 0, 0, 5, 100)
		cv.Saw(5, "y", true) // in flight at the renew
		cv.Saw(6, "z", true)
		if !cv.Covers("x", 101, 0, 0) {
			t.Fatal("not covered after 5 and 6")
		}
	})
	t.Run("a sequence going back ends it", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 0, 0, 5, 100)
		cv.Saw(6, "a", true)
		cv.Saw(6, "a", true) // the same again: nothing
		if !cv.valid {
			t.Fatal("a repeated message ended it")
		}
		cv.Saw(1, "x", false) // the stream was recreated
		if cv.Covers("x", 101, 0, 0) || cv.valid {
			t.Fatal("covered after the sequences started again")
		}
	})
	t.Run("a renew from a lost epoch is void", func(t *testing.T) {
		cv := NewControlCoverage()
		epoch := cv.epoch
		cv.Saw(3, "x", true)
		cv.Saw(5, "x", true)
		cv.Renewed(epoch, 0, 0, 10, 100)
		if cv.valid {
			t.Fatal("a renew begun before a gap made the coverage valid")
		}
	})
	t.Run("a reconnect or a drop ends it", func(t *testing.T) {
		for _, c := range []struct {
			reconnects uint64
			dropped    int
		}{{3, 1}, {2, 2}} {
			cv := NewControlCoverage()
			cv.Renewed(cv.epoch, 2, 1, 5, 100)
			if cv.Covers("x", 101, c.reconnects, c.dropped) || cv.valid {
				t.Fatalf("covered after %+v", c)
			}
		}
	})
	t.Run("too many runs noted end it", func(t *testing.T) {
		cv := NewControlCoverage()
		cv.Renewed(cv.epoch, 0, 0, 0, 100)
		for i := range maxUnclaimed + 1 {
			cv.Saw(uint64(i+1), fmt.Sprint("r", i), false)
		}
		if cv.valid || len(cv.unclaimed) != 0 {
			t.Fatalf("valid %v with %d noted", cv.valid, len(cv.unclaimed))
		}
	})
}

// The audit's rules.
func TestControlCoverageAudit(t *testing.T) {
	cv := NewControlCoverage()
	cv.Renewed(cv.epoch, 0, 0, 5, 100)
	cv.Saw(6, "a", true)
	cv.Audited(true, 6)
	if !cv.valid {
		t.Fatal("ended though everything the last audit saw came")
	}
	cv.Audited(true, 7) // 7 was stored an audit ago and never came
	if cv.valid || len(cv.renew) != 1 {
		t.Fatalf("valid %v, renew due %d: a message lost with nothing after it went unnoticed", cv.valid, len(cv.renew))
	}
	cv.Renewed(cv.epoch, 0, 0, 9, 120)
	cv.Audited(true, 7) // the renew's base is past the audit's
	if !cv.valid {
		t.Fatal("ended by an audit older than the renew")
	}
	cv.Audited(false, 9)
	if cv.valid || len(cv.renew) != 0 || !cv.off {
		t.Fatalf("valid %v, renew due %d, off %v after republishing stopped", cv.valid, len(cv.renew), cv.off)
	}
	cv.Audited(true, 9)
	if cv.off || len(cv.renew) != 1 {
		t.Fatalf("off %v, renew due %d after republishing came back", cv.off, len(cv.renew))
	}
}
