//go:build !race

package cluster

import "testing"

// Gathering a batch, taking it as a proposal and ending it recycles the
// proposal's buffer: in steady state nothing is allocated. (The race
// detector allocates on its own, so this check runs without it.)
func TestProposalBatchDoesNotAllocate(t *testing.T) {
	g := newIdleGroup()
	g.done(g.gather(32, "warm/up"))
	if n := testing.AllocsPerRun(1000, func() { g.done(g.gather(32, "alloc/key")) }); n != 0 {
		t.Fatalf("one proposal batch: %v allocs, want 0", n)
	}
}
