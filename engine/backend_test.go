package engine

import (
	"context"
	"testing"
	"time"
)

// A grant abandoned by its waiter (its connection closed first) is
// released by the local backend's Run, so the next waiter gets the lock
// without waiting out the lease; past the queue's bound it is left to its
// lease and counted.
func TestLocalBackendReleasesAbandonedGrants(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 1})
	b := NewLocal(e)
	ns := b.Namespace("t")
	var rec recorder
	key := []byte("k")
	first, _ := b.Acquire(ns, key, 1, 30*time.Second, 0, &rec)
	_, queued := b.Acquire(ns, key, 2, 30*time.Second, time.Minute, &rec)
	if queued == nil {
		t.Fatal("second acquire not queued")
	}
	b.Release(ns, key, 0, first.Token, nil)
	granted := rec.take()
	if len(granted) != 1 || granted[0].r.Outcome != Granted {
		t.Fatalf("handoff %+v", granted)
	}
	if r := e.ReleaseGranted(queued.(*Wait), granted[0].r.Token-1); r.Outcome != NotHeld {
		t.Fatalf("ReleaseGranted with another token: %v, want NotHeld", r.Outcome)
	}
	b.Abandon(queued, granted[0].r.Token) // owner 2's connection had closed

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ := b.Acquire(ns, key, 3, 30*time.Second, 0, &rec)
		if r.Outcome == Granted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the abandoned grant was never released")
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	<-done
	if st := b.Stats(); st.AbandonedQueued != 1 || st.AbandonedDropped != 0 {
		t.Fatalf("stats %+v", st)
	}

	// Run has returned: the queue fills, and what does not fit is dropped.
	for i := range AbandonQueue + 1 {
		b.Abandon(queued, uint64(1000+i))
	}
	if st := b.Stats(); st.AbandonedQueued != 1+AbandonQueue || st.AbandonedDropped != 1 {
		t.Fatalf("after overfilling the queue: released %d dropped %d", st.AbandonedQueued, st.AbandonedDropped)
	}
}
