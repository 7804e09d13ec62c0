package engine_test

import (
	"testing"
	"time"

	"github.com/lockd/lockd/engine"
)

func clientID(s string) (id [16]byte) {
	copy(id[:], s)
	return id
}

// TestSessionKeyIsTheSameInEveryProcess pins the derivation (values
// computed outside Go, with Python's hashlib): the cluster
// replicates requester tags, so a node that derived them differently
// (another hash, a per-process seed) would tombstone other requests.
func TestSessionKeyIsTheSameInEveryProcess(t *testing.T) {
	k := engine.NewSessionKey(clientID("0123456789abcdef"))
	if got, want := uint64(k), uint64(0x8b1d62b7f0155e4f); got != want {
		t.Errorf("NewSessionKey = %#x, want %#x", got, want)
	}
	if got, want := uint64(k.Requester(1)), uint64(0xf5f9793eec3327b5); got != want {
		t.Errorf("Requester(1) = %#x, want %#x", got, want)
	}
}

func TestRequesterTags(t *testing.T) {
	if r := engine.SessionKey(0).Requester(7); r != 0 {
		t.Errorf("no session: Requester = %#x, want 0", r)
	}
	a, b := engine.NewSessionKey(clientID("client a")), engine.NewSessionKey(clientID("client b"))
	if a == b || a == 0 || b == 0 {
		t.Fatalf("session keys %#x %#x", a, b)
	}
	seen := make(map[engine.Requester]string)
	for owner := uint64(1); owner <= 10000; owner++ {
		for name, k := range map[string]engine.SessionKey{"a": a, "b": b} {
			r := k.Requester(owner)
			if r == 0 {
				t.Fatalf("session %s owner %d: tag 0", name, owner)
			}
			if prev, dup := seen[r]; dup {
				t.Fatalf("session %s owner %d: tag %#x already %s's", name, owner, r, prev)
			}
			seen[r] = name
		}
	}
}

func TestAbandonGrant(t *testing.T) {
	held := engine.Lease{Token: 4, End: 10 * time.Second}
	for _, c := range []struct {
		name           string
		l              engine.Lease
		holder, target engine.Requester
		now            time.Duration
		want           engine.Outcome
	}{
		{"its own grant", held, 7, 7, time.Second, engine.Released},
		{"another requester's grant", held, 7, 8, time.Second, engine.NotHeld},
		{"a grant without a session", held, 0, 0, time.Second, engine.NotHeld},
		{"its own grant after the lease end", held, 7, 7, 10 * time.Second, engine.NotHeld},
		{"a free key", engine.Lease{}, 0, 7, time.Second, engine.NotHeld},
	} {
		if got := engine.AbandonGrant(c.l, c.holder, c.target, c.now); got != c.want {
			t.Errorf("%s: %s, want %s", c.name, got, c.want)
		}
	}
}

func TestTombstonesRefuseTheirAcquireUntilTheirLifeEnds(t *testing.T) {
	ts := engine.NewTombstones[string](0)
	if ts.Bound() != engine.DefaultTombstonesPerTenant {
		t.Errorf("Bound = %d", ts.Bound())
	}
	laid := 3 * time.Second
	if ev := ts.Lay("t1", 7, []byte("k"), laid); ev != 0 {
		t.Errorf("Lay evicted %d", ev)
	}
	for _, c := range []struct {
		tenant string
		r      engine.Requester
		key    string
		now    time.Duration
		want   bool
	}{
		{"t1", 7, "k", laid, true},
		{"t1", 7, "k", laid + engine.TombstoneLife - 1, true},
		{"t1", 7, "k", laid + engine.TombstoneLife, false},
		{"t2", 7, "k", laid, false},
		{"t1", 8, "k", laid, false},
		{"t1", 7, "k2", laid, false},
		{"t1", 0, "k", laid, false},
	} {
		if got := ts.Refuses(c.tenant, c.r, []byte(c.key), c.now); got != c.want {
			t.Errorf("Refuses(%s, %d, %s, %v) = %v, want %v", c.tenant, c.r, c.key, c.now, got, c.want)
		}
	}
	// A second ABANDON of the same request while the first tombstone
	// holds adds nothing: the ACQUIRE was sent before both.
	ts.Lay("t1", 7, []byte("k"), laid+time.Minute)
	if ts.Len() != 1 {
		t.Errorf("Len after a repeated Lay = %d, want 1", ts.Len())
	}
	if ts.Lay("t1", 0, []byte("k"), laid); ts.Len() != 1 {
		t.Errorf("Lay of requester 0 laid a tombstone")
	}
	if n := ts.Expire(laid + engine.TombstoneLife - 1); n != 0 || ts.Len() != 1 {
		t.Errorf("Expire before the end dropped %d, Len %d", n, ts.Len())
	}
	if n := ts.Expire(laid + engine.TombstoneLife); n != 1 || ts.Len() != 0 {
		t.Errorf("Expire at the end dropped %d, Len %d", n, ts.Len())
	}
}

