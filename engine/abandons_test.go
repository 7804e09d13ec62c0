package engine

import (
	"fmt"
	"testing"
	"time"
)

// TestAbandonCountsWhatItDid holds the Engine's §6a counters to the
// abandons it was given: a grant released, a waiter dropped, nothing
// there, and the acquires the tombstones then refused; the sweep drops the
// tombstones at the end of their life.
func TestAbandonCountsWhatItDid(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 16})
	ns := e.Namespace("t")
	c1, c2 := NewSessionKey([16]byte{1}), NewSessionKey([16]byte{2})
	var rec recorder
	e.Acquire(ns, []byte("a"), 1, c1.Requester(1), time.Minute, 0, nil)
	e.Acquire(ns, []byte("b"), 2, c2.Requester(2), time.Minute, 0, nil)
	if r, _ := e.Acquire(ns, []byte("b"), 3, c1.Requester(3), time.Minute, time.Minute, &rec); r.Outcome != Queued {
		t.Fatalf("acquire b: %v", r.Outcome)
	}
	for _, c := range []struct {
		key  string
		r    Requester
		want Outcome
	}{
		{"a", c1.Requester(1), Released},
		{"b", c1.Requester(3), NotHeld},
		{"c", c1.Requester(4), NotHeld},
	} {
		if got := e.Abandon(ns, []byte(c.key), c.r); got.Outcome != c.want {
			t.Fatalf("abandon %s: %v, want %v", c.key, got.Outcome, c.want)
		}
	}
	if got := rec.take(); len(got) != 1 || got[0].owner != 3 || got[0].r.Outcome != TimedOut {
		t.Fatalf("dropped waiter resolved %+v, want owner 3 TimedOut", got)
	}
	if r, _ := e.Acquire(ns, []byte("c"), 4, c1.Requester(4), time.Minute, time.Minute, &rec); r.Outcome != TimedOut {
		t.Fatalf("tombstoned acquire: %v, want TimedOut", r.Outcome)
	}
	st := e.Stats()
	if st.AbandonsReleased != 1 || st.AbandonsDroppedWaiter != 1 || st.AbandonsNothing != 1 ||
		st.Tombstones != 3 || st.TombstoneRefusals != 1 || st.TombstonesEvicted != 0 {
		t.Fatalf("stats: released %d dropped %d nothing %d tombstones %d refusals %d evicted %d",
			st.AbandonsReleased, st.AbandonsDroppedWaiter, st.AbandonsNothing, st.Tombstones, st.TombstoneRefusals, st.TombstonesEvicted)
	}
	if st.Waiters != 0 || st.Inflight != 0 || st.Keys != 1 {
		t.Fatalf("after the abandons: %d keys, %d waiters, %d in flight; want b alone held", st.Keys, st.Waiters, st.Inflight)
	}
	clock.Advance(TombstoneLife - 1)
	e.Sweep()
	if n := e.Stats().Tombstones; n != 3 {
		t.Fatalf("tombstones swept before their life ended: %d left", n)
	}
	clock.Advance(1)
	e.Sweep()
	if n := e.Stats().Tombstones; n != 0 {
		t.Fatalf("tombstones left after their life: %d", n)
	}
}

// TestTombstoneBoundIsPerTenantAcrossShards: a tenant's bound counts its
// tombstones on every key, whichever shard holds the key, and evicts only
// that tenant's oldest.
func TestTombstoneBoundIsPerTenantAcrossShards(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 64, TombstonesPerTenant: 8})
	t1, t2 := e.Namespace("t1"), e.Namespace("t2")
	sess := NewSessionKey([16]byte{1})
	e.Abandon(t2, []byte("k0"), sess.Requester(1))
	for i := range 9 {
		clock.Advance(time.Millisecond)
		e.Abandon(t1, fmt.Appendf(nil, "k%d", i), sess.Requester(uint64(i+1)))
	}
	if st := e.Stats(); st.Tombstones != 9 || st.TombstonesEvicted != 1 {
		t.Fatalf("tombstones %d evicted %d, want 9 and 1", st.Tombstones, st.TombstonesEvicted)
	}
	if r, _ := e.Acquire(t1, []byte("k0"), 1, sess.Requester(1), time.Minute, 0, nil); r.Outcome != Granted {
		t.Fatalf("the evicted tombstone's acquire: %v, want Granted", r.Outcome)
	}
	for _, c := range []struct {
		ns    Namespace
		key   string
		owner uint64
	}{{t1, "k1", 2}, {t1, "k8", 9}, {t2, "k0", 1}} {
		if r, _ := e.Acquire(c.ns, []byte(c.key), c.owner, sess.Requester(c.owner), time.Minute, 0, nil); r.Outcome != TimedOut {
			t.Fatalf("tombstoned acquire %d/%s: %v, want TimedOut", c.ns, c.key, r.Outcome)
		}
	}
}

// TestAbandonPassesNoAdmissionGate: with the key, waiter and in-flight
// gates all closed (a new acquire answered Busy), an ABANDON still
// releases its grant, the head waiter is granted, and another drops its
// waiter (SPEC §6a: like RELEASE, no admission gate).
func TestAbandonPassesNoAdmissionGate(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 1, MaxKeys: 2, MaxWaiters: 2, MaxInflight: 2})
	ns := e.Namespace("t")
	c1, c2 := NewSessionKey([16]byte{1}), NewSessionKey([16]byte{2})
	var rec recorder
	e.Acquire(ns, []byte("a"), 1, c1.Requester(1), time.Minute, 0, nil)
	e.Acquire(ns, []byte("b"), 2, c1.Requester(2), time.Minute, 0, nil)
	e.Acquire(ns, []byte("a"), 3, c2.Requester(3), time.Minute, time.Minute, &rec)
	e.Acquire(ns, []byte("b"), 4, c2.Requester(4), time.Minute, time.Minute, &rec)
	if r, _ := e.Acquire(ns, []byte("c"), 5, 0, time.Minute, 0, nil); r.Outcome != Busy {
		t.Fatalf("a new acquire with every gate full: %v, want Busy", r.Outcome)
	}
	if r := e.Abandon(ns, []byte("a"), c1.Requester(1)); r.Outcome != Released {
		t.Fatalf("abandon of the grant with the gates closed: %v, want Released", r.Outcome)
	}
	if r := e.Abandon(ns, []byte("b"), c2.Requester(4)); r.Outcome != NotHeld {
		t.Fatalf("abandon of the waiter with the gates closed: %v, want NotHeld", r.Outcome)
	}
	got := rec.take()
	if len(got) != 2 || got[0].owner != 3 || got[0].r.Outcome != Granted || got[1].owner != 4 || got[1].r.Outcome != TimedOut {
		t.Fatalf("waiters resolved %+v, want 3 Granted and 4 TimedOut", got)
	}
}
