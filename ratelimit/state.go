package ratelimit

import (
	"slices"
	"time"
)

// state is one group's shared state: the value of its key in the limits
// bucket, changed only by compare-and-set.
type state struct {
	// Bins are settled calls, summed per bin of Window/60 by start time.
	Bins []bin `json:"bins,omitempty"`
	// Holds are calls granted and not settled yet; they count with their
	// reservation.
	Holds []hold `json:"holds,omitempty"`
	// Queue are the calls waiting, oldest first.
	Queue []waiter `json:"queue,omitempty"`
	// Workers maps a worker to when its holds and waiters go stale (Unix
	// ms) unless it refreshes.
	Workers map[string]int64 `json:"workers,omitempty"`
	// PausedUntil is the provider's retry time (Unix ms).
	PausedUntil int64 `json:"pausedUntil,omitempty"`
}

type bin struct {
	At       int64 `json:"t"` // start of the bin, Unix ms
	Requests int   `json:"r"`
	Tokens   int   `json:"k"`
}

type hold struct {
	ID     string `json:"id"`
	Worker string `json:"w"`
	At     int64  `json:"t"` // granted, Unix ms
	Tokens int    `json:"k"` // reserved
}

type waiter struct {
	ID     string `json:"id"`
	Worker string `json:"w"`
	At     int64  `json:"t"` // asked, Unix ms
	Tokens int    `json:"k"`
}

// window is the accounting of one group at one instant.
type window struct {
	width, binWidth int64 // ms
}

func newWindow(w time.Duration) window {
	ms := max(w.Milliseconds(), 60)
	return window{width: ms, binWidth: max(ms/60, 1)}
}

// prune drops what no longer counts at now: bins and holds that left the
// window, the waiters and holds of workers that went stale, and holds
// older than maxHold (their Settle never came). A stale
// worker's hold becomes a settled call with its reservation (it may have
// used the provider's capacity), so it frees the concurrency at once and
// the window when it ages out.
func (s *state) prune(win window, now, maxHold int64) {
	stale := func(w string) bool { return s.Workers[w] <= now }
	s.Queue = slices.DeleteFunc(s.Queue, func(q waiter) bool { return stale(q.Worker) })
	var dead []hold
	s.Holds = slices.DeleteFunc(s.Holds, func(h hold) bool {
		if stale(h.Worker) || h.At+maxHold <= now {
			dead = append(dead, h)
			return true
		}
		return false
	})
	for _, h := range dead {
		s.addBin(win, h.At, h.Tokens)
	}
	s.Bins = slices.DeleteFunc(s.Bins, func(b bin) bool { return b.At+win.binWidth+win.width <= now })
	for w, until := range s.Workers {
		if until <= now {
			delete(s.Workers, w)
		}
	}
}

// addBin counts a settled call at its grant time.
func (s *state) addBin(win window, at int64, tokens int) {
	start := at - at%win.binWidth
	for i := range s.Bins {
		if s.Bins[i].At == start {
			s.Bins[i].Requests++
			s.Bins[i].Tokens += tokens
			return
		}
	}
	s.Bins = append(s.Bins, bin{At: start, Requests: 1, Tokens: tokens})
}

// usage is what counts in the window ending at now. Every call counts for
// one window plus one bin: bins count until their end leaves the window,
// and holds as long, a guard against the time between a grant and the
// provider seeing the request.
func (s *state) usage(win window, now int64) (requests, tokens, inFlight int) {
	for _, b := range s.Bins {
		if b.At+win.binWidth+win.width > now {
			requests += b.Requests
			tokens += b.Tokens
		}
	}
	for _, h := range s.Holds {
		inFlight++
		if h.At+win.binWidth+win.width > now {
			requests++
			tokens += h.Tokens
		}
	}
	return requests, tokens, inFlight
}

// fits reports whether a call of tokens may start at now; if not, retryAt
// is when the window next loses something (0: only a settle or a stale
// worker frees what is missing).
func (s *state) fits(lim Limits, win window, now int64, tokens int) (ok bool, retryAt int64) {
	if s.PausedUntil > now {
		return false, s.PausedUntil
	}
	req, tok, inFlight := s.usage(win, now)
	rateOK := (lim.RPM <= 0 || req+1 <= lim.RPM) && (lim.TPM <= 0 || tok+tokens <= lim.TPM)
	if rateOK && (lim.Concurrency <= 0 || inFlight < lim.Concurrency) {
		return true, 0
	}
	if rateOK {
		return false, 0
	}
	// The earliest instant something leaves the window.
	next := int64(0)
	consider := func(t int64) {
		if t > now && (next == 0 || t < next) {
			next = t
		}
	}
	for _, b := range s.Bins {
		consider(b.At + win.binWidth + win.width)
	}
	for _, h := range s.Holds {
		consider(h.At + win.binWidth + win.width)
	}
	return false, next
}

// enqueue adds a waiter in order of its asking time (ties by id).
func (s *state) enqueue(q waiter) {
	i, _ := slices.BinarySearchFunc(s.Queue, q, func(a, b waiter) int {
		if a.At != b.At {
			return int(a.At - b.At)
		}
		switch {
		case a.ID < b.ID:
			return -1
		case a.ID > b.ID:
			return 1
		}
		return 0
	})
	s.Queue = slices.Insert(s.Queue, i, q)
}

func (s *state) dequeue(id string) bool {
	n := len(s.Queue)
	s.Queue = slices.DeleteFunc(s.Queue, func(q waiter) bool { return q.ID == id })
	return len(s.Queue) != n
}

// release turns the hold id into a settled call with its reservation.
func (s *state) release(win window, id string) bool {
	for i, h := range s.Holds {
		if h.ID == id {
			return s.settle(win, id, s.Holds[i].Tokens)
		}
	}
	return false
}

func (s *state) settle(win window, id string, used int) bool {
	for i, h := range s.Holds {
		if h.ID == id {
			s.Holds = slices.Delete(s.Holds, i, i+1)
			s.addBin(win, h.At, used)
			return true
		}
	}
	return false
}

func (s *state) alive(worker string, until int64) {
	if s.Workers == nil {
		s.Workers = map[string]int64{}
	}
	if s.Workers[worker] < until {
		s.Workers[worker] = until
	}
}
