//go:build !race

package engine

import "testing"

// The race detector allocates on its own, so this check runs without it.
func TestAcquireReleaseExistingKeyDoesNotAllocate(t *testing.T) {
	e := New(Config{Clock: NewFakeClock()})
	ns := e.Namespace("t")
	var buf [16]byte
	key := benchKey(&buf, 7)
	acquireRelease(t, e, ns, key)
	if n := testing.AllocsPerRun(1000, func() { acquireRelease(t, e, ns, key) }); n != 0 {
		t.Fatalf("acquire+release of an existing key: %v allocs, want 0", n)
	}
}

// With a token mark, a grant compares against the reserved limit and, from
// half a block before it, asks for the next block: neither allocates.
func TestAcquireReleaseUnderATokenMarkDoesNotAllocate(t *testing.T) {
	e := New(Config{Clock: NewFakeClock(), HighWater: &memMark{}, TokenBlock: 4096, Shards: 1})
	if err := e.ReserveTokens(); err != nil {
		t.Fatal(err)
	}
	ns := e.Namespace("t")
	var buf [16]byte
	key := benchKey(&buf, 7)
	for range 2100 { // past half the block: every grant now asks for more
		acquireRelease(t, e, ns, key)
	}
	if n := testing.AllocsPerRun(1000, func() { acquireRelease(t, e, ns, key) }); n != 0 {
		t.Fatalf("acquire+release of an existing key under a token mark: %v allocs, want 0", n)
	}
}

// With tombstones laid (SPEC §6a), an acquire of another request looks
// them up under their lock: still no allocation.
func TestAcquireReleaseBesideTombstonesDoesNotAllocate(t *testing.T) {
	e := New(Config{Clock: NewFakeClock()})
	ns := e.Namespace("t")
	var buf [16]byte
	key := benchKey(&buf, 7)
	e.Abandon(ns, key, benchRequester+1)
	e.Abandon(ns, []byte("other"), benchRequester)
	acquireRelease(t, e, ns, key)
	if n := testing.AllocsPerRun(1000, func() { acquireRelease(t, e, ns, key) }); n != 0 {
		t.Fatalf("acquire+release beside tombstones: %v allocs, want 0", n)
	}
}

// An entry's key buffer serves every later key that fits in the 16-byte
// step of its current length: a 17-byte key leaves room for keys of 17 to
// 32 bytes, each of which leaves the same room.
func TestEntryKeyReusesItsBufferWithinItsStep(t *testing.T) {
	var ent entry
	ent.setKey(make([]byte, 17))
	k20, k32 := []byte("twenty-byte-key-0000"), []byte("thirty-two-byte-key-000000000000")
	if n := testing.AllocsPerRun(100, func() { ent.setKey(k32); ent.setKey(k20) }); n != 0 {
		t.Fatalf("keys of 20 and 32 bytes in a 17-byte key's buffer: %v allocs, want 0", n)
	}
	if string(ent.key()) != string(k20) {
		t.Fatalf("key %q, want %q", ent.key(), k20)
	}
}
