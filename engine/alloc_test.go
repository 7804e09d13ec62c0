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
