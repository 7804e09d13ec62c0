package engine

import (
	"context"
	"testing"
	"time"
)

// A grant its waiter could not take (its connection closed first) is
// released by the local backend's Run, so the next waiter gets the lock
// without waiting out the lease; past the queue's bound it is left to its
// lease and counted.
func TestLocalBackendReleasesUndeliveredGrants(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 1})
	b := NewLocal(e)
	ns := b.Namespace("t")
	var rec recorder
	key := []byte("k")
	first, _ := b.Acquire(ns, key, 1, 0, 30*time.Second, 0, &rec)
	_, queued := b.Acquire(ns, key, 2, 0, 30*time.Second, time.Minute, &rec)
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
	b.ReleaseUndelivered(queued, granted[0].r.Token) // owner 2's connection had closed

	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); b.Run(ctx) }()
	deadline := time.Now().Add(10 * time.Second)
	for {
		r, _ := b.Acquire(ns, key, 3, 0, 30*time.Second, 0, &rec)
		if r.Outcome == Granted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the undelivered grant was never released")
		}
		time.Sleep(time.Millisecond)
	}
	stop()
	<-done
	if st := b.Stats(); st.UndeliveredQueued != 1 || st.UndeliveredDropped != 0 {
		t.Fatalf("stats %+v", st)
	}

	// Run has returned: the queue fills, and what does not fit is dropped.
	for i := range UndeliveredQueue + 1 {
		b.ReleaseUndelivered(queued, uint64(1000+i))
	}
	if st := b.Stats(); st.UndeliveredQueued != 1+UndeliveredQueue || st.UndeliveredDropped != 1 {
		t.Fatalf("after overfilling the queue: released %d dropped %d", st.UndeliveredQueued, st.UndeliveredDropped)
	}
}

// The local backend serves SPEC §6a synchronously: Abandon answers at
// once, and its tombstone refuses the request's acquire.
func TestLocalBackendServesAbandon(t *testing.T) {
	b := NewLocal(New(Config{Clock: NewFakeClock(), Shards: 1}))
	if !b.ServesAbandon() || b.AsyncAnswers() {
		t.Fatalf("ServesAbandon %v, AsyncAnswers %v", b.ServesAbandon(), b.AsyncAnswers())
	}
	ns := b.Namespace("t")
	r := NewSessionKey([16]byte{1}).Requester(1)
	if got, _ := b.Acquire(ns, []byte("k"), 1, r, 30*time.Second, 0, nil); got.Outcome != Granted {
		t.Fatalf("acquire: %v", got.Outcome)
	}
	if got := b.Abandon(ns, []byte("k"), 9, r, nil); got.Outcome != Released {
		t.Fatalf("abandon: %v, want Released", got.Outcome)
	}
	if got, _ := b.Acquire(ns, []byte("k"), 1, r, 30*time.Second, 0, nil); got.Outcome != TimedOut {
		t.Fatalf("acquire after its abandon: %v, want TimedOut", got.Outcome)
	}
	if got, _ := b.Acquire(ns, []byte("k"), 2, 0, 30*time.Second, 0, nil); got.Outcome != Granted {
		t.Fatalf("another acquire: %v, want Granted", got.Outcome)
	}
}
