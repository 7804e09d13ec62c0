package engine

import (
	"fmt"
	"slices"
	"testing"
	"time"
)

// Inspect shows a held key's token, time left and queue; a lapsed lease
// shows as not held even before any tick settled it; an absent key and
// an unknown tenant show nothing held; and nothing is interned.
func TestInspect(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 4})
	b := NewLocal(e)
	ns := e.Namespace("acme")
	rec := &recorder{}
	r, _ := e.Acquire(ns, []byte("k"), 1, 0, 10*time.Second, 0, rec)
	for owner := uint64(2); owner <= 3; owner++ {
		if q, _ := e.Acquire(ns, []byte("k"), owner, 0, 10*time.Second, 30*time.Second, rec); q.Outcome != Queued {
			t.Fatalf("owner %d: %v, want Queued", owner, q.Outcome)
		}
	}
	clock.Advance(4 * time.Second)

	if got, want := b.InspectLock("acme", []byte("k")), (LockInfo{Key: "k", Held: true, Token: r.Token, LeaseRemaining: 6 * time.Second, Waiters: 2}); got != want {
		t.Errorf("held key: %+v, want %+v", got, want)
	}
	if got, want := b.InspectLock("acme", []byte("other")), (LockInfo{Key: "other"}); got != want {
		t.Errorf("absent key: %+v, want %+v", got, want)
	}
	if got, want := b.InspectLock("nobody", []byte("k")), (LockInfo{Key: "k"}); got != want {
		t.Errorf("unknown tenant: %+v, want %+v", got, want)
	}
	if _, ok := e.LookupNamespace("nobody"); ok {
		t.Error("inspecting an unknown tenant interned it")
	}
	// The same key of another tenant is another lock.
	e.Namespace("other")
	if got := b.InspectLock("other", []byte("k")); got.Held {
		t.Errorf("another tenant's k: %+v", got)
	}

	clock.Advance(6 * time.Second) // the lease lapses; nothing has ticked
	if got, want := b.InspectLock("acme", []byte("k")), (LockInfo{Key: "k", Waiters: 2}); got != want {
		t.Errorf("lapsed lease: %+v, want %+v", got, want)
	}
	e.Tick() // the head waiter is granted
	if got := b.InspectLock("acme", []byte("k")); !got.Held || got.Token <= r.Token || got.Waiters != 1 || got.LeaseRemaining != 10*time.Second {
		t.Errorf("after the hand-off: %+v", got)
	}
}

// List returns the tenant's held or waited-for keys with the prefix, in
// key order, at most limit of them, from every shard.
func TestList(t *testing.T) {
	clock := NewFakeClock()
	e := New(Config{Clock: clock, Shards: 8})
	b := NewLocal(e)
	ns, other := e.Namespace("acme"), e.Namespace("other")
	rec := &recorder{}
	var jobs []string
	for i := range 40 {
		key := fmt.Sprintf("job/%02d", 39-i) // inserted out of order
		jobs = append(jobs, key)
		e.Acquire(ns, []byte(key), uint64(i+1), 0, time.Duration(10+i)*time.Second, 0, rec)
	}
	slices.Sort(jobs)
	e.Acquire(ns, []byte("cron/1"), 100, 0, 10*time.Second, 0, rec)
	e.Acquire(other, []byte("job/99"), 101, 0, 10*time.Second, 0, rec)
	// A key whose lease lapsed with nobody waiting is free: not listed.
	e.Acquire(ns, []byte("job/zz"), 102, 0, time.Second, 0, rec)
	clock.Advance(2 * time.Second)

	keys := func(infos []LockInfo) []string {
		var out []string
		for _, in := range infos {
			if !in.Held || in.Token == 0 {
				t.Errorf("listed %+v, want held with a token", in)
			}
			out = append(out, in.Key)
		}
		return out
	}
	if got := keys(b.ListLocks("acme", []byte("job/"), 1000)); !slices.Equal(got, jobs) {
		t.Errorf("every job: %v, want %v", got, jobs)
	}
	if got := keys(b.ListLocks("acme", []byte("job/"), 5)); !slices.Equal(got, jobs[:5]) {
		t.Errorf("limit 5: %v, want %v", got, jobs[:5])
	}
	if got := keys(b.ListLocks("acme", nil, 3)); !slices.Equal(got, []string{"cron/1", "job/00", "job/01"}) {
		t.Errorf("no prefix, limit 3: %v", got)
	}
	if got := b.ListLocks("nobody", nil, 10); len(got) != 0 {
		t.Errorf("unknown tenant: %v", got)
	}
	if got := b.ListLocks("acme", []byte("job/0"), 0); len(got) != 0 {
		t.Errorf("limit 0: %v", got)
	}
	if got := b.ListLocks("acme", []byte("job/05"), 10); len(got) != 1 || got[0].LeaseRemaining != 42*time.Second {
		t.Errorf("job/05, granted 44 s 2 s ago: %+v, want 42 s left", got)
	}
}
