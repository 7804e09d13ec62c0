//go:build !race

package client_test

import "testing"

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
