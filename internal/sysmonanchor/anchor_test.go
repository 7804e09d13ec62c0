package sysmonanchor

import (
	"context"
	"testing"
	"time"
)

// waitParked waits, by polling the flag the anchor sets before it blocks,
// until the anchor is parked.
func waitParked(t *testing.T, a *Anchor) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !a.parked.Load() {
		if time.Now().After(deadline) {
			t.Fatal("the anchor never parked")
		}
		time.Sleep(time.Millisecond)
	}
}

// Parked, the anchor holds nothing; the first applied entry starts its
// holds, which go on for as long as entries keep coming and stop after one
// quiet period; cancelling its context ends it after the hold under way,
// so a node's Close does not wait out a period.
func TestMonitorAnchorHoldsWhileEntriesApply(t *testing.T) {
	a := New()
	held := make(chan struct{})
	proceed := make(chan struct{})
	holds := 0
	a.hold = func(d time.Duration) {
		if d != anchorHold {
			t.Errorf("held %v, want %v", d, anchorHold)
		}
		holds++
		held <- struct{}{}
		<-proceed
	}
	expectHold := func(what string) {
		t.Helper()
		select {
		case <-held:
		case <-time.After(10 * time.Second):
			t.Fatalf("no hold %s", what)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	returned := make(chan struct{})
	go func() { a.Run(ctx); close(returned) }()
	waitParked(t, a)

	perPeriod := int(anchorQuiet / anchorHold)
	a.NoteApplied()
	for i := range 2 * perPeriod {
		expectHold("while entries apply")
		if i == 0 {
			a.NoteApplied() // the first period saw an entry: a second one follows
		}
		proceed <- struct{}{}
	}
	waitParked(t, a)
	if holds != 2*perPeriod {
		t.Fatalf("%d holds before parking, want %d (two periods)", holds, 2*perPeriod)
	}

	a.NoteApplied()
	expectHold("after the next entry")
	cancel()
	proceed <- struct{}{}
	select {
	case <-returned:
	case <-time.After(10 * time.Second):
		t.Fatal("the anchor held on after its context ended")
	}
}
