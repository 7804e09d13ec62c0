package engine

import (
	"testing"
	"time"
)

// holdTimes reads the engine's hold-time histogram as a count and a sum.
func holdTimes(e *Engine) (uint64, time.Duration, uint64) {
	st := e.Stats()
	return st.HoldTimes.Count(), st.HoldTimes.Sum, st.LeaseExpiries
}

func TestHoldTimeAndExpiriesAreObservedOnEveryEnd(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 1})
	ns := e.Namespace("t")
	mustGrant := func(key string, lease time.Duration) uint64 {
		t.Helper()
		r, _ := e.Acquire(ns, []byte(key), 1, 0, lease, 0, nil)
		if r.Outcome != Granted {
			t.Fatalf("acquire %s: %v", key, r.Outcome)
		}
		return r.Token
	}

	// A release: held from grant to release.
	tok := mustGrant("released", 10*time.Second)
	clock.Advance(3 * time.Second)
	if r := e.Release(ns, []byte("released"), tok); r.Outcome != Released {
		t.Fatal(r.Outcome)
	}
	if n, sum, exp := holdTimes(e); n != 1 || sum != 3*time.Second || exp != 0 {
		t.Fatalf("after a release: %d holds, %v, %d expiries; want 1, 3s, 0", n, sum, exp)
	}

	// A lapsed lease noticed by the next acquire of its key: held for its
	// whole lease, and counted as an expiry.
	mustGrant("lapsed", 2*time.Second)
	clock.Advance(5 * time.Second)
	mustGrant("lapsed", time.Second)
	if n, sum, exp := holdTimes(e); n != 2 || sum != 5*time.Second || exp != 1 {
		t.Fatalf("after a lapse: %d holds, %v, %d expiries; want 2, 5s, 1", n, sum, exp)
	}

	// A lease with a waiter, ended by the timer that hands the lock over.
	mustGrant("handed", time.Second)
	var rec recorder
	if r, _ := e.Acquire(ns, []byte("handed"), 2, 0, time.Second, 10*time.Second, &rec); r.Outcome != Queued {
		t.Fatal(r.Outcome)
	}
	clock.Advance(time.Second)
	e.Tick()
	if len(rec.got) != 1 || rec.got[0].r.Outcome != Granted {
		t.Fatalf("waiter got %v", rec.got)
	}
	if n, _, exp := holdTimes(e); n != 3 || exp != 2 {
		t.Fatalf("after a hand-off at expiry: %d holds, %d expiries; want 3, 2", n, exp)
	}

	// Leases nobody touched again, reclaimed by the sweep: "lapsed" (1 s)
	// and "handed" (the waiter's 1 s lease).
	clock.Advance(time.Minute)
	e.Sweep()
	if n, _, exp := holdTimes(e); n != 5 || exp != 4 {
		t.Fatalf("after a sweep: %d holds, %d expiries; want 5, 4", n, exp)
	}
	// A renewed lease is one hold, from its grant.
	tok = mustGrant("kept", time.Second)
	clock.Advance(500 * time.Millisecond)
	if r := e.Keep(ns, []byte("kept"), tok, time.Second); r.Outcome != Renewed {
		t.Fatal(r.Outcome)
	}
	clock.Advance(900 * time.Millisecond) // past the first lease's end
	_, before, _ := holdTimes(e)
	if r := e.Release(ns, []byte("kept"), tok); r.Outcome != Released {
		t.Fatal(r.Outcome)
	}
	if _, after, _ := holdTimes(e); after-before != 1400*time.Millisecond {
		t.Fatalf("a renewed lease released 1.4 s after its grant adds %v", after-before)
	}
}
