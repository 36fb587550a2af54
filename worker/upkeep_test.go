package worker

import (
	"context"
	"testing"
)

// Upkeep requests wait for room; a wait ends with its context.
func TestUpkeepSlotsBoundRequestsInFlight(t *testing.T) {
	w := &Worker{upkeep: make(chan struct{}, 2)}
	ctx := context.Background()
	r1, ok1 := w.upkeepSlot(ctx)
	r2, ok2 := w.upkeepSlot(ctx)
	if !ok1 || !ok2 {
		t.Fatal("two slots of two were refused")
	}
	ended, cancel := context.WithCancel(ctx)
	got := make(chan bool)
	go func() {
		_, ok := w.upkeepSlot(ended)
		got <- ok
	}()
	cancel()
	if <-got {
		t.Fatal("a third request went out while two were in flight")
	}
	r1()
	r3, ok3 := w.upkeepSlot(ctx)
	if !ok3 {
		t.Fatal("a released slot was not given again")
	}
	r2()
	r3()
	if n := len(w.upkeep); n != 0 {
		t.Fatalf("%d slots held after every release", n)
	}
	if release, ok := (&Worker{}).upkeepSlot(ctx); !ok {
		t.Fatal("a worker made without New refused upkeep")
	} else {
		release()
	}
}