func TestTombstonesEvictTheOldestOfATenantPastTheBound(t *testing.T) {
	ts := engine.NewTombstones[engine.Namespace](3)
	now := time.Duration(0)
	for r := engine.Requester(1); r <= 3; r++ {
		ts.Lay(1, r, []byte("k"), now)
		ts.Lay(2, r, []byte("k"), now)
		now += time.Second
	}
	if ev := ts.Lay(1, 4, []byte("k"), now); ev != 1 {
		t.Errorf("Lay past the bound evicted %d, want 1", ev)
	}
	if ts.Refuses(1, 1, []byte("k"), now) || !ts.Refuses(1, 2, []byte("k"), now) || !ts.Refuses(1, 4, []byte("k"), now) {
		t.Error("tenant 1 did not lose exactly its oldest tombstone")
	}
	if !ts.Refuses(2, 1, []byte("k"), now) {
		t.Error("another tenant's bound evicted tenant 2's tombstone")
	}
	if ts.Len() != 6 {
		t.Errorf("Len = %d, want 6", ts.Len())
	}
}

// TestTombstonesIterateInADeterministicOrder: a replica's snapshot lists
// them by tenant, then oldest first, and laying that list again rebuilds
// the same set.
func TestTombstonesIterateInADeterministicOrder(t *testing.T) {
	ts := engine.NewTombstones[string](4)
	for i, tenant := range []string{"b", "a", "c", "a", "b", "a", "a", "a"} {
		ts.Lay(tenant, engine.Requester(i+1), []byte{'k', byte('0' + i)}, time.Duration(i)*time.Second)
	}
	type item struct {
		tenant string
		ts     engine.Tombstone
	}
	var got []item
	for tenant, tb := range ts.All() {
		got = append(got, item{tenant, tb})
	}
	want := []item{
		{"a", engine.Tombstone{Requester: 4, Key: "k3", Laid: 3 * time.Second}},
		{"a", engine.Tombstone{Requester: 6, Key: "k5", Laid: 5 * time.Second}},
		{"a", engine.Tombstone{Requester: 7, Key: "k6", Laid: 6 * time.Second}},
		{"a", engine.Tombstone{Requester: 8, Key: "k7", Laid: 7 * time.Second}},
		{"b", engine.Tombstone{Requester: 1, Key: "k0", Laid: 0}},
		{"b", engine.Tombstone{Requester: 5, Key: "k4", Laid: 4 * time.Second}},
		{"c", engine.Tombstone{Requester: 3, Key: "k2", Laid: 2 * time.Second}},
	}
	if len(got) != len(want) {
		t.Fatalf("All = %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("All[%d] = %v, want %v", i, got[i], want[i])
		}
	}
	rebuilt := engine.NewTombstones[string](4)
	for tenant, tb := range ts.All() {
		rebuilt.Lay(tenant, tb.Requester, []byte(tb.Key), tb.Laid)
	}
	var again []item
	for tenant, tb := range rebuilt.All() {
		again = append(again, item{tenant, tb})
	}
	for i := range want {
		if again[i] != want[i] {
			t.Fatalf("rebuilt All[%d] = %v, want %v", i, again[i], want[i])
		}
	}
}

func TestTombstoneRefusalDoesNotAllocate(t *testing.T) {
	ts := engine.NewTombstones[engine.Namespace](0)
	ts.Lay(1, 7, []byte("key"), 0)
	key := []byte("key")
	if n := testing.AllocsPerRun(100, func() {
		if !ts.Refuses(1, 7, key, time.Second) || ts.Refuses(1, 8, key, time.Second) {
			t.Fatal("wrong refusal")
		}
	}); n != 0 {
		t.Errorf("Refuses allocates %v per call", n)
	}
}
