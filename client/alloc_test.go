//go:build !race

package client_test

import (
	"context"
	"testing"
)

// The race detector allocates on its own, so this check runs without it
// (`make test` runs the allocation checks in a second, race-free pass).
func TestAcquireReleaseDoesNotAllocate(t *testing.T) {
	for _, real := range []bool{false, true} {
		c := benchClient(t, benchTarget(t, real), 1)
		if err := acquireRelease(c, "alloc"); err != nil {
			t.Fatal(err)
		}
		allocs := testing.AllocsPerRun(200, func() {
			if err := acquireRelease(c, "alloc"); err != nil {
				t.Fatal(err)
			}
		})
		if allocs != 0 {
			t.Fatalf("real server %v: %v allocations per Acquire+Release, want 0", real, allocs)
		}
	}
}

// Calls under a context many of them share allocate nothing either: the
// client watches that context once instead of selecting on it per call.
func TestAcquireReleaseUnderASharedContextDoesNotAllocate(t *testing.T) {
	c := benchClient(t, benchTarget(t, false), 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cycle := func() {
		tk, err := c.Acquire(ctx, "alloc-ctx", benchOpts)
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Release(ctx, tk); err != nil {
			t.Fatal(err)
		}
	}
	for range 8 { // calls enough for the client to watch ctx
		cycle()
	}
	if allocs := testing.AllocsPerRun(200, cycle); allocs != 0 {
		t.Fatalf("%v allocations per Acquire+Release under a shared context, want 0", allocs)
	}
}

// A renewal allocates nothing either, with or without a Lost watch to move.
func TestRenewDoesNotAllocate(t *testing.T) {
	for _, real := range []bool{false, true} {
		c := benchClient(t, benchTarget(t, real), 1)
		tk, err := c.Acquire(context.Background(), "alloc-renew", benchOpts)
		if err != nil {
			t.Fatal(err)
		}
		for _, watched := range []bool{false, true} {
			if watched {
				tk.Lost()
			}
			if err := tk.Renew(context.Background(), benchOpts.Lease); err != nil {
				t.Fatal(err)
			}
			allocs := testing.AllocsPerRun(200, func() {
				if err := tk.Renew(context.Background(), benchOpts.Lease); err != nil {
					t.Fatal(err)
				}
			})
			if allocs != 0 {
				t.Fatalf("real server %v, Lost watched %v: %v allocations per Renew, want 0", real, watched, allocs)
			}
		}
	}
}
